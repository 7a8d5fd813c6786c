"""The agreement report from the index is the report from the records themselves."""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from rl_export.formats.filters import Filters, parse_filters
from rl_export.index.labelqueries import QueueAsk, QueueFilter, agreement_input, last_results
from rl_export.index.memo import LRU
from rl_export.index.queryindex import CorpusKey, QueryIndex
from rl_export.labeling.agreement import AgreementBuilder, agreement_report
from rl_export.labeling.settings import LabelingSettings
from rl_export.model.codec import dumps_line
from tests.records import record
from tests.unit.index.test_queryindex import queue_counts

DIMENSIONS = ("correctness", "helpfulness", "efficiency", "safety")


def random_record(rng: random.Random, n: int) -> dict[str, Any]:
    value = record(f"t{n:03d}", source=None, reward=None, passed=None,
                   scenario=rng.choice(["refund", "trip"]))  # fmt: skip
    labelers = rng.sample(["ana", "bo", "cy", "dee", "eve"], rng.choice([0, 1, 2, 2, 3, 4]))
    value["human_labels"] = [
        {"labeler": name, "rubric": {d: rng.randint(1, 5) for d in DIMENSIONS},
         "comment": None, "occurred_at": "2026-01-02T00:00:00Z"}
        for name in sorted(labelers)
    ]  # fmt: skip
    value["labelers"] = sorted(labelers)
    value["labels_count"] = len(labelers)
    value["skipped_by"] = sorted(rng.sample(["fay", "gus", "ana"], rng.randint(0, 2)))
    results = [
        {"evaluator": name, "score": round(rng.random(), 3), "passed": rng.random() < 0.6,
         "reasoning": ""}
        for name in rng.sample(["judge", "tone", "policy"], rng.randint(0, 3))
    ]  # fmt: skip
    if results and rng.random() < 0.1:  # an evaluator named twice: the last result counts
        results.append({**results[0], "score": 0.5, "passed": True})
    value["evaluation"] = {
        "evaluation_id": f"ev-{n}",
        "occurred_at": "2026-01-02T00:00:00Z",
        "results": results,
        "report": {"outcomes": [], "classifications": []},
    }
    if rng.random() < 0.05:  # written before records carried labels
        del value["human_labels"]
    return value


def indexed(tmp_path: Path, records: list[dict[str, Any]]) -> tuple[QueryIndex, int]:
    """An index of its own with ``records`` as the traces corpus (close it)."""
    index = QueryIndex(tmp_path / "index", threads=1)
    cid = index.corpus_id(CorpusKey("acme", "bot", "traces"))
    index.ingest(cid, b"".join(dumps_line(r) for r in records), {"t-0": 1})
    return index, cid


@pytest.mark.parametrize(
    "filters", [Filters(), parse_filters({"scenario": "trip"}), parse_filters({"min_labels": "2"})]
)
def test_the_index_gives_the_report_the_records_give(tmp_path: Path, filters: Filters) -> None:
    rng = random.Random(7)
    records = [random_record(rng, n) for n in range(400)]
    index, cid = indexed(tmp_path, records)
    try:
        from_index = agreement_report(agreement_input(index, cid, filters))
    finally:
        index.close()
    builder = AgreementBuilder()
    for value in records:
        if filters.matches(value):
            builder.add(value)
    from_records = agreement_report(builder.build())
    assert from_index.model_dump() == from_records.model_dump()
    assert from_index.multi_labeled > 10
    assert from_index.evaluators


@pytest.mark.parametrize("seed", range(5))
def test_the_last_result_of_an_evaluator_named_twice_is_the_one_kept(seed: int) -> None:
    rng = random.Random(seed)
    rows = []  # (trace, evaluator, place in its results)
    for trace in range(rng.randint(0, 60)):
        named = [rng.randrange(3) for _ in range(rng.randint(0, 5))]
        rows += [(trace, e, place) for place, e in enumerate(named)]
    rng.shuffle(rows)  # DuckDB gives the unnested rows in no promised order
    columns = np.array(rows, np.int64).reshape(-1, 3).T
    keep = last_results(columns[0], columns[1], columns[2], 3)
    want: dict[tuple[int, int], int] = {}
    for trace, e, place in rows:
        want[trace, e] = max(place, want.get((trace, e), -1))
    assert sorted(r for r, k in zip(rows, keep, strict=True) if k) == sorted(
        (t, e, place) for (t, e), place in want.items()
    )


def test_a_report_leaves_no_table_and_no_open_transaction_behind(tmp_path: Path) -> None:
    rng = random.Random(5)
    index, cid = indexed(tmp_path, [random_record(rng, n) for n in range(30)])
    try:
        first = agreement_input(index, cid, Filters())
        index.ingest(cid, dumps_line(random_record(rng, 99)), {"t-0": 2})
        second = agreement_input(index, cid, Filters())  # the same thread: sees the new row
        assert (first.traces, second.traces) == (30, 31)
        left = (
            index.connection()
            .execute("SELECT count(*) FROM duckdb_tables() WHERE temporary")
            .fetchone()
        )
        assert left == (0,)
    finally:
        index.close()


def test_an_empty_corpus_has_an_empty_report(tmp_path: Path) -> None:
    index = QueryIndex(tmp_path / "index", threads=1)
    try:
        cid = index.corpus_id(CorpusKey("acme", "bot", "traces"))
        report = agreement_report(agreement_input(index, cid, Filters()))
    finally:
        index.close()
    assert (report.traces, report.labeled, report.labelers) == (0, 0, 0)
    assert report.dimensions.reward.alpha is None


def test_the_changes_of_a_corpus_count_its_writes_and_nothing_else(tmp_path: Path) -> None:
    # What the agreement route keys its reports by: a report computed after reading the
    # count holds while the count stays.
    rng = random.Random(3)
    index = QueryIndex(tmp_path / "index", threads=1)
    try:
        cid = index.corpus_id(CorpusKey("acme", "bot", "traces"))
        other = index.corpus_id(CorpusKey("acme", "bot", "human"))
        assert index.changes(cid) == 0
        index.ingest(cid, b"".join(dumps_line(random_record(rng, n)) for n in range(20)), {"t": 1})
        seen = index.changes(cid)
        assert seen >= 1
        assert index.changes(other) == 0
        index.ingest(cid, b"", {"t": 2})  # the cursor moved, no row changed
        assert index.changes(cid) == seen
        index.reset(cid)
        assert index.changes(cid) == seen + 1
    finally:
        index.close()


def test_the_memo_keeps_the_most_recently_used() -> None:
    memo: LRU[str, int] = LRU(2)
    memo.put("a", 1)
    memo.put("b", 2)
    assert memo.get("a") == 1  # a is now the most recent
    memo.put("c", 3)
    assert (memo.get("b"), memo.get("a"), memo.get("c"), len(memo)) == (None, 1, 3, 2)


def ask_eight_at_once(
    index: QueryIndex, answer: Callable[[int], int]
) -> tuple[list[Future[int]], list[int]]:
    """Eight threads ask the index's memo for one answer: the first, then seven more while its
    computation (0.2 s, then ``answer(calls so far)``) runs. The futures, and a 1 per call."""
    calls: list[int] = []
    started = threading.Event()

    def compute() -> int:
        calls.append(1)
        started.set()
        time.sleep(0.2)  # the others ask while the first computes
        return answer(len(calls))

    with ThreadPoolExecutor(8) as pool:
        first = pool.submit(index.memo, 1, "totals", compute)
        started.wait(5)
        asked = [first, *(pool.submit(index.memo, 1, "totals", compute) for _ in range(7))]
    return asked, calls


def test_an_answer_asked_by_many_at_once_is_computed_once(tmp_path: Path) -> None:
    index = QueryIndex(tmp_path / "index", threads=1)
    try:
        asked, calls = ask_eight_at_once(index, lambda n: n)
        assert [f.result() for f in asked] == [1] * 8
        assert calls == [1]
        assert index.memo(1, "other", lambda: 2) == 2  # another key is its own
    finally:
        index.close()


def expected_counts(rows: list[dict[str, Any]], ask: QueueAsk) -> tuple[int, int, int, list[str]]:
    """The queue's counts by their definition, over the records themselves (a constant
    target: ``labels_per_trace`` without adjudication)."""
    k = ask.settings.labels_per_trace
    scenario = ask.scope.scenario
    kept = [r for r in rows if scenario is None or r["scenario"] == scenario]
    untouched = [r for r in kept if r["trace_id"] not in ask.touched]
    remaining = sum(
        ask.labeler not in r["labelers"] and ask.labeler not in r["skipped_by"]
        and r["labels_count"] < k
        for r in untouched
    )  # fmt: skip
    short = sum(r["labels_count"] < k for r in untouched)
    labeled = sum(ask.labeler in r["labelers"] for r in untouched)
    return remaining, short, labeled, sorted(r["trace_id"] for r in kept if r not in untouched)


def test_the_queue_counts_kept_between_changes_are_the_counts_of_the_rows(tmp_path: Path) -> None:
    """A claim's counts: the whole scope's scan is kept while the corpus does not change,
    and the touched traces' parts are taken from it; they must be what the rows say for
    any labeler, scope and touched list, before and after the rows change."""
    rng = random.Random(7)
    rows = [random_record(rng, n) for n in range(60)]
    index, cid = indexed(tmp_path, rows)
    try:
        for round_ in range(2):
            for _ in range(40):
                ask = QueueAsk(
                    rng.choice(["ana", "bo", "fay", "zed"]),
                    LabelingSettings(labels_per_trace=rng.choice([1, 2, 3])), 0.7,
                    QueueFilter(scenario=rng.choice([None, "refund", "trip"])),
                    sorted(rng.sample([r["trace_id"] for r in rows], rng.randint(0, 8))),
                )  # fmt: skip
                remaining, short, labeled, touched = queue_counts(index, cid, ask)
                got = (remaining, short, labeled, sorted(t.trace_id for t in touched))
                assert got == expected_counts(rows, ask)
            # The rows change (a later revision of half of them, labeled by ana and bo):
            # the counts kept for the rows before must not be given again.
            for r in rows[:30]:
                r["labelers"] = sorted({*r["labelers"], "ana", "bo"})
                r["labels_count"] = len(r["labelers"])
                r["revision"] += 1
            index.ingest(cid, b"".join(dumps_line(r) for r in rows[:30]), {"t": 2 + round_})
    finally:
        index.close()


def test_those_waiting_for_a_failed_answer_get_its_error_and_the_next_ask_tries_again(
    tmp_path: Path,
) -> None:
    index = QueryIndex(tmp_path / "index", threads=1)

    def fail(_calls: int) -> int:
        raise RuntimeError("the scan failed")

    try:
        asked, calls = ask_eight_at_once(index, fail)
        assert all(isinstance(f.exception(10), RuntimeError) for f in asked)
        assert calls == [1]  # computed once, not once per waiter in turn
        assert index.memo(1, "totals", lambda: 5) == 5  # a failure is not kept
    finally:
        index.close()
