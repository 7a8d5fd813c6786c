"""The query index: ingest, latest revision per trace, and queries that agree with the
Python filters and stats of the export package on random records.

Every test that takes the ``index`` or ``shared`` fixture runs twice: once ingesting corpus
lines (DuckDB parses them; the bodies are copied into local segments) and once through index
sidecars (the objects' columns from Parquet; the bodies fetched from the objects by range),
so an instance started on sidecar-less history and one on sidecars answer alike."""

from __future__ import annotations

import hashlib
import itertools
import math
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rl_export.corpora.commits import SidecarRef
from rl_export.corpora.sidecar import build_sidecar, line_rows, read_sidecar
from rl_export.export.stats import StatsAccumulator
from rl_export.formats.filters import Filters
from rl_export.index.labelqueries import (
    QueueAsk,
    QueueFilter,
    merge_head,
    queue_head,
    queue_totals,
    row_bodies,
    touched_rows,
    trace_labels,
    untouched_counts,
)
from rl_export.index.labelqueries import (
    bodies as bodies_of,
)
from rl_export.index.queryindex import BodiesGone, CorpusKey, QueryIndex
from rl_export.labeling.queue import TraceLabels
from rl_export.labeling.settings import LabelingSettings
from rl_export.model.codec import dumps_line
from rl_export.model.errors import ObjectNotFoundError
from tests.records import record

START = datetime(2026, 1, 1, tzinfo=UTC)


def line(value: dict[str, Any]) -> bytes:
    return dumps_line(value)


def tombstone(trace_id: str, revision: int) -> dict[str, Any]:
    return {"trace_id": trace_id, "org": "acme", "project": "bot", "reward_source": "evaluator",
            "revision": revision, "deleted": True}  # fmt: skip


_OBJECTS = itertools.count()


def through_sidecars(index: QueryIndex) -> QueryIndex:
    """The index, with ``ingest`` going through each object's sidecar as a web instance
    does on sidecars: the lines are stored as an object, its sidecar is built and checked
    as the reader does, and the index reads the columns; bodies come back by range."""
    objects: dict[str, bytes] = {}

    def ingest(corpus_id: int, data: bytes, cursor: dict[str, int]) -> None:
        lines = [piece + b"\n" for piece in data.split(b"\n")[:-1]]
        sha = hashlib.sha256(data).hexdigest()
        key = f"acme/bot/c/data/t-0/{next(_OBJECTS):020d}-{sha[:16]}.jsonl"
        objects[key] = data
        sidecar = build_sidecar(line_rows(lines), [len(x) for x in lines], sha)
        ref = SidecarRef(key="k", sha256=hashlib.sha256(sidecar).hexdigest(),
                         bytes=len(sidecar), rows=len(lines))  # fmt: skip
        table = read_sidecar(sidecar, ref, shard_sha256=sha, records=len(lines),
                             shard_bytes=len(data))  # fmt: skip
        index.ingest_columns(corpus_id, [(key, table)], cursor)

    index.ingest = ingest  # type: ignore[method-assign]
    index.fetch = lambda key, ranges: [objects[key][s : s + n] for s, n in ranges]
    return index


@pytest.fixture(params=["lines", "sidecars"])
def index(tmp_path: Path, request: pytest.FixtureRequest) -> Any:
    made = QueryIndex(tmp_path / "index", threads=1)
    yield made if request.param == "lines" else through_sidecars(made)
    made.close()


def bodies(raw: list[bytes]) -> list[dict[str, Any]]:
    return [orjson.loads(b) for b in raw]


def test_latest_revision_per_trace_and_tombstones_hide_older_ones(index: QueryIndex) -> None:
    cid = index.corpus_id(CorpusKey("acme", "bot", "evaluator"))
    index.ingest(cid, b"".join([line(record("a", revision=2, reward=0.1)),
                       line(record("b", revision=1)),
                       line(record("a", revision=5, reward=0.5)),
                       line(record("a", revision=4, reward=0.4))]), {"s-0": 4})  # fmt: skip
    index.ingest(cid, b"".join([line(record("a", revision=3, reward=0.3)),
                       line(tombstone("b", 1)),
                       line(record("c", revision=1))]), {"s-0": 7})  # fmt: skip
    index.ingest(
        cid, b"".join([line(record("b", revision=1))]), {"s-0": 8}
    )  # older than its tombstone
    got = bodies(index.preview(cid, Filters(), 10))
    assert [(r["trace_id"], r["revision"], r["reward"]) for r in got] == [
        ("a", 5, 0.5),
        ("c", 1, 0.8),
    ]
    assert index.cursor(cid) == {"s-0": 8}
    assert index.live_counts() == {cid: 2}
    assert index.has_trace(cid, "a")
    assert not index.has_trace(cid, "b")
    # The body is the corpus line, byte for byte.
    assert index.preview(cid, Filters(), 1)[0] + b"\n" == line(record("a", revision=5, reward=0.5))


def test_corpora_are_apart_and_the_cursor_survives_a_restart(tmp_path: Path) -> None:
    first = QueryIndex(tmp_path / "i", threads=1)
    human = first.corpus_id(CorpusKey("acme", "bot", "human"))
    traces = first.corpus_id(CorpusKey("acme", "bot", "traces"))
    first.ingest(human, b"".join([line(record("a"))]), {"t-0": 1})
    first.ingest(traces, b"".join([line(record("a")), line(record("b"))]), {"t-0": 2})
    first.close()
    again = QueryIndex(tmp_path / "i", threads=1)
    try:
        assert again.corpus_id(CorpusKey("acme", "bot", "traces")) == traces
        assert again.cursor(human) == {"t-0": 1}
        assert again.live_counts() == {human: 1, traces: 2}
        assert len(again.preview(traces, Filters(), 10)) == 2
    finally:
        again.close()


def test_an_index_whose_segments_are_short_is_rebuilt(tmp_path: Path) -> None:
    first = QueryIndex(tmp_path / "i", threads=1)
    cid = first.corpus_id(CorpusKey("acme", "bot", "human"))
    first.ingest(cid, b"".join([line(record("a")), line(record("b"))]), {"t-0": 2})
    first.close()
    segment = next((tmp_path / "i" / "segments").glob("*.jsonl"))
    segment.write_bytes(segment.read_bytes()[:100])
    again = QueryIndex(tmp_path / "i", threads=1)
    try:
        assert again.live_counts() == {}
        assert again.cursor(again.corpus_id(CorpusKey("acme", "bot", "human"))) is None
    finally:
        again.close()


def traced(
    n: int, *, labels: dict[str, int] | None = None, skipped: tuple[str, ...] = (),
    scenario: str = "refund", scores: tuple[tuple[float, bool], ...] = (), revision: int = 1,
) -> bytes:  # fmt: skip
    """A ``traces`` record completed at minute 50 - n (so t5 is older than t4), labeled by
    ``labels`` (labeler -> the one rating they gave each dimension), evaluated by ``scores``."""
    value = record(f"t{n}", source=None, reward=None, passed=None, scenario=scenario,
                   revision=revision)  # fmt: skip
    value["completed_at"] = f"2026-01-01T00:{50 - n:02d}:00Z"
    labels = labels or {}
    value["labelers"] = sorted(labels)
    value["labels_count"] = len(labels)
    value["human_labels"] = [
        {"labeler": name, "rubric": dict.fromkeys(RUBRIC, rating), "comment": None,
         "occurred_at": "2026-01-02T00:00:00Z"}
        for name, rating in sorted(labels.items())
    ]  # fmt: skip
    value["skipped_by"] = sorted(skipped)
    value["evaluation"] = None if not scores else {
        "evaluation_id": f"ev-{n}", "occurred_at": "2026-01-02T00:00:00Z",
        "results": [{"evaluator": f"j{i}", "score": sc, "passed": ok, "reasoning": ""}
                    for i, (sc, ok) in enumerate(scores)],
        "report": {"outcomes": [], "classifications": []},
    }  # fmt: skip
    return line(value)


ANYWHERE = QueueFilter()


def queue_candidates(index: QueryIndex, cid: int, ask: QueueAsk, limit: int) -> list[TraceLabels]:
    """The first ``limit`` traces of the queue as the web service puts them together from
    the index's pieces (:class:`~rl_export.web.team.LabelerQueue`), the touched ones among
    them whatever the corpora say."""
    touched = set(ask.touched)
    head = queue_head(index, cid, ask, limit + len(touched))
    return [r.labels for r in merge_head(head, touched_rows(index, cid, ask), touched)[:limit]]


def queue_counts(
    index: QueryIndex, cid: int, ask: QueueAsk
) -> tuple[int, int, int, list[TraceLabels]]:
    """``remaining``, ``team_remaining`` and the labeler's own labels over the untouched
    traces, and the touched traces of the scope (for the caller to count)."""
    rows = touched_rows(index, cid, ask)
    return (*untouched_counts(queue_totals(index, cid, ask), rows), [r.labels for r in rows])


def queue_of(
    index: QueryIndex, cid: int, labeler: str, settings: LabelingSettings, *,
    scope: QueueFilter = ANYWHERE, touched: tuple[str, ...] = (), limit: int = 10,
) -> tuple[list[str], int, int]:  # fmt: skip
    """(the head of the queue, remaining, team_remaining) as the index alone says."""
    ask = QueueAsk(labeler, settings, 0.7, scope, touched)
    head = [row.trace_id for row in queue_candidates(index, cid, ask, limit)]
    remaining, short, _, rows = queue_counts(index, cid, ask)
    assert sorted(r.trace_id for r in rows) == sorted(
        t for t in touched if t in {r.trace_id for r in queue_candidates(index,
            cid, QueueAsk("nobody", LabelingSettings(labels_per_trace=10), 0.7, scope), 1000)}
    )  # fmt: skip
    return head, remaining, short


K3 = LabelingSettings(labels_per_trace=3)
K1 = LabelingSettings(labels_per_trace=1)


def test_queue_is_oldest_first_without_what_the_labeler_labeled_or_skipped(
    index: QueryIndex,
) -> None:
    cid = index.corpus_id(CorpusKey("acme", "bot", "traces"))
    index.ingest(cid, b"".join([
        traced(0), traced(1, labels={"ana": 4}), traced(2, skipped=("ana",)),
        traced(3, labels={"bo": 3}), traced(4), traced(5, labels={"ana": 2}, skipped=("bo",)),
    ]), {"t-0": 6})  # fmt: skip
    assert queue_of(index, cid, "ana", K3) == (["t4", "t3", "t0"], 3, 6)
    assert queue_of(index, cid, "ana", K3, limit=2) == (["t4", "t3"], 3, 6)
    assert queue_of(index, cid, "bo", K3) == (["t4", "t2", "t1", "t0"], 4, 6)
    # With a target of one label, the labeled traces are full for everyone.
    assert queue_of(index, cid, "bo", K1) == (["t4", "t2", "t0"], 3, 3)
    # Touched traces come back for the caller to decide, whatever the corpora say.
    assert queue_of(index, cid, "ana", K1, touched=("t1", "t9")) == (["t4", "t1", "t0"], 2, 3)


def test_queue_orders_and_filters(index: QueryIndex) -> None:
    cid = index.corpus_id(CorpusKey("acme", "bot", "traces"))
    index.ingest(cid, b"".join([
        traced(0, scores=((0.9, True),)), traced(1, scores=((0.2, False), (0.9, True))),
        traced(2), traced(3, scores=((0.68, False),), scenario="trip"),
        traced(4, scores=((0.4, False),)),
    ]), {})  # fmt: skip
    order = {name: LabelingSettings(order=name) for name in ("oldest", "newest", "uncertain")}
    assert queue_of(index, cid, "ana", order["oldest"])[0] == ["t4", "t3", "t2", "t1", "t0"]
    assert queue_of(index, cid, "ana", order["newest"])[0] == ["t0", "t1", "t2", "t3", "t4"]
    # Split evaluators first, then nearest to the 0.7 threshold, no evaluation last.
    assert queue_of(index, cid, "ana", order["uncertain"])[0] == ["t1", "t3", "t0", "t4", "t2"]
    passed = QueueFilter(passed=True)
    assert queue_of(index, cid, "ana", K1, scope=passed) == (["t0"], 1, 1)
    assert queue_of(index, cid, "ana", K1, scope=QueueFilter(passed=False))[0] == [
        "t4", "t3", "t1"]  # fmt: skip
    assert queue_of(index, cid, "ana", K1, scope=QueueFilter(scenario="trip"))[0] == ["t3"]
    shuffled = LabelingSettings(order="random")
    ana, bo = queue_of(index, cid, "ana", shuffled)[0], queue_of(index, cid, "bo", shuffled)[0]
    assert sorted(ana) == sorted(bo) == ["t0", "t1", "t2", "t3", "t4"]
    assert queue_of(index, cid, "ana", shuffled)[0] == ana


def test_adjudication_opens_one_more_place_where_labelers_disagree(index: QueryIndex) -> None:
    cid = index.corpus_id(CorpusKey("acme", "bot", "traces"))
    index.ingest(cid, b"".join([
        traced(0, labels={"ana": 5, "bo": 5}),  # agree: full at k = 2
        traced(1, labels={"ana": 5, "bo": 2}),  # 0.6 apart: one more label
        traced(2, labels={"ana": 5, "bo": 2, "cy": 4}),  # got it: full at k + 1
    ]), {})  # fmt: skip
    plain = LabelingSettings(labels_per_trace=2)
    adjudicated = LabelingSettings(labels_per_trace=2, adjudicate_spread=0.5)
    assert queue_of(index, cid, "dee", plain) == ([], 0, 0)
    assert queue_of(index, cid, "dee", adjudicated) == (["t1"], 1, 1)


def test_the_labelers_own_labels_are_counted(index: QueryIndex) -> None:
    cid = index.corpus_id(CorpusKey("acme", "bot", "traces"))
    index.ingest(cid, b"".join([traced(0, labels={"ana": 4}), traced(1, labels={"ana": 2, "bo": 3}),
                                traced(2, labels={"bo": 1}), traced(3)]), {})  # fmt: skip
    ask = QueueAsk("ana", K3, 0.7, ANYWHERE, ("t1",))
    assert queue_counts(index, cid, ask)[2] == 1  # t0; t1 is touched: the caller counts it


def test_trace_labels_and_bodies_in_the_order_asked(index: QueryIndex) -> None:
    cid = index.corpus_id(CorpusKey("acme", "bot", "traces"))
    index.ingest(cid, b"".join([traced(0, labels={"ana": 4, "bo": 2}, skipped=("cy",)),
                                traced(1), line(tombstone("t2", 1))]), {})  # fmt: skip
    found = trace_labels(index, cid, "t0")
    assert found is not None
    assert dict(found.sums) == {"ana": 16, "bo": 8}
    assert found.skipped_by == {"cy"}
    assert trace_labels(index, cid, "t2") is None
    assert [r["trace_id"] for r in bodies(bodies_of(index, cid, ["t1", "t2", "t0"]))] == [
        "t1",
        "t0",
    ]
    # A record written before ``labels``: its labelers' sums are unknown.
    old = orjson.loads(traced(3, labels={"ana": 4}))
    del old["human_labels"]
    index.ingest(cid, line(old), {})
    unknown = trace_labels(index, cid, "t3")
    assert unknown is not None
    assert dict(unknown.sums) == {"ana": None}


# --- the SQL filters and stats agree with the Python ones --------------------------------

DIMENSIONS = ("goal_met", "compliance", "tone")
RUBRIC = ("correctness", "helpfulness", "efficiency", "safety")


@st.composite
def records(draw: st.DrawFn, n: int) -> dict[str, Any]:
    source = draw(st.sampled_from(["evaluator", "human", None]))
    reward = None if source is None else draw(st.sampled_from([0.0, 0.1, 0.25, 0.5, 0.7, 1.0]))
    outcomes = draw(
        st.lists(
            st.fixed_dictionaries(
                {"type": st.sampled_from(DIMENSIONS), "turn": st.just(1),
                 "decision": st.sampled_from([True, False, None])},
                optional={"severity": st.integers(0, 4)},
            ),
            max_size=4,
        )
    )  # fmt: skip
    value = record(
        f"tr-{n}",
        source=source,
        reward=reward,
        passed=None if reward is None else reward >= 0.5,
        scenario=draw(st.sampled_from(["refund", "trip"])),
        agent_version=draw(st.sampled_from(["v3", "v4"])),
        updated_at=(START + timedelta(hours=draw(st.integers(0, 48))))
        .isoformat()
        .replace("+00:00", "Z"),
        labels=draw(st.integers(0, 2)),
        outcomes=outcomes if draw(st.booleans()) else None,
    )
    # Current labels as submitted (ratings near each other, so spreads fall on the filters'
    # bounds), or none of them: a record written before records carried `labels`.
    kind = draw(st.sampled_from(["rated", "legacy", "as made", "versions"]))
    if kind == "legacy":
        del value["human_labels"]
    elif kind == "versions":  # labels of rubric versions (a reward each), an adjudication
        entries = []
        for k in range(draw(st.integers(0, 3))):
            entry: dict[str, Any] = {"labeler": f"l{k}", "comment": None,
                                     "occurred_at": "2026-01-02T00:00:00Z"}  # fmt: skip
            if draw(st.booleans()):
                r = draw(st.lists(st.integers(3, 5), min_size=4, max_size=4))
                entry["rubric"] = dict(zip(RUBRIC, r, strict=True))
            else:
                reward = draw(st.sampled_from([0.6, 0.65, 0.7, 0.75, 0.8, 0.8125, None]))
                entry.update(rubric={"quality": 3}, rubric_version=2, kind="label",
                             answers={"quality": 3}, reward=reward)  # fmt: skip
            entries.append(entry)
        if draw(st.booleans()):
            entries.append({"labeler": "rev", "rubric": {"quality": 1}, "comment": "x",
                            "occurred_at": "2026-01-03T00:00:00Z", "rubric_version": 2,
                            "kind": "adjudication", "answers": {"quality": 1},
                            "reward": 0.1})  # fmt: skip
        value["human_labels"] = entries
        value["labels_count"] = len(entries) - (
            entries[-1:] != [] and entries[-1].get("kind") == "adjudication"
        )
        value["labelers"] = [e["labeler"] for e in entries if e.get("kind") != "adjudication"]
    elif kind == "rated":
        rubrics = draw(st.lists(st.lists(st.integers(3, 5), min_size=4, max_size=4), max_size=3))
        value["human_labels"] = [
            {"labeler": f"l{k}", "rubric": dict(zip(RUBRIC, r, strict=True)), "comment": None,
             "occurred_at": "2026-01-02T00:00:00Z"}
            for k, r in enumerate(rubrics)
        ]  # fmt: skip
        value["labels_count"] = len(rubrics)
        value["labelers"] = [f"l{k}" for k in range(len(rubrics))]
    return value


@st.composite
def corpus(draw: st.DrawFn) -> list[dict[str, Any]]:
    count = draw(st.integers(0, 25))
    return [draw(records(n)) for n in range(count)]


filters_strategy = st.builds(
    Filters,
    passed=st.sampled_from([None, True, False]),
    min_reward=st.sampled_from([None, 0.0, 0.25, 0.5]),
    max_reward=st.sampled_from([None, 0.7, 1.0]),
    pass_dimension=st.lists(st.sampled_from(DIMENSIONS), max_size=2).map(tuple),
    max_severity=st.sampled_from([None, 0, 1, 3]),
    agent_version=st.sampled_from([None, "v4"]),
    scenario=st.sampled_from([None, "trip"]),
    since=st.sampled_from([None, START + timedelta(hours=12)]),
    until=st.sampled_from([None, START + timedelta(hours=36)]),
    labeled=st.sampled_from([None, True, False]),
    min_labels=st.sampled_from([None, 0, 1, 2, 3]),
    max_spread=st.sampled_from([None, 0.0, 0.05, 0.1, 0.2, 0.25]),
    limit=st.sampled_from([None, 3]),
)


_EXAMPLES = itertools.count()


@pytest.fixture(scope="module", params=["lines", "sidecars"])
def shared(tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest) -> Any:
    made = QueryIndex(tmp_path_factory.mktemp("shared"), threads=1)
    yield made if request.param == "lines" else through_sidecars(made)
    made.close()


# 80 examples a way (lines, sidecars): 160 random corpora and filters a run, which keeps
# `make test` inside its 20 minutes.
@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow,
          HealthCheck.function_scoped_fixture])  # fmt: skip
@given(rows=corpus(), filters=filters_strategy)
def test_sql_filters_and_stats_agree_with_the_export_package(
    shared: QueryIndex, rows: list[dict[str, Any]], filters: Filters
) -> None:
    # Each example is a corpus of its own in one index (a DuckDB file per example is slow).
    cid = shared.corpus_id(CorpusKey("acme", "bot", f"c{next(_EXAMPLES)}"))
    shared.ingest(cid, b"".join(line(r) for r in rows), {"s-0": len(rows)})
    expected = [r for r in rows if filters.matches(r)]
    if filters.limit is not None:
        expected = expected[: filters.limit]
    got = bodies(shared.preview(cid, filters, 100))
    assert [r["trace_id"] for r in got] == [r["trace_id"] for r in expected]

    accumulator = StatsAccumulator(10)
    for r in expected:
        accumulator.add(r)
    stats = shared.stats(cid, filters)
    want = accumulator.result()
    assert stats.records == want["records"]
    assert stats.human_labeled == want["human_labeled"]
    assert (stats.passed / stats.judged if stats.judged else None) == want["pass_rate"]
    if want["avg_reward"] is None:
        assert stats.rewarded == 0
    else:
        assert math.isclose(stats.reward_sum / stats.rewarded, want["avg_reward"])
    assert stats.histogram == [b["count"] for b in accumulator.histogram()]


def test_small_and_dead_segments_are_merged_and_bodies_stay_the_same(index: QueryIndex) -> None:
    cid = index.corpus_id(CorpusKey("acme", "bot", "evaluator"))
    other = index.corpus_id(CorpusKey("acme", "bot", "human"))
    for n in range(6):  # six objects: six segments; each supersedes half the last one
        fresh, newer = record(f"t{n}", revision=1), record(f"t{n - 1}", revision=2, reward=n / 10)
        index.ingest(cid, line(fresh) + line(newer), {"s-0": n})
    index.ingest(other, b"".join([line(record("h", revision=1))]), {"s-0": 1})
    before = index.preview(cid, Filters(), 100)
    stats = index.stats(cid, Filters())
    count = len(index.segments.numbers())
    assert index.compact_segments(min_segments=100) == 0  # not enough of them yet
    if index.fetch is not None:  # through sidecars: the bodies are the store's, never copied
        assert count == 0
        assert index.compact_segments(min_segments=3) == 0
        assert index.collect_segments() == []
        with index.db.cursor() as db:  # what no row points into is forgotten
            row = db.execute("SELECT count(*) FROM remote").fetchone()
        assert row is not None
        assert row[0] == 7  # each object still holds a live body
        assert index.preview(cid, Filters(), 100) == before
        return
    assert index.compact_segments(min_segments=3) == 6
    assert index.collect_segments()
    assert len(index.segments.numbers()) < count
    assert index.preview(cid, Filters(), 100) == before
    assert index.stats(cid, Filters()) == stats
    assert len(index.preview(other, Filters(), 10)) == 1


def test_queue_rows_give_their_bodies_before_and_after_a_merge_moved_them(
    index: QueryIndex,
) -> None:
    cid = index.corpus_id(CorpusKey("acme", "bot", "traces"))
    for n in range(6):  # six objects: six small segments
        index.ingest(cid, traced(n, labels={"bo": 3} if n % 2 else None), {"s-0": n})
    ask = QueueAsk("ana", K3, 0.7, ANYWHERE)
    head = queue_head(index, cid, ask, 4)[:4]
    want = bodies_of(index, cid, [row.trace_id for row in head])
    assert [r["trace_id"] for r in bodies(want)] == ["t5", "t4", "t3", "t2"]
    assert row_bodies(index, cid, head) == want  # read where the rows say: no lookup
    if index.fetch is None:  # the lines' own segments: merged, and the old ones removed
        assert index.compact_segments(min_segments=3) == 6
        assert index.collect_segments()
        with pytest.raises(FileNotFoundError):
            index.bodies_at([row.body_at for row in head])
    assert row_bodies(index, cid, head) == want  # the places were stale: looked up again


def test_queue_past_many_labeled_traces_follows_revisions(index: QueryIndex) -> None:
    cid = index.corpus_id(CorpusKey("acme", "bot", "traces"))
    # ana labeled the twelve oldest of twenty.
    index.ingest(cid, b"".join([traced(n, labels={"ana": 4} if n >= 8 else None)
                                for n in range(20)]), {})  # fmt: skip
    assert queue_of(index, cid, "ana", K3, limit=2) == (["t7", "t6"], 8, 20)
    # A later revision without her label (retracted) brings t10 back; deleting t7 drops it.
    index.ingest(cid, b"".join([traced(10, revision=2), line(tombstone("t7", 2))]), {})
    assert queue_of(index, cid, "ana", K3, limit=2) == (["t10", "t6"], 8, 19)
    assert queue_of(index, cid, "bo", K3, limit=1)[1] == 19


def test_a_body_whose_object_expired_asks_for_its_corpus_to_be_read_again(tmp_path: Path) -> None:
    index = through_sidecars(QueryIndex(tmp_path / "index", threads=1))
    try:
        cid = index.corpus_id(CorpusKey("acme", "bot", "traces"))
        index.ingest(cid, line(record("a")), {"s-0": 1})
        assert len(index.preview(cid, Filters(), 10)) == 1
        told: list[int] = []
        index.gone = told.append

        def expired(key: str, ranges: list[tuple[int, int]]) -> list[bytes]:
            raise ObjectNotFoundError(f"{key} not found")

        index.fetch = expired
        with pytest.raises(BodiesGone):
            index.preview(cid, Filters(), 10)
        assert told == [cid]
        assert index.stats(cid, Filters()).records == 1  # the columns still answer
    finally:
        index.close()


def test_a_compactions_parts_taken_without_lookups_end_as_the_lines_do(tmp_path: Path) -> None:
    """The compaction's parts go in without looking anything up (their traces are distinct
    and new to the index); the tail after them replaces and hides as ever."""
    part = [record(f"t{n}", revision=2, labels=n % 3) for n in range(8)]
    tail = [record("t1", revision=3, reward=0.1), tombstone("t2", 2), record("t9", revision=1),
            record("t3", revision=1)]  # fmt: skip
    lines_index = QueryIndex(tmp_path / "lines", threads=1)
    columns_index = through_sidecars(QueryIndex(tmp_path / "columns", threads=1))
    try:
        got = []
        for index in (lines_index, columns_index):
            cid = index.corpus_id(CorpusKey("acme", "bot", "evaluator"))
            data = b"".join(line(r) for r in part)
            if index is columns_index:
                fresh_ingest(index, cid, data)
            else:
                index.ingest(cid, data, {"s-0": 0})
            index.ingest(cid, b"".join(line(r) for r in tail), {"s-0": 4})
            got.append((bodies(index.preview(cid, Filters(), 100)), index.stats(cid, Filters()),
                        queue_of(index, cid, "ana", K3)))  # fmt: skip
        assert got[0] == got[1]
        assert [r["trace_id"] for r in got[0][0]] == ["t0", "t3", "t4", "t5", "t6", "t7", "t1",
                                                      "t9"]  # fmt: skip
    finally:
        lines_index.close()
        columns_index.close()


def fresh_ingest(index: QueryIndex, cid: int, data: bytes) -> None:
    lines = [piece + b"\n" for piece in data.split(b"\n")[:-1]]
    sha = hashlib.sha256(data).hexdigest()
    sidecar = build_sidecar(line_rows(lines), [len(x) for x in lines], sha)
    ref = SidecarRef(key="k", sha256=hashlib.sha256(sidecar).hexdigest(), bytes=len(sidecar),
                     rows=len(lines))  # fmt: skip
    table = read_sidecar(sidecar, ref, shard_sha256=sha, records=len(lines),
                         shard_bytes=len(data))  # fmt: skip
    key = "acme/bot/evaluator/_compacted/00000000000000000001/part-00000.jsonl"
    fetch = index.fetch
    assert fetch is not None
    index.fetch = lambda k, r: [data[s : s + n] for s, n in r] if k == key else fetch(k, r)
    index.ingest_columns(cid, [(key, table)], {"s-0": 0}, fresh=True)


def test_objects_taken_in_one_transaction_keep_the_readers_rule(tmp_path: Path) -> None:
    """Several objects' sidecars in one batch (a catch-up): per trace the greatest revision,
    a tombstone on a tie, else the line read first, across the objects as within one."""
    objects = [
        [
            record("t1", revision=1, reward=0.1),
            record("t2", revision=2),
            record("t4", revision=3, reward=0.8),
        ],
        [record("t1", revision=1, reward=0.9), tombstone("t2", 2), record("t3", revision=1)],
        [record("t3", revision=2, reward=0.3), record("t4", revision=1, reward=0.4)],
    ]
    lines_index = QueryIndex(tmp_path / "lines", threads=1)
    batch_index = QueryIndex(tmp_path / "batch", threads=1)
    try:
        cid = lines_index.corpus_id(CorpusKey("acme", "bot", "evaluator"))
        for n, rows in enumerate(objects):
            lines_index.ingest(cid, b"".join(line(r) for r in rows), {"s-0": n})
        bid = batch_index.corpus_id(CorpusKey("acme", "bot", "evaluator"))
        stored: dict[str, bytes] = {}
        taken = []
        for n, rows in enumerate(objects):
            lines = [line(r) for r in rows]
            data = b"".join(lines)
            sha = hashlib.sha256(data).hexdigest()
            stored[f"o{n}"] = data
            sidecar = build_sidecar(line_rows(lines), [len(x) for x in lines], sha)
            ref = SidecarRef(key="k", sha256=hashlib.sha256(sidecar).hexdigest(),
                             bytes=len(sidecar), rows=len(lines))  # fmt: skip
            table = read_sidecar(sidecar, ref, shard_sha256=sha, records=len(lines),
                                 shard_bytes=len(data))  # fmt: skip
            taken.append((f"o{n}", table))
        batch_index.fetch = lambda key, ranges: [stored[key][s : s + n] for s, n in ranges]
        batch_index.ingest_columns(bid, taken, {"s-0": 3})
        want = bodies(lines_index.preview(cid, Filters(), 10))
        assert bodies(batch_index.preview(bid, Filters(), 10)) == want
        assert [(r["trace_id"], r["revision"], r["reward"]) for r in want] == [
            ("t1", 1, 0.1), ("t4", 3, 0.8), ("t3", 2, 0.3),
        ]  # fmt: skip
        assert batch_index.stats(bid, Filters()) == lines_index.stats(cid, Filters())
        assert batch_index.cursor(bid) == {"s-0": 3}
    finally:
        lines_index.close()
        batch_index.close()


def test_corpora_ingested_side_by_side_end_as_one_after_the_other(
    index: QueryIndex, tmp_path: Path
) -> None:
    """Each corpus's writer runs in a thread of its own, and segment maintenance between
    them: the rows, cursors and bodies are those of ingesting one corpus after the other."""
    import random
    import threading

    def objects(seed: int) -> list[bytes]:
        rng = random.Random(seed)
        out = []
        for _ in range(12):
            rows = [
                record(f"t{rng.randrange(40)}", revision=rng.randrange(1, 6),
                       reward=rng.randrange(11) / 10)
                if rng.random() > 0.1 else tombstone(f"t{rng.randrange(40)}", rng.randrange(1, 6))
                for _ in range(rng.randrange(1, 30))
            ]  # fmt: skip
            out.append(b"".join(line(r) for r in rows))
        return out

    names = ("evaluator", "traces", "human")
    ids = [index.corpus_id(CorpusKey("acme", "bot", n)) for n in names]
    errors: list[BaseException] = []

    def write(cid: int, seed: int) -> None:
        try:
            for n, data in enumerate(objects(seed)):
                index.ingest(cid, data, {"s-0": n + 1})
        except BaseException as exc:  # reported by the test's thread
            errors.append(exc)

    def maintain(stop: threading.Event) -> None:
        while not stop.wait(0.005):  # between the writers' ingests, as often as it can
            index.compact_segments(min_segments=2)
            index.collect_segments()

    stop = threading.Event()
    threads = [threading.Thread(target=write, args=(cid, n)) for n, cid in enumerate(ids)]
    keeper = threading.Thread(target=maintain, args=(stop,))
    for thread in [*threads, keeper]:
        thread.start()
    for thread in threads:
        thread.join(60)
    stop.set()
    keeper.join(60)
    assert not errors
    alone = QueryIndex(tmp_path / "alone", threads=1)
    try:
        for n, name in enumerate(names):
            cid = alone.corpus_id(CorpusKey("acme", "bot", name))
            for m, data in enumerate(objects(n)):
                alone.ingest(cid, data, {"s-0": m + 1})
            assert index.preview(ids[n], Filters(), 100) == alone.preview(cid, Filters(), 100)
            assert index.stats(ids[n], Filters()) == alone.stats(cid, Filters())
            assert index.cursor(ids[n]) == {"s-0": 12}
    finally:
        alone.close()


def test_a_writer_reads_its_cursor_between_ingests(index: QueryIndex) -> None:
    """As the follower does on the corpus's writer thread: a read of the cursor, then the
    next object (DuckDB refuses an Arrow table on a connection with a result left open)."""
    cid = index.corpus_id(CorpusKey("acme", "bot", "traces"))
    for n in range(3):
        index.ingest(cid, line(record(f"t{n}", revision=1)), {"s-0": n + 1})
        assert index.cursor(cid) == {"s-0": n + 1}
        assert index.has_trace(cid, f"t{n}")
    assert index.live_counts() == {cid: 3}


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow,
          HealthCheck.function_scoped_fixture])  # fmt: skip
@given(rows=corpus())
def test_the_index_spread_is_the_filters_spread_to_the_bit(
    shared: QueryIndex, rows: list[dict[str, Any]]
) -> None:
    """Labels of every rubric version and adjudications (which are no label): the index's
    ``spread`` column is :func:`record_spread` exactly, through lines and sidecars alike."""
    from rl_export.formats.filters import record_spread

    cid = shared.corpus_id(CorpusKey("acme", "bot", f"s{next(_EXAMPLES)}"))
    shared.ingest(cid, b"".join(line(r) for r in rows), {"s-0": len(rows)})
    with shared.db.cursor() as db:
        got = dict(db.execute("SELECT trace_id, spread FROM records WHERE corpus_id = ?",
                              [cid]).fetchall())  # fmt: skip
    assert got == {r["trace_id"]: record_spread(r) for r in rows}
