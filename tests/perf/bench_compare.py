"""``make bench-web``'s comparisons part: the comparison queue and claims over 1,000,000 traces
with 100,000 pairs, and the ratings over 100,000 comparisons.

1. An index of its own (:class:`~rl_export.index.queryindex.QueryIndex`) takes ``--traces``
   trajectory records of one project (a few KiB each, as the sink writes them): ``--pairs``
   prompts are shared by two traces of two agent versions (a pair each), every other trace
   has a prompt of its own; a third of the pairs already hold a comparison (both records
   list it, as the join writes them), some evaluated.
2. The pair book's first build (every body read once: the cost of a new instance's first
   comparison request) and a rebuild after one trace changed (the cost after each label or
   comparison: one body).
3. ``--labelers`` labelers claim and compare one pair at a time through the web service's
   own code path (:class:`~rl_export.web.compare.CompareQueue` over the pair book, the claims'
   slot chains in a local store, the overlay's fresh votes), ``--rounds`` claims each: p50
   and p99 of a claim (the queue's head, counts and the slot write) and of a queue preview,
   in process (HTTP and JSON encoding, a millisecond or two in ``GET queue``, are not in it).
   Then the ratings of the book's votes, as ``GET comparisons/ratings`` computes them.
4. :func:`~rl_export.labeling.ratings.ratings_report` over ``--comparisons`` votes on pairs of
   ``--versions`` agent versions (1,000 bootstrap resamples), ``--ratings-rounds`` times.

Numbers are printed and written as JSON to ``var/bench/compare-<time>.json``. Goals (issue 57):
claim and queue p99 under 150 ms; ratings under 2 s.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
from prometheus_client import CollectorRegistry

from rl_export.corpora.store import LocalStore
from rl_export.formats.filters import Filters
from rl_export.index.pairbook import PairBook
from rl_export.index.queryindex import CorpusKey, QueryIndex
from rl_export.labeling.claims import ClaimBook, Claims
from rl_export.labeling.ratings import RatingsInput, ratings_report
from rl_export.labeling.settings import LabelingSettings
from rl_export.model.codec import dumps_line
from rl_export.model.pairs import pair_id
from rl_export.runtime.metrics import WebMetrics
from rl_export.web.compare import CompareQueue
from rl_export.web.labels import label_compared
from rl_export.web.overlay import Overlay
from rl_export.web.team import Team

ORG, PROJECT = "acme", "bench"
CLAIM_GOAL_MS = 150.0
RATINGS_GOAL_S = 2.0
SLICE = 20_000  # records per ingest


def log(message: str) -> None:
    print(f"[bench-compare {time.strftime('%H:%M:%S')}] {message}", flush=True)


def _record(n: int, prompt: int, version: str, rng: random.Random) -> dict[str, Any]:
    trace_id = f"t{n:07d}"
    messages = [
        {"role": "system", "content": "You are a careful support agent."},
        {"role": "user", "content": f"Question {prompt}: where is my order? " * 4},
        {"role": "assistant", "content": f"Answer {n}. " + "Let me look into that. " * 60},
        {"role": "user", "content": "Thanks. " * 20},
        {"role": "assistant", "content": "You are welcome. " * 40},
    ]
    score = round(rng.random(), 3)
    return {
        "trace_id": trace_id, "org": ORG, "project": PROJECT, "reward_source": None,
        "revision": 2, "reward": None, "passed": None, "agent_version": version,
        "scenario": "refund", "messages": messages, "labels_count": 0, "labelers": [],
        "skipped_by": [], "human_labels": [], "comparisons": [],
        "evaluation": {"evaluation_id": f"ev-{n}", "occurred_at": "2026-01-02T00:00:00Z",
                       "results": [{"evaluator": "judge", "score": score, "passed": score > 0.5,
                                    "reasoning": "ok"}],
                       "report": {"outcomes": [], "classifications": []}},
        "completed_at": f"2026-01-01T{n // 3_600_000 % 24:02d}:{n // 60_000 % 60:02d}:"
                        f"{n // 1000 % 60:02d}Z",
        "updated_at": "2026-01-02T00:00:00Z", "pass_threshold": 0.7, "metadata": {},
    }  # fmt: skip


def build_index(folder: Path, traces: int, pairs: int, seed: int) -> tuple[QueryIndex, int]:
    """Step 1."""
    rng = random.Random(seed)
    index = QueryIndex(folder / "index", threads=2)
    cid = index.corpus_id(CorpusKey(ORG, PROJECT, "traces"))
    started = time.monotonic()
    lines: list[bytes] = []
    n = 0
    slices = 0

    def flush() -> None:
        nonlocal slices
        if lines:
            slices += 1
            index.ingest(cid, b"".join(lines), {"bench-0": slices})
            lines.clear()

    paired = 2 * pairs
    while n < traces:
        if n < paired:  # two traces of one prompt and two versions
            a, b = _record(n, n // 2, "v1", rng), _record(n + 1, n // 2, "v2", rng)
            if (n // 2) % 3 == 0:  # compared once already
                pid = pair_id(a["trace_id"], b["trace_id"])
                vote = {"pair_id": pid, "labeler": "old", "strength": None,
                        "occurred_at": "2026-01-02T00:00:00Z"}  # fmt: skip
                mine, theirs = rng.choice([("win", "loss"), ("loss", "win"), ("tie", "tie")])
                a["comparisons"] = [{**vote, "other": b["trace_id"], "outcome": mine}]
                b["comparisons"] = [{**vote, "other": a["trace_id"], "outcome": theirs}]
            lines += [dumps_line(a), dumps_line(b)]
            n += 2
        else:
            lines.append(dumps_line(_record(n, paired + n, rng.choice(["v1", "v2"]), rng)))
            n += 1
        if len(lines) >= SLICE:
            flush()
    flush()
    log(f"indexed {traces:,} traces ({pairs:,} pairs) in {time.monotonic() - started:.1f} s")
    return index, cid


def quantiles(samples: list[float]) -> dict[str, float]:
    ordered = sorted(samples)

    def pick(q: float) -> float:
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))]

    return {"n": len(ordered), "p50_ms": 1000 * pick(0.5), "p99_ms": 1000 * pick(0.99),
            "mean_ms": 1000 * statistics.fmean(ordered)}  # fmt: skip


class _Svc:
    """The parts of the web service's container the comparison queue uses."""

    def __init__(self, index: QueryIndex, store: LocalStore) -> None:
        self.index = index
        self.pairbook = PairBook(index, partners=8)
        self.overlay = Overlay(ttl_s=900)
        self.claim_book = ClaimBook(label_grace_s=900)

        async def broadcast(entry: Any) -> None:
            return None

        self.claims = Claims(store, self.claim_book, broadcast)
        self.metrics = WebMetrics(CollectorRegistry())


async def claims_run(svc: _Svc, cid: int, labelers: int, rounds: int) -> dict[str, Any]:
    """Step 3: each labeler in turn claims a pair and compares it (its vote noted as the
    web service notes it), ``rounds`` times; a preview now and then."""
    settings = LabelingSettings(order="uncertain")
    claim_times: list[float] = []
    queue_times: list[float] = []
    for round_ in range(rounds):
        for n in range(labelers):
            who = f"l{n}"
            team = Team(ORG, PROJECT, settings, {}, time.time())
            started = time.perf_counter()
            queue = await CompareQueue.of(svc, cid, team, who)  # type: ignore[arg-type]
            pairs, entries = await queue.claim(1)
            queue.counts()
            claim_times.append(time.perf_counter() - started)
            if round_ % 5 == 0:
                started = time.perf_counter()
                preview = await CompareQueue.of(svc, cid, team, who)  # type: ignore[arg-type]
                preview.head(10)
                preview.counts()
                queue_times.append(time.perf_counter() - started)
            for pair in pairs:
                await svc.claims.label(ORG, queue.space, pair.pair_id, who, target=1,
                                       labelers=queue.voters(pair.pair_id))  # fmt: skip
                svc.overlay.note(label_compared(
                    ORG, PROJECT, pair.trace_a, pair.trace_b, who, choice="a", strength=None,
                    rubric=None, rubric_version=0, comment=None, now=datetime.now(UTC),
                ))  # fmt: skip
            assert len(entries) == len(pairs)
    return {"claim": quantiles(claim_times), "queue": quantiles(queue_times)}


def ratings_run(comparisons: int, versions: int, rounds: int, seed: int) -> dict[str, Any]:
    """Step 4."""
    rng = np.random.default_rng(seed)
    a = rng.integers(0, versions, comparisons)
    b = (a + rng.integers(1, versions, comparisons)) % versions
    strength = np.linspace(-0.5, 0.5, versions)
    p = 1 / (1 + np.exp(-(strength[a] - strength[b])))
    choice = np.where(rng.random(comparisons) < p, 0, 1)
    choice[rng.random(comparisons) < 0.1] = 2
    names = tuple(f"v{n}" for n in range(versions))
    voters = np.zeros(comparisons, np.int64)
    data = RatingsInput(names, a, b, ("l",), np.arange(comparisons), voters, choice)
    times = []
    for _ in range(rounds):
        started = time.perf_counter()
        ratings_report(data)
        times.append(time.perf_counter() - started)
    return {"comparisons": comparisons, "versions": versions, "runs_s": times,
            "median_s": statistics.median(times), "max_s": max(times)}  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bench_compare", description=__doc__.split("\n")[0])
    parser.add_argument("--traces", type=int, default=1_000_000)
    parser.add_argument("--pairs", type=int, default=100_000)
    parser.add_argument("--labelers", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=25, help="claims per labeler")
    parser.add_argument("--comparisons", type=int, default=100_000)
    parser.add_argument("--versions", type=int, default=8)
    parser.add_argument("--ratings-rounds", type=int, default=5)
    parser.add_argument("--seed", type=int, default=57)
    parser.add_argument("--dir", default="var/bench")
    args = parser.parse_args(argv)
    if args.pairs * 2 > args.traces:
        parser.error("--pairs needs two traces each: at most --traces / 2")
    out_dir = Path(args.dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    result: dict[str, Any] = {"traces": args.traces, "pairs": args.pairs}
    with tempfile.TemporaryDirectory(dir=out_dir) as tmp:
        folder = Path(tmp)
        index, cid = build_index(folder, args.traces, args.pairs, args.seed)
        try:
            svc = _Svc(index, LocalStore(folder / "store"))
            started = time.monotonic()
            facts = svc.pairbook.facts(cid)
            built = svc.pairbook.pairs(cid, LabelingSettings())
            result["pair_book_first_build_s"] = time.monotonic() - started
            result["pairs_found"] = len(built.pairs)
            log(f"pair book: {len(facts):,} traces, {len(built.pairs):,} pairs in "
                f"{result['pair_book_first_build_s']:.1f} s")  # fmt: skip
            changed = {**_record(0, 0, "v1", random.Random(1)), "revision": 3}
            index.ingest(cid, dumps_line(changed), {"bench-0": 10**6})
            started = time.monotonic()
            svc.pairbook.pairs(cid, LabelingSettings())
            result["pair_book_after_one_change_s"] = time.monotonic() - started
            result |= asyncio.run(claims_run(svc, cid, args.labelers, args.rounds))
            started = time.monotonic()  # GET comparisons/ratings' work over the book
            report = ratings_report(svc.pairbook.ratings_input(cid, Filters()))
            result["ratings_from_book_s"] = time.monotonic() - started
            result["ratings_from_book_versions"] = len(report.ratings)
        finally:
            index.close()
    result["ratings"] = ratings_run(args.comparisons, args.versions, args.ratings_rounds,
                                    args.seed)  # fmt: skip
    for name in ("claim", "queue"):
        found = result[name]
        met = "met" if found["p99_ms"] < CLAIM_GOAL_MS else "NOT met"
        print(f"comparison {name:7} p50 {found['p50_ms']:8.1f} ms  p99 {found['p99_ms']:8.1f} ms "
              f" (goal p99 < {CLAIM_GOAL_MS:.0f} ms: {met})")  # fmt: skip
    first, after = result["pair_book_first_build_s"], result["pair_book_after_one_change_s"]
    print(f"pair book          first build {first:.2f} s, after one change {after:.2f} s "
          f"({result['pairs_found']:,} pairs)")  # fmt: skip
    print(
        f"ratings of the book {result['ratings_from_book_s']:.2f} s (its votes, as "
        "GET comparisons/ratings computes them)"
    )
    ratings = result["ratings"]
    met = "met" if ratings["max_s"] < RATINGS_GOAL_S else "NOT met"
    print(f"ratings            {ratings['comparisons']:,} comparisons, {ratings['versions']} "
          f"versions: median {ratings['median_s']:.2f} s, max {ratings['max_s']:.2f} s  (goal < "
          f"{RATINGS_GOAL_S:.0f} s: {met})")  # fmt: skip
    path = out_dir / f"compare-{time.strftime('%Y%m%d-%H%M%S')}.json"
    path.write_text(json.dumps(result, indent=2))
    log(f"written to {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
