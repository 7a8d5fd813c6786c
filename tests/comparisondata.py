"""Traces and comparisons for the comparison tests (unit and integration), and the reference
each is checked against: the rules of DESIGN.md section 12 written out again, from the events
alone (no code of the join or the export)."""

from __future__ import annotations

from typing import Any

from rl_export.model.pairs import outcome, pair_id
from tests.factories import event

# Traces t0..t4 share prompt "q0"; t5 has another prompt.
TRACES = [f"t{n}" for n in range(6)]
PAIRS = [(a, b) for i, a in enumerate(TRACES) for b in TRACES[i + 1 :]]


def prompt_of(trace_id: str) -> str:
    return "q1" if trace_id == "t5" else "q0"


def trace(trace_id: str) -> dict[str, Any]:
    messages = [{"role": "user", "content": prompt_of(trace_id)},
                {"role": "assistant", "content": f"answer of {trace_id}"}]  # fmt: skip
    return event("trace.completed", f"tc-{trace_id}", trace_id=trace_id, messages=messages,
                 agent_version=f"v{int(trace_id[1:]) % 2}")  # fmt: skip


def at(second: int) -> str:
    return f"2026-01-01T00:{second // 60:02d}:{second % 60:02d}Z"


def vote(n: int, a: str, b: str, labeler: str, choice: str | None, second: int,  # noqa: PLR0917
         strength: int | None) -> dict[str, Any]:  # fmt: skip
    if choice is None:
        return event("label.uncompared", f"c-{n}", at(second), trace_id=a, trace_a=a,
                     trace_b=b, labeler=labeler)  # fmt: skip
    more = {} if strength is None else {"strength": strength}
    return event("label.compared", f"c-{n}", at(second), trace_id=a, trace_a=a, trace_b=b,
                 labeler=labeler, choice=choice, **more)  # fmt: skip


def reference(events: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """pair id -> {labeler: (choice, strength)}: the live pairs' current votes."""
    deleted = {e["trace_id"] for e in events if e["event_type"] == "trace.deleted"}
    latest: dict[tuple[str, str, str], dict[str, Any]] = {}
    for e in events:
        if e["event_type"] in ("label.compared", "label.uncompared"):
            key = (e["trace_a"], e["trace_b"], e["labeler"])
            old = latest.get(key)
            if old is None or (e["occurred_at"], e["event_id"]) > (
                old["occurred_at"], old["event_id"]
            ):  # fmt: skip
                latest[key] = e
    pairs: dict[str, dict[str, Any]] = {}
    for (a, b, labeler), e in latest.items():
        if a in deleted or b in deleted or e["event_type"] != "label.compared":
            continue
        pairs.setdefault(pair_id(a, b), {"a": a, "b": b, "votes": {}})["votes"][labeler] = (
            e["choice"], e.get("strength"))  # fmt: skip
    return pairs


def expected_rows(pairs: dict[str, dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    """format -> rows, by pair id, from the reference's pairs (the module docstring's rules
    written out again)."""
    rows: dict[str, list[dict[str, Any]]] = {"preference": [], "reward_pairs": [], "kto": []}
    for _, pair in sorted(pairs.items()):
        choices = [c for c, _ in pair["votes"].values()]
        wins_a, wins_b = choices.count("a"), choices.count("b")
        if wins_a == wins_b or prompt_of(pair["a"]) != prompt_of(pair["b"]):
            continue
        side = "a" if wins_a > wins_b else "b"
        winner, loser = (pair["a"], pair["b"]) if side == "a" else (pair["b"], pair["a"])
        strengths = [s or 1 for c, s in pair["votes"].values() if c == side]
        prompt = [{"role": "user", "content": prompt_of(winner)}]

        def said(t: str) -> list[dict[str, Any]]:
            return [{"role": "assistant", "content": f"answer of {t}"}]

        rows["preference"].append({
            "prompt": prompt, "chosen": said(winner), "rejected": said(loser),
            "score_chosen": max(wins_a, wins_b) / len(choices),
            "score_rejected": min(wins_a, wins_b) / len(choices),
            "trace_chosen": winner, "trace_rejected": loser,
        })  # fmt: skip
        rows["reward_pairs"].append({"prompt": prompt, "chosen": said(winner),
                                     "rejected": said(loser),
                                     "margin": sum(strengths) / len(strengths)})  # fmt: skip
        rows["kto"] += [{"prompt": prompt, "completion": said(winner), "label": True},
                        {"prompt": prompt, "completion": said(loser), "label": False}]  # fmt: skip
    return rows


def trace_entries(pairs: dict[str, dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    """trace -> its record's ``comparisons`` (by pair id, then labeler) from the reference."""
    found: dict[str, list[dict[str, Any]]] = {}
    for pid, pair in pairs.items():
        for labeler, (choice, strength) in pair["votes"].items():
            for me, other in ((pair["a"], pair["b"]), (pair["b"], pair["a"])):
                found.setdefault(me, []).append({
                    "pair_id": pid, "other": other, "outcome": outcome(choice, me == pair["a"]),
                    "labeler": labeler, "strength": strength,
                })  # fmt: skip
    for entries in found.values():
        entries.sort(key=lambda e: (e["pair_id"], e["labeler"]))
    return found
