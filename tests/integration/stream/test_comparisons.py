"""Comparisons end to end (DESIGN.md sections 2 and 12): traces of two agent versions and
comparisons between them published in a shuffled order (comparisons before their traces,
retractions, a deleted trace) to the real broker, joined and sunk by two worker processes
that share the partitions (so a pair's traces sit on different partitions and processes),
into SeaweedFS; then each trace's record, the pair corpus and ``rl-export export --source
comparisons --format preference`` and ``rl-export ratings`` are checked against the
reference of :mod:`tests.comparisondata` and a closed form."""

from __future__ import annotations

import asyncio
import json
import math
import random
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from rl_export.corpora.store import open_store
from rl_export.export import source_ref, write_export
from rl_export.local.broker import LocalKafka
from rl_export.local.seaweed import LocalS3
from rl_export.model.partitioning import partition_for
from tests.comparisondata import (
    PAIRS,
    TRACES,
    expected_rows,
    reference,
    trace,
    trace_entries,
    vote,
)
from tests.exportdata import ORG, PROJECT
from tests.factories import event
from tests.integration.conftest import run_settings, unique
from tests.integration.webproc import wait_for
from tests.integration.workers import WorkerProcess, publish, settings_env


def traffic(seed: int) -> list[dict[str, Any]]:
    """Every trace, 30 comparisons by three labelers (some retracted, some replaced), and
    the deletion of one trace; shuffled, so many a comparison comes before its traces."""
    rng = random.Random(seed)
    events = [trace(t) for t in TRACES]
    for n in range(30):
        a, b = rng.choice(PAIRS)
        choice = rng.choice(["a", "b", "b", "tie", "both_bad", None])
        events.append(vote(n, a, b, rng.choice(["ana", "bo", "cy"]), choice,
                           rng.randint(0, 300), rng.choice([None, 1, 2, 3])))  # fmt: skip
    events.append(event("trace.deleted", "d-t2", "2026-01-01T01:00:00Z", trace_id="t2"))
    rng.shuffle(events)
    return events


def read(settings: Any, source: str) -> list[dict[str, Any]] | None:
    """The latest records of a corpus (None before its first commit)."""

    async def run() -> list[dict[str, Any]] | None:
        store = open_store(settings.store_url)
        try:
            from io import BytesIO

            out = BytesIO()
            await write_export(store, source_ref(ORG, PROJECT, source), format="trajectory",
                               out=out)  # fmt: skip
            return [json.loads(line) for line in out.getvalue().splitlines()]
        except Exception:  # no commit yet
            return None
        finally:
            await store.close()

    return asyncio.run(run())


def test_comparisons_reach_both_traces_the_pair_corpus_and_the_preference_export(
    kafka: LocalKafka, s3: LocalS3, tmp_path: Path
) -> None:
    run = unique("cmp")
    settings = run_settings(kafka, run, tmp_path / "var", f"s3://{s3.bucket}/{run}",
                            shard_max_age_s=1.0)  # fmt: skip
    events = traffic(57)
    pairs = reference(events)
    live = {pid: p for pid, p in pairs.items() if p["votes"]}
    # The traffic puts pairs across partitions (a mirror has somewhere to go).
    parts = {t: partition_for(t.encode(), 4, settings.partitioner) for t in TRACES}
    assert any(parts[p["a"]] != parts[p["b"]] for p in live.values())
    voided = [e for e in events if e["event_type"] == "label.compared" and "t2" in (
        e["trace_a"], e["trace_b"])]  # fmt: skip
    assert voided  # the deletion voids a pair that had votes

    workers = [WorkerProcess(settings, "worker").start() for _ in range(2)]
    try:
        half = len(events) // 2
        asyncio.run(publish(settings, events[:half]))
        asyncio.run(publish(settings, events[half:]))
        entries = trace_entries(live)

        def records_agree() -> bool:
            traces = read(settings, "traces")
            if traces is None or {t["trace_id"] for t in traces} != set(TRACES) - {"t2"}:
                return False
            for record in traces:
                said = [{k: v for k, v in e.items() if k != "occurred_at"}
                        for e in record.get("comparisons") or []]  # fmt: skip
                if said != entries.get(record["trace_id"], []):
                    return False
            return True

        def pairs_agree() -> bool:
            found = read(settings, "comparisons")
            if found is None:
                return False
            votes = {r["pair_id"]: {v["labeler"]: (v["choice"], v["strength"])
                                    for v in r["votes"]} for r in found}  # fmt: skip
            return votes == {pid: p["votes"] for pid, p in live.items()}

        wait_for("every trace's comparisons", records_agree, timeout_s=180)
        wait_for("the pair corpus", pairs_agree, timeout_s=120)
    finally:
        for worker in workers:
            worker.stop()

    argv = [sys.executable, "-m", "rl_export.cli", "export", "--store", settings.store_url,
            "--org", ORG, "--project", PROJECT, "--source", "comparisons", "--format",
            "preference", "--redact", "none", "-o", str(tmp_path / "pairs.jsonl")]  # fmt: skip
    done = subprocess.run(argv, capture_output=True, timeout=120, env=settings_env(settings),
                          check=False)  # fmt: skip
    assert done.returncode == 0, done.stderr
    rows = [json.loads(line) for line in (tmp_path / "pairs.jsonl").read_text().splitlines()]
    assert rows == expected_rows(pairs)["preference"]
    assert rows  # the seed gives pairs with a winner
    bad = subprocess.run([*argv[:-2], "--format", "messages", "-o", "-"], capture_output=True,
                         timeout=120, env=settings_env(settings), check=False)  # fmt: skip
    assert bad.returncode == 2
    assert b"Traceback" not in bad.stderr

    ratings = subprocess.run(
        [sys.executable, "-m", "rl_export.cli", "ratings", "--store", settings.store_url,
         "--org", ORG, "--project", PROJECT],
        capture_output=True, timeout=120, env=settings_env(settings), check=False,
    )  # fmt: skip
    assert ratings.returncode == 0, ratings.stderr
    check_ratings(json.loads(ratings.stdout), live)


def version_of(trace_id: str) -> str:
    return trace(trace_id)["agent_version"]


def check_ratings(report: dict[str, Any], live: dict[str, dict[str, Any]]) -> None:
    """The ratings of the votes the corpora hold, against the closed form of two versions:
    Bradley-Terry's maximum puts the odds of v0 over v1 at the ratio of their wins (ties and
    both_bad half a win each), so on the Elo scale (mean 1000) v0 is 1000 + 200 log10 of it.
    Agreement: over pairs of two or more labelers, the share of each pair's labeler pairs
    that chose alike, averaged."""
    wins = {"v0": 0.0, "v1": 0.0}
    counted = 0
    shares: list[float] = []
    for pair in live.values():
        choices = [c for c, _ in pair["votes"].values()]
        if len(choices) >= 2:
            alike = [a == b for i, a in enumerate(choices) for b in choices[i + 1 :]]
            shares.append(sum(alike) / len(alike))
        va, vb = version_of(pair["a"]), version_of(pair["b"])
        if va == vb:
            continue  # no information about the versions
        for choice in choices:
            counted += 1
            if choice in ("tie", "both_bad"):
                wins[va] += 0.5
                wins[vb] += 0.5
            else:
                wins[va if choice == "a" else vb] += 1.0
    assert counted  # the seed gives votes between the versions
    assert wins["v0"] > 0  # and a maximum
    assert wins["v1"] > 0
    by_version = {r["agent_version"]: r for r in report["ratings"]}
    expected = 1000 + 200 * math.log10(wins["v0"] / wins["v1"])
    assert by_version["v0"]["rating"] == pytest.approx(expected, abs=0.01)
    assert by_version["v1"]["rating"] == pytest.approx(2000 - expected, abs=0.01)
    for rating in by_version.values():
        assert rating["comparisons"] == counted
        low, high = rating["ci95"]
        assert low <= rating["rating"] <= high
    assert report["agreement"]["pairs"] == len(shares)
    if shares:
        assert report["agreement"]["percent"] == pytest.approx(sum(shares) / len(shares))
