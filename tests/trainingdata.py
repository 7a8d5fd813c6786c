"""Traffic for the training-set tests (splits, dedup, metadata): evaluated traces with
planted exact and near copies and metadata, and the rows a dedup must keep of them."""

from __future__ import annotations

from typing import Any

from tests.exportdata import ORG, PROJECT
from tests.factories import event


def words(n: int, seed: int) -> str:
    import random

    rng = random.Random(seed)
    return " ".join(rng.choice(["alpha", "beta", "gamma", "delta", "eps", "zeta", "eta", "theta",
                                "iota", "kappa", "lambda", "mu"]) + str(rng.randrange(50))
                    for _ in range(n))  # fmt: skip


def convo(text: str) -> list[dict[str, Any]]:
    return [{"role": "user", "content": "Please help."}, {"role": "assistant", "content": text}]


def kind(i: int) -> str:
    """Trace i of :func:`traffic`: an ``exact`` copy of the trace before it, a ``near`` copy
    (one word in 200 changed), or ``new``."""
    return "exact" if i % 5 == 4 else "near" if i % 7 == 6 else "new"


def traffic(n: int, *, start: int = 0) -> list[dict[str, Any]]:
    """n evaluated traces over three scenarios with metadata, copies as :func:`kind` says."""
    events: list[dict[str, Any]] = []
    text = ""
    for i in range(start, start + n):
        tid = f"tr-{i:04d}"
        if kind(i) == "new" or not text:
            text = words(200, i)
        elif kind(i) == "near":
            edited = text.split(" ")
            edited[100] = f"tweaked{i}"
            text = " ".join(edited)
        common = {"org": ORG, "project": PROJECT, "trace_id": tid}
        events.append(event(
            "trace.completed", f"t-{tid}", "2026-01-01T00:00:00Z", **common,
            scenario=f"s{i % 3}", messages=convo(text),
            metadata={"tier": "gold" if i % 2 else "free", "region": f"r{i % 4}"},
        ))  # fmt: skip
        score = round(0.3 + (i * 37 % 11) / 20, 2)
        events.append(event(
            "evaluation.finished", f"e-{tid}", "2026-01-01T01:00:00Z", **common,
            evaluation_id=f"ev-{tid}",
            results=[{"evaluator": "judge", "score": score, "passed": True, "reasoning": "ok"}],
        ))  # fmt: skip
    return events


def best_of_groups(rows: list[dict[str, Any]], key: Any) -> set[str]:
    """The trace kept of each group of rows with equal ``key(row)``: the highest reward, then
    the smallest trace id (every row here has the same updated_at)."""
    best: dict[Any, dict[str, Any]] = {}
    for row in sorted(rows, key=lambda r: (-r["reward"], r["trace_id"])):
        best.setdefault(key(row), row)
    return {r["trace_id"] for r in best.values()}


def dedup_key(row: dict[str, Any]) -> str:
    """What ``--dedup exact`` compares of a row."""
    from rl_export.export.dedup import dedup_text

    return dedup_text(row["messages"])
