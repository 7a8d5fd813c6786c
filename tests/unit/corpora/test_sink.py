"""The sink's exactly-once chains (DESIGN.md section 5), without a broker.

A :class:`PartitionSink` is fed join snapshots (built by merging real events) at Kafka
offsets and flushed into a :class:`MemoryStore`; the chains it leaves are read back with the
corpus helpers and checked with ``verify``.
"""

from __future__ import annotations

import asyncio
import gc
import gzip
import hashlib
import time
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

import pytest
from aiokafka import TopicPartition
from aiokafka.errors import IllegalStateError
from prometheus_client import CollectorRegistry

from rl_export.corpora.chain import SinkConfig
from rl_export.corpora.commits import (
    Commit,
    chain_keys,
    encode_lines,
    encode_shard,
    follow_chain,
    read_shard,
)
from rl_export.corpora.layout import SCHEMA_VERSION, CorpusRef
from rl_export.corpora.partition import PartitionSink
from rl_export.corpora.sink import Sink, _seek_committed, flushed_early
from rl_export.corpora.store import MemoryStore
from rl_export.corpora.verify import verify
from rl_export.formats.specs import DEFAULT_CORPORA, CorpusSpec
from rl_export.kafka.client import KafkaConnection
from rl_export.model.codec import RawJson, dumps, dumps_line, iter_lines, loads
from rl_export.model.errors import StoreError
from rl_export.model.events import EventRejection, decode_event
from rl_export.model.records import ERASED_REVISION, CorpusSource, render, tombstone
from rl_export.model.snapshots import (
    HEADER_RECORD_AT,
    SnapshotLines,
    decode_snapshot,
    encode_snapshot,
)
from rl_export.runtime.metrics import SinkMetrics
from rl_export.stream.join import JoinConfig, RawEvent, TraceState, current_snapshot, merge
from tests.factories import event, raw

TOPIC = "trajectories"
PARTITION = 3
STREAM = f"{TOPIC}-{PARTITION}"
ORG, PROJECT = "acme", "bot"
HUMAN = CorpusRef(ORG, PROJECT, "human")
EVALUATOR = CorpusRef(ORG, PROJECT, "evaluator")
TRACES = CorpusRef(ORG, PROJECT, "traces")
WRITER = "writer-1"
JOIN = JoinConfig()
NOW_DT = datetime(2026, 6, 1, tzinfo=UTC)

REPEATS = "rl_export_sink_repeats_dropped_total"
CONFLICTS = "rl_export_sink_conflicts_total"

TRACE_CORPORA = [s for s in DEFAULT_CORPORA if s.source != "comparisons"]


# --- builders -------------------------------------------------------------------------------


class Trace:
    """One trace's join state: every method merges one event and returns the new snapshot."""

    def __init__(self, trace_id: str, minute: int = 0) -> None:
        self.trace_id = trace_id
        self.minute = minute
        self.state: TraceState | None = None
        self.count = 0

    def _merge(self, event_type: str, **fields: Any) -> dict[str, Any]:
        self.count += 1
        at = f"2026-01-01T00:{self.minute:02d}:{self.count:02d}Z"
        value = raw(
            event(event_type, f"{self.trace_id}-{self.count}", at, trace_id=self.trace_id, **fields)
        )
        decoded = decode_event(value, max_bytes=1 << 20, now=NOW_DT, future_tolerance_s=86400.0)
        assert not isinstance(decoded, EventRejection), decoded
        result = merge(self.state, decoded, RawEvent(value), now=NOW_DT.timestamp(), config=JOIN)
        self.state = result.state
        snapshot = current_snapshot(result.state, JOIN)
        assert snapshot is not None
        return snapshot

    def completed(self, **fields: Any) -> dict[str, Any]:
        return self._merge("trace.completed", **fields)

    def evaluated(self, passed: bool = True, score: float | None = None) -> dict[str, Any]:
        score = (0.9 if passed else 0.2) if score is None else score
        results = [{"evaluator": "judge", "score": score, "passed": passed, "reasoning": "r"}]
        return self._merge("evaluation.finished", results=results)

    def labelled(self, labeler: str = "ana") -> dict[str, Any]:
        return self._merge("label.submitted", labeler=labeler)

    def retracted(self, labeler: str = "ana") -> dict[str, Any]:
        return self._merge("label.retracted", labeler=labeler)

    def skipped(self, labeler: str = "bob") -> dict[str, Any]:
        return self._merge("label.skipped", labeler=labeler)

    def deleted(self) -> dict[str, Any]:
        return self._merge("trace.deleted")


class RecordingStore(MemoryStore):
    """A MemoryStore that remembers every write, in order."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[tuple[str, str]] = []

    async def put(self, key: str, data: bytes) -> None:
        self.calls.append(("put", key))
        await super().put(key, data)

    async def put_if_absent(self, key: str, data: bytes) -> None:
        self.calls.append(("put_if_absent", key))
        await super().put_if_absent(key, data)


def make_sink(
    store: MemoryStore,
    *,
    specs: Sequence[CorpusSpec] = DEFAULT_CORPORA,
    writer: str = WRITER,
    **config: Any,
) -> tuple[PartitionSink, CollectorRegistry]:
    registry = CollectorRegistry()
    sink = PartitionSink(
        store=store,
        topic=TOPIC,
        partition=PARTITION,
        specs=specs,
        config=SinkConfig(**config),
        metrics=SinkMetrics(registry),
        writer=writer,
    )
    return sink, registry


def rendered(snapshot: dict[str, Any], source: CorpusSource) -> dict[str, Any]:
    """The record a corpus of ``source`` holds for a ready snapshot."""
    record = render(snapshot, source)
    assert record is not None
    return loads(dumps(record))  # as a reader parses it (messages are RawJson in the sink)


def sample(registry: CollectorRegistry, name: str, **labels: str) -> float:
    value = registry.get_sample_value(name, labels)
    return 0.0 if value is None else value


async def feed(
    sink: PartitionSink, items: Sequence[tuple[int, dict[str, Any]]], event_ms: int | None = None
) -> None:
    for offset, snapshot in items:
        value, headers = encode_snapshot(snapshot)
        await sink.handle(offset, value, event_ms, dict(headers).get(HEADER_RECORD_AT))


async def chain(store: MemoryStore, ref: CorpusRef) -> list[tuple[Commit, list[dict[str, Any]]]]:
    """Every commit of the corpus's chain with its (checksum-verified) records."""
    commits = await follow_chain(store, ref, STREAM, 0)
    keys = await chain_keys(store, ref, STREAM)
    assert [c.from_offset for c in commits] == [offset for offset, _ in keys], "off-chain commit"
    return [(c, await read_shard(store, ref, c)) for c in commits]


def ids(rows: list[dict[str, Any]]) -> list[tuple[str, int, bool]]:
    return [(r["trace_id"], r["revision"], bool(r.get("deleted"))) for r in rows]


def spans(links: list[tuple[Commit, list[dict[str, Any]]]]) -> list[tuple[int, int]]:
    return [(c.from_offset, c.last_offset) for c, _ in links]


async def verified(store: MemoryStore) -> None:
    report = await verify(store)
    assert report.ok, report.problems


def pending_since(sink: PartitionSink) -> float:
    assert sink.first_pending_at is not None
    return sink.first_pending_at


def keys_under(store: MemoryStore, ref: CorpusRef) -> list[str]:
    return [k for k in store.objects if k.startswith(ref.root + "/")]


# --- commits --------------------------------------------------------------------------------


async def test_a_flush_writes_the_data_object_then_a_create_only_commit() -> None:
    store = RecordingStore()
    sink, registry = make_sink(store, sidecars=True)
    a, b = Trace("tr-a", minute=1), Trace("tr-b", minute=2)
    snap_a, snap_b = a.completed(), b.completed()
    event_ms = int(time.time() * 1000)
    await feed(sink, [(0, snap_a), (1, snap_b)], event_ms)
    await feed(sink, [(2, snap_b)])  # a repeat: read, but writes nothing
    assert await sink.flush() == 3

    manifest = TRACES.manifest_key(STREAM, 0)
    commit = Commit.model_validate(loads(store.objects[manifest]))
    data_key = TRACES.key(commit.shard)
    assert commit.index is not None  # data, then its index sidecar, then the commit
    sidecar_key = TRACES.key(commit.index.key)
    assert store.calls == [("put", data_key), ("put", sidecar_key), ("put_if_absent", manifest)]
    stored = store.objects[data_key]
    assert commit.topic == TOPIC
    assert commit.partition == PARTITION
    assert commit.from_offset == 0
    assert commit.last_offset == 2  # the last offset read, not the last one written
    assert commit.shard == f"data/{STREAM}/{0:020d}-{commit.sha256[:16]}.jsonl"
    assert data_key == TRACES.data_key(STREAM, 0, commit.sha256, "none")
    assert commit.records == 2
    assert commit.bytes == len(stored)
    assert commit.sha256 == hashlib.sha256(stored).hexdigest()
    assert commit.compression == "none"
    assert commit.min_updated_at == snap_a["updated_at"] < snap_b["updated_at"]
    assert commit.max_updated_at == snap_b["updated_at"]
    assert commit.schema_version == SCHEMA_VERSION
    assert commit.writer == WRITER
    assert datetime.fromisoformat(commit.created_at).tzinfo is not None
    assert list(iter_lines(stored)) == [rendered(snap_a, None), rendered(snap_b, None)]
    assert keys_under(store, HUMAN) == keys_under(store, EVALUATOR) == []
    assert sample(registry, "rl_export_sink_commits_total", corpus="traces") == 1
    assert sample(registry, "rl_export_sink_records_total", corpus="traces") == 2
    assert sample(registry, "rl_export_sink_bytes_total", corpus="traces") == len(stored)
    assert sample(registry, "rl_export_sink_freshness_seconds_count") == 2
    assert sample(registry, REPEATS) == 1

    snap_a2 = a.evaluated()
    await feed(sink, [(3, snap_a2), (4, b.skipped())])
    assert await sink.flush() == 5
    traces = await chain(store, TRACES)
    assert spans(traces) == [(0, 2), (3, 4)]  # next from_offset = previous last_offset + 1
    assert ids(traces[1][1]) == [("tr-a", 2, False), ("tr-b", 2, False)]
    evaluator = await chain(store, EVALUATOR)
    assert spans(evaluator) == [(0, 4)]  # a new chain starts at 0
    assert evaluator[0][1] == [rendered(snap_a2, "evaluator")]
    # Every commit was created create-only, after the data object it names and that object's
    # index sidecar, in that order (other corpora's writes may come between).
    for n, (op, key) in enumerate(store.calls):
        if op == "put_if_absent":
            root = key.split("/_manifest/")[0]
            commit = loads(store.objects[key])
            data = store.calls.index(("put", f"{root}/{commit['shard']}"))
            sidecar = store.calls.index(("put", f"{root}/{commit['index']['key']}"))
            assert data < sidecar < n
    assert [op for op, _ in store.calls].count("put_if_absent") == 3
    await verified(store)


async def test_by_default_the_sink_writes_shards_without_sidecars() -> None:
    # The worker's default (RL_EXPORT_SINK_SIDECARS=false): a Parquet file per shard and
    # commit cost a third of its speed on small events; compaction parts still get theirs.
    store = RecordingStore()
    sink, _ = make_sink(store)
    a = Trace("tr-a", minute=1)
    await feed(sink, [(0, a.completed())], int(time.time() * 1000))
    assert await sink.flush() == 1
    commit = Commit.model_validate(loads(store.objects[TRACES.manifest_key(STREAM, 0)]))
    assert commit.index is None
    assert [op for op, _ in store.calls] == ["put", "put_if_absent"]
    assert not any(key.endswith(".parquet") for key in store.objects)
    await verified(store)


# --- what each corpus holds -----------------------------------------------------------------


async def test_records_go_to_the_corpora_they_are_ready_for() -> None:
    store = MemoryStore()
    sink, _ = make_sink(store)
    t = Trace("tr-1")
    s1, s2 = t.completed(), t.evaluated()
    await feed(sink, [(0, s1), (1, s2)])
    await sink.flush()
    assert keys_under(store, HUMAN) == []
    evaluator = await chain(store, EVALUATOR)
    assert [rows for _, rows in evaluator] == [[rendered(s2, "evaluator")]]
    assert evaluator[0][1][0]["reward_source"] == "evaluator"
    assert evaluator[0][1][0]["reward"] == 0.9
    traces = await chain(store, TRACES)
    assert [rows for _, rows in traces] == [[rendered(s1, None), rendered(s2, None)]]

    s3 = t.labelled()
    await feed(sink, [(2, s3)])
    await sink.flush()
    human = await chain(store, HUMAN)
    assert spans(human) == [(0, 2)]
    (record,) = human[0][1]
    assert record == rendered(s3, "human")
    assert (record["reward_source"], record["revision"], record["labels_count"]) == ("human", 3, 1)
    assert record["reward"] == (4 + 3 + 5 + 4) / 20
    assert ids((await chain(store, EVALUATOR))[1][1]) == [("tr-1", 3, False)]
    assert ids((await chain(store, TRACES))[1][1]) == [("tr-1", 3, False)]
    await verified(store)


async def test_live_snapshots_in_the_record_layout_are_never_parsed_whole(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The default corpora's lines come from the value's own bytes: parsing each snapshot
    whole (its conversation, most of its bytes) once cost the sink half its time."""
    import rl_export.corpora.partition
    import rl_export.model.snapshots

    def parsed_whole(value: bytes) -> dict[str, Any]:
        raise AssertionError("a live snapshot in the record layout was parsed whole")

    monkeypatch.setattr(rl_export.model.snapshots, "decode_snapshot", parsed_whole)
    monkeypatch.setattr(rl_export.corpora.partition, "decode_snapshot", parsed_whole)
    store = MemoryStore()
    sink, _ = make_sink(store)
    t = Trace("tr-1")
    s1, s2, s3 = t.completed(), t.evaluated(), t.labelled()
    await feed(sink, [(0, s1), (1, s2), (2, s3)])
    await sink.flush()
    assert [rows for _, rows in await chain(store, HUMAN)] == [[rendered(s3, "human")]]
    evaluator = [rows for _, rows in await chain(store, EVALUATOR)]
    assert evaluator == [[rendered(s2, "evaluator"), rendered(s3, "evaluator")]]
    traces = [rows for _, rows in await chain(store, TRACES)]
    assert traces == [[rendered(s, None) for s in (s1, s2, s3)]]


async def test_a_trace_that_stops_being_ready_gets_a_tombstone_once() -> None:
    store = MemoryStore()
    sink, registry = make_sink(store)
    t = Trace("tr-1")
    await feed(sink, [(0, t.completed()), (1, t.labelled())])
    await sink.flush()
    assert ids((await chain(store, HUMAN))[0][1]) == [("tr-1", 2, False)]

    gone = t.retracted()  # its only label: no longer ready for human
    await feed(sink, [(2, gone)])
    await sink.flush()
    human = await chain(store, HUMAN)
    assert spans(human) == [(0, 1), (2, 2)]
    assert human[1][1] == [tombstone(gone, "human")]
    assert human[1][1][0]["deleted"] is True
    traces = await chain(store, TRACES)
    assert traces[-1][1] == [rendered(gone, None)]  # traces keeps every snapshot
    assert keys_under(store, EVALUATOR) == []

    # Still not ready: the tombstone already hides it, nothing more is written.
    await feed(sink, [(3, t.skipped())])
    assert [w.spec.name for w in sink.writers.values() if w.pending] == ["traces"]
    await sink.flush()
    assert len(await chain(store, HUMAN)) == 2

    back = t.labelled("carl")  # ready again: the record comes back
    await feed(sink, [(4, back)])
    await sink.flush()
    human = await chain(store, HUMAN)
    assert spans(human) == [(0, 1), (2, 2), (3, 4)]
    assert human[2][1] == [rendered(back, "human")]
    assert sample(registry, REPEATS) == 0
    await verified(store)


async def test_a_deleted_trace_gets_a_tombstone_in_every_corpus_held_or_not() -> None:
    """Where a corpus holds the trace, the tombstone hides it; where it does not, it records
    the deletion, so that an older revision that comes later (a replay, on another chain)
    finds it and does not bring the trace back."""
    store = MemoryStore()
    sink, registry = make_sink(store)
    one, two = Trace("tr-1", minute=1), Trace("tr-2", minute=2)
    await feed(sink, [(0, one.completed()), (1, one.evaluated()), (2, two.completed())])
    await sink.flush()

    gone_one, gone_two = one.deleted(), two.deleted()
    assert gone_one["deleted"] is True
    assert gone_one["revision"] == ERASED_REVISION  # wins over any revision, on any chain
    await feed(sink, [(3, gone_one), (4, gone_two)])
    await sink.flush()
    human = await chain(store, HUMAN)  # never held either trace
    assert [rows for _, rows in human] == [[tombstone(gone_one, "human"),
                                            tombstone(gone_two, "human")]]  # fmt: skip
    evaluator = await chain(store, EVALUATOR)
    assert spans(evaluator) == [(0, 2), (3, 4)]
    assert evaluator[1][1] == [tombstone(gone_one, "evaluator"), tombstone(gone_two, "evaluator")]
    traces = await chain(store, TRACES)
    assert traces[1][1] == [tombstone(gone_one, None), tombstone(gone_two, None)]

    # The same tombstone again is a repeat in every corpus.
    await feed(sink, [(5, gone_one)])
    assert sink.pending_records == 0
    assert sample(registry, REPEATS) == 3
    await verified(store)


async def test_a_filtered_corpus_writes_a_tombstone_when_a_held_trace_stops_matching() -> None:
    store = MemoryStore()
    passing = CorpusSpec(name="passing", source="evaluator", filter={"passed": True})
    ref = CorpusRef(ORG, PROJECT, "passing")
    sink, _ = make_sink(store, specs=[passing])
    one, two = Trace("tr-1", minute=1), Trace("tr-2", minute=2)
    await feed(sink, [(0, one.completed()), (1, two.completed())])
    good = one.evaluated()
    await feed(sink, [(2, good), (3, two.evaluated(passed=False))])
    await sink.flush()
    assert [rows for _, rows in await chain(store, ref)] == [[rendered(good, "evaluator")]]

    failed = one.evaluated(passed=False)  # still ready for evaluator, but filtered out now
    assert render(failed, "evaluator") is not None
    await feed(sink, [(4, failed), (5, two.evaluated(passed=False))])
    await sink.flush()
    links = await chain(store, ref)
    assert spans(links) == [(0, 3), (4, 5)]
    assert links[1][1] == [tombstone(failed, "evaluator")]  # nothing for tr-2: never held
    await verified(store)


# --- repeats and restarts -------------------------------------------------------------------


async def test_a_repeated_snapshot_is_dropped_also_after_a_restart() -> None:
    store = MemoryStore()
    sink, registry = make_sink(store)
    t = Trace("tr-1")
    s1, s2 = t.completed(), t.evaluated()
    await feed(sink, [(0, s1), (1, s2)])
    await sink.flush()
    before = dict(store.objects)

    await feed(sink, [(2, s2)])  # same revision, later offset
    assert sink.pending_records == 0
    assert sample(registry, REPEATS) == 2  # evaluator and traces; human never held it
    await sink.flush()
    assert store.objects == before

    restarted, registry2 = make_sink(store, writer="writer-2")
    await feed(restarted, [(3, s2), (4, s1)])  # the same, then an older revision
    assert restarted.pending_records == 0
    assert sample(registry2, REPEATS) == 4
    await restarted.flush()
    # The human corpus never held the trace, so its chain on this stream was never started:
    # the restarted writer backfilled it from traces (nothing matched: an empty commit over
    # offsets 0..1), once. Nothing else changed.
    added = {k: v for k, v in store.objects.items() if k not in before}
    (commit_key,) = [k for k in added if "/_manifest/" in k]
    assert commit_key.startswith(HUMAN.root)
    commit = loads(added[commit_key])
    assert (commit["from_offset"], commit["last_offset"], commit["records"]) == (0, 1, 0)
    assert commit["backfill"] == {"from": "traces", "records": 0}
    assert {k: v for k, v in store.objects.items() if k not in added} == before
    assert ids([r for _, rows in await chain(store, TRACES) for r in rows]) == [
        ("tr-1", 1, False),
        ("tr-1", 2, False),
    ]
    await verified(store)


async def test_a_restarted_sink_skips_offsets_its_chains_cover() -> None:
    store = MemoryStore()
    sink, _ = make_sink(store)
    traces = [Trace(f"tr-{n}", minute=n) for n in range(6)]
    snaps = [t.completed() for t in traces]
    await feed(sink, list(enumerate(snaps[:3])))
    await sink.flush()
    await feed(sink, [(3, snaps[3]), (4, snaps[4])])  # read, never committed: a crash

    restarted, registry = make_sink(store, writer="writer-2")
    await feed(restarted, list(enumerate(snaps)))  # read again from an older group offset
    writer = restarted.writers[(ORG, PROJECT, "traces")]
    assert [p.offset for p in writer.pending] == [3, 4, 5]
    assert sample(registry, REPEATS) == 0  # covered offsets are skipped, not repeats
    assert await restarted.flush() == 6
    links = await chain(store, TRACES)
    assert spans(links) == [(0, 2), (3, 5)]
    assert links[1][1] == [rendered(s, None) for s in snaps[3:]]
    assert (links[0][0].writer, links[1][0].writer) == (WRITER, "writer-2")
    await verified(store)


# --- the create-only race -------------------------------------------------------------------


async def put_winner(
    store: MemoryStore, last_offset: int, rows: list[dict[str, Any]]
) -> tuple[str, str]:
    """Create the traces commit at offset 0 as another writer would; return its keys."""
    shard = encode_shard(rows, "none")
    data_key = TRACES.data_key(STREAM, 0, shard.sha256, "none")
    await store.put(data_key, shard.data)
    commit = Commit(
        topic=TOPIC,
        partition=PARTITION,
        from_offset=0,
        last_offset=last_offset,
        shard=TRACES.relative(data_key),
        records=shard.records,
        bytes=len(shard.data),
        sha256=shard.sha256,
        compression="none",
        schema_version=SCHEMA_VERSION,
        min_updated_at=shard.min_updated_at,
        max_updated_at=shard.max_updated_at,
        writer="zombie",
        created_at="2026-01-01T00:00:00Z",
    )
    manifest = TRACES.manifest_key(STREAM, 0)
    await store.put_if_absent(manifest, dumps(commit.model_dump(mode="json")))
    return data_key, manifest


async def test_a_writer_that_loses_the_race_commits_only_after_the_winner() -> None:
    store = RecordingStore()
    sink, registry = make_sink(store, sidecars=True)
    t0, t1, t2, t3 = (Trace(f"tr-{n}", minute=n) for n in range(4))
    s0, s1, s2 = t0.completed(), t1.completed(), t2.completed()
    s1b = t1.evaluated()
    s3 = t3.completed()
    await feed(sink, [(0, s0), (1, s1), (2, s2), (3, s1b), (4, s1b), (5, s3)])
    assert sample(registry, REPEATS) == 2  # offset 4 repeats offset 3 (evaluator, traces)

    # Another writer commits offsets 0..2 first, with its own data object.
    data_key, manifest = await put_winner(store, 2, [rendered(s, None) for s in (s0, s1, s2)])
    winner = {k: store.objects[k] for k in (data_key, manifest)}
    store.calls.clear()

    assert await sink.flush() == 6
    assert {k: store.objects[k] for k in winner} == winner  # not overwritten
    assert ("put", data_key) not in store.calls
    assert sample(registry, CONFLICTS) == 1
    links = await chain(store, TRACES)
    assert spans(links) == [(0, 2), (3, 5)]  # from_offset = winner.last_offset + 1
    assert links[0][0].writer == "zombie"
    assert links[1][0].writer == WRITER
    assert links[1][1] == [rendered(s1b, None), rendered(s3, None)]
    assert sample(registry, "rl_export_sink_commits_total", corpus="traces") == 1
    assert sample(registry, "rl_export_sink_records_total", corpus="traces") == 2
    # The evaluator chain had no rival and committed everything it read.
    evaluator = await chain(store, EVALUATOR)
    assert spans(evaluator) == [(0, 5)]
    assert evaluator[0][1] == [rendered(s1b, "evaluator")]
    all_ids = [i for _, rows in links for i in ids(rows)]
    assert len(all_ids) == len(set(all_ids))
    report = await verify(store)
    assert report.ok, report.problems
    assert report.orphans == 2  # the loser's first data object and its sidecar, named by none


async def test_a_winner_that_covers_everything_leaves_nothing_to_commit() -> None:
    store = MemoryStore()
    sink, registry = make_sink(store, specs=[DEFAULT_CORPORA[2]])
    snaps = [Trace(f"tr-{n}", minute=n).completed() for n in range(3)]
    await feed(sink, list(enumerate(snaps)))
    await put_winner(store, 9, [rendered(s, None) for s in snaps])

    await sink.flush()
    assert sample(registry, CONFLICTS) == 1
    assert spans(await chain(store, TRACES)) == [(0, 9)]
    writer = sink.writers[(ORG, PROJECT, "traces")]
    assert writer.pending == []
    assert writer.state is not None
    assert writer.state.head == 10

    later = Trace("tr-9", minute=9).completed()
    await feed(sink, [(9, snaps[0]), (10, later)])
    await sink.flush()
    links = await chain(store, TRACES)
    assert spans(links) == [(0, 9), (10, 10)]
    assert links[1][1] == [rendered(later, None)]
    await verified(store)


# --- gzip -----------------------------------------------------------------------------------


async def test_gzip_shards_decode_verify_and_are_byte_identical_on_retry() -> None:
    snaps = [Trace(f"tr-{n}", minute=n).completed() for n in range(3)]
    stores = [MemoryStore(), MemoryStore()]
    for n, store in enumerate(stores):
        sink, _ = make_sink(store, writer=f"writer-{n}", compression="gzip")
        await feed(sink, list(enumerate(snaps)))
        await sink.flush()
        await verified(store)

    (link,) = await chain(stores[0], TRACES)
    commit, rows = link
    assert commit.compression == "gzip"
    assert commit.shard.endswith(".jsonl.gz")
    stored = stores[0].objects[TRACES.key(commit.shard)]
    assert stored[:2] == b"\x1f\x8b"
    assert stored[4:8] == b"\0\0\0\0"  # mtime=0
    assert commit.sha256 == hashlib.sha256(stored).hexdigest()
    expected = [rendered(s, None) for s in snaps]
    assert list(iter_lines(gzip.decompress(stored))) == expected == rows
    assert encode_shard(expected, "gzip").data == encode_shard(expected, "gzip").data == stored
    # A second writer with the same input writes the same data objects, byte for byte.
    data = [{k: v for k, v in s.objects.items() if "/data/" in k} for s in stores]
    assert data[0] == data[1]
    assert len(data[0]) == 1


# --- bounds ---------------------------------------------------------------------------------


async def test_due_by_record_count() -> None:
    sink, _ = make_sink(MemoryStore(), max_records=3, max_age_s=3600.0)
    snaps = [Trace(f"tr-{n}", minute=n).completed() for n in range(3)]
    assert not sink.due(time.monotonic() + 1e6)  # nothing pending: never due
    await feed(sink, list(enumerate(snaps[:2])))
    assert sink.pending_records == 2
    assert not sink.due(time.monotonic())
    await feed(sink, [(2, snaps[2])])
    assert sink.due(time.monotonic())
    await sink.flush()
    assert sink.pending_records == 0
    assert not sink.due(time.monotonic() + 1e6)


async def test_due_by_bytes() -> None:
    snaps = [Trace(f"tr-{n}", minute=n).completed() for n in range(2)]
    sizes = [len(dumps(rendered(s, None))) + 1 for s in snaps]
    sink, _ = make_sink(MemoryStore(), max_bytes=sum(sizes), max_age_s=3600.0)
    await feed(sink, [(0, snaps[0])])
    assert sink.pending_bytes == sizes[0]
    assert not sink.due(time.monotonic())
    await feed(sink, [(1, snaps[1])])
    assert sink.pending_bytes == sum(sizes)
    assert sink.due(time.monotonic())


async def test_due_by_age() -> None:
    sink, _ = make_sink(MemoryStore(), max_age_s=10.0)
    t = Trace("tr-1")
    s1 = t.completed()
    await feed(sink, [(0, s1)])
    await sink.flush()
    await feed(sink, [(1, s1)])  # a repeat does not start the clock
    assert sink.first_pending_at is None

    before = time.monotonic()
    await feed(sink, [(2, t.skipped())])
    after = time.monotonic()
    started = pending_since(sink)
    assert before <= started <= after
    await feed(sink, [(3, Trace("tr-2").completed())])
    assert pending_since(sink) == started  # the oldest pending record sets the age
    assert not sink.due(started + 9.99)
    assert sink.due(started + 10.0)
    await sink.flush()
    assert sink.first_pending_at is None
    assert not sink.due(started + 100.0)


# --- the sink's whole buffer -----------------------------------------------------------------


class CommittingConsumer:
    """What :meth:`Sink._flush_due` asks of its consumer: the assignment, commits, pauses."""

    def __init__(self, partitions: Sequence[int]) -> None:
        self.tps = {TopicPartition(TOPIC, p) for p in partitions}
        self.commits: list[dict[TopicPartition, int]] = []
        self.paused_tps: set[TopicPartition] = set()

    def assignment(self) -> set[TopicPartition]:
        return self.tps

    def pause(self, *tps: TopicPartition) -> None:
        self.paused_tps |= set(tps)

    def resume(self, *tps: TopicPartition) -> None:
        self.paused_tps -= set(tps)

    def paused(self) -> set[TopicPartition]:
        return set(self.paused_tps)

    async def commit(self, offsets: dict[TopicPartition, Any]) -> None:
        self.commits.append({tp: meta.offset for tp, meta in offsets.items()})


async def buffering_sink(
    store: MemoryStore, traces: dict[int, int], **config: Any
) -> tuple[Sink, CollectorRegistry]:
    """A sink holding ``traces[p]`` completed traces pending on partition ``p`` (offsets
    from 0), whose own bounds are far away."""
    registry = CollectorRegistry()
    sink = Sink(
        kafka=KafkaConnection("127.0.0.1:9"), topic=TOPIC, group="g", store=store,
        metrics=SinkMetrics(registry), config=SinkConfig(**{"max_age_s": 3600.0, **config}),
    )  # fmt: skip
    for p, count in traces.items():
        snaps = [Trace(f"tr-{p}-{n}", minute=n).completed() for n in range(count)]
        await feed(sink._part(p), list(enumerate(snaps)))
    return sink, registry


async def test_the_partitions_holding_most_are_flushed_early_past_the_budget() -> None:
    sink, _ = await buffering_sink(MemoryStore(), {0: 1, 1: 6, 2: 3})
    parts = [sink.parts[p] for p in (0, 1, 2)]
    held = sum(p.pending_bytes for p in parts)
    assert not any(p.due(time.monotonic()) for p in parts)
    now = time.monotonic()
    assert flushed_early(parts, held, now) == []  # at the budget: nothing
    # One byte past it: the largest goes, which leaves 4 of 10 traces' worth, under half.
    assert flushed_early(parts, held - 1, now) == [sink.parts[1]]
    # A budget of 6 traces' worth leaves at most 3: the two largest go.
    six = 6 * parts[0].pending_bytes
    assert flushed_early(parts, six, now) == [sink.parts[1], sink.parts[2]]
    # One the store refused a moment ago is not tried again before an age bound; it counts.
    sink.parts[1].retry_after = now + 1.0
    assert flushed_early(parts, six, now) == [sink.parts[2], sink.parts[0]]
    assert flushed_early([], 0, now) == []


async def test_a_sink_over_its_budget_commits_its_largest_partition_and_its_offset() -> None:
    store = MemoryStore()
    probe, _ = await buffering_sink(MemoryStore(), {0: 1, 1: 6, 2: 3})
    held = sum(p.pending_bytes for p in probe.parts.values())
    sink, registry = await buffering_sink(store, {0: 1, 1: 6, 2: 3}, buffer_bytes=held - 1)
    consumer = CommittingConsumer([0, 1, 2])
    await sink._flush_due(consumer)  # type: ignore[arg-type]
    assert [sink.parts[p].pending_records for p in (0, 2)] == [
        probe.parts[0].pending_records, probe.parts[2].pending_records
    ]  # fmt: skip
    assert sink.parts[1].pending_records == 0
    assert consumer.commits == [{TopicPartition(TOPIC, 1): 6}]
    assert sample(registry, "rl_export_sink_early_flushes_total") == 1
    committed = {
        k.split("/_manifest/")[1].split("/")[0] for k in store.objects if "/_manifest/" in k
    }
    assert committed == {f"{TOPIC}-1"}
    # Within the budget, nothing is committed before its own bounds.
    calm, registry = await buffering_sink(MemoryStore(), {0: 1, 1: 6, 2: 3}, buffer_bytes=held)
    consumer = CommittingConsumer([0, 1, 2])
    await calm._flush_due(consumer)  # type: ignore[arg-type]
    assert consumer.commits == []
    assert sample(registry, "rl_export_sink_early_flushes_total") == 0


class RefusingStore(MemoryStore):
    """A MemoryStore whose writes fail while ``down`` (an outage); records the attempts.

    It fails as the S3 client does: the error it saw stays in a local of a frame its own
    traceback holds (botocore's retry loop keeps the last one), a garbage cycle that holds
    the request's bytes.
    """

    def __init__(self) -> None:
        super().__init__()
        self.down = False
        self.attempts: list[str] = []  # the keys it was asked to write

    def _refuse(self, key: str, data: bytes) -> None:
        self.attempts.append(key)
        if self.down:
            try:
                raise ConnectionResetError("connection reset by peer")
            except ConnectionResetError as exc:
                seen = exc  # a local of this frame, which exc's traceback holds
                raise StoreError(f"put {key} ({len(data)} bytes): simulated outage") from seen

    async def put(self, key: str, data: bytes) -> None:
        self._refuse(key, data)
        await super().put(key, data)

    async def put_if_absent(self, key: str, data: bytes) -> None:
        self._refuse(key, data)
        await super().put_if_absent(key, data)


def age(sink: Sink, seconds: float) -> None:
    """As if ``seconds`` passed for the sink's partitions: their clocks move back. (A real
    wait would have to outlast the rounds before it, whose collections take a while in a
    process holding the whole test suite.)"""
    for part in sink.parts.values():
        if part.first_pending_at is not None:
            part.first_pending_at -= seconds
        part.retry_after -= seconds


def partitions_of(keys: list[str]) -> set[int]:
    """The ``trajectories`` partitions whose shards these store keys are."""
    return {int(k.split(f"{TOPIC}-")[1].split("/")[0]) for k in keys}


async def test_a_sink_over_its_budget_with_the_store_down_pauses_reading_until_it_is_back() -> None:
    """The early flush the budget asks for fails: reading pauses instead of filling the
    buffer for as long as the store is down, the refused flush waits an age bound instead
    of being tried at every poll, and reading resumes once the store takes the commit."""
    probe, _ = await buffering_sink(MemoryStore(), {0: 1, 1: 6, 2: 3})
    held = sum(p.pending_bytes for p in probe.parts.values())
    store = RefusingStore()
    sink, registry = await buffering_sink(
        store, {0: 1, 1: 6, 2: 3}, buffer_bytes=held - 1, max_age_s=60.0
    )
    consumer = CommittingConsumer([0, 1, 2])
    store.down = True
    await sink._flush_due(consumer)  # type: ignore[arg-type]
    assert partitions_of(store.attempts) == {1}  # flushed early, and refused
    assert consumer.paused_tps == consumer.tps
    assert sample(registry, "rl_export_sink_paused") == 1
    assert sample(registry, "rl_export_sink_buffered_bytes") == held
    assert sample(registry, "rl_export_sink_store_errors_total") == 1

    # The next polls, at once: still over, so the next largest are tried, each once;
    # partition 1 waits for its age bound.
    tried = len(store.attempts)
    await sink._flush_due(consumer)  # type: ignore[arg-type]
    assert partitions_of(store.attempts[tried:]) == {0, 2}
    tried = len(store.attempts)
    await sink._flush_due(consumer)  # type: ignore[arg-type]
    assert store.attempts[tried:] == []
    assert consumer.paused_tps == consumer.tps
    assert consumer.commits == []

    store.down = False
    age(sink, 60.0)  # an age bound later: every partition is due
    await sink._flush_due(consumer)  # type: ignore[arg-type]
    assert consumer.paused_tps == set()
    assert sample(registry, "rl_export_sink_paused") == 0
    assert sample(registry, "rl_export_sink_buffered_bytes") == 0
    assert consumer.commits == [{TopicPartition(TOPIC, p): n for p, n in ((0, 1), (1, 6), (2, 3))}]
    await verified(store)


async def test_a_refused_flush_leaves_no_garbage_cycles_holding_its_shards() -> None:
    """A refused request's exception and frames form cycles that hold the shard's bytes.
    The cycle collector, tuned to run once per 50,000 allocations, would not see them for
    as long as a sink waits on a store that is down: the flush collects them itself."""
    store = RefusingStore()
    store.down = True
    sink, registry = await buffering_sink(store, {0: 3}, max_age_s=0.0)  # due at once
    consumer = CommittingConsumer([0])
    gc.collect()
    gc.disable()  # as good as the tuned collector here
    try:
        await sink._flush_due(consumer)  # type: ignore[arg-type]
        await asyncio.sleep(0)  # the loop lets go of the flush's tasks
        left = gc.collect()
    finally:
        gc.enable()
    assert sample(registry, "rl_export_sink_store_errors_total") == 1
    assert left == 0


# --- idle offsets ---------------------------------------------------------------------------


async def test_idle_offset_moves_past_records_that_wrote_nothing() -> None:
    store = MemoryStore()
    sink, registry = make_sink(store)
    t = Trace("tr-1")
    s1 = t.completed()
    await feed(sink, [(0, s1)])
    assert sink.idle_offset() is None  # a record is pending
    offset = await sink.flush()
    assert offset == 1
    sink.committed = offset
    assert sink.idle_offset() is None  # already committed

    await feed(sink, [(1, s1), (2, s1)])  # repeats: nothing pending
    await sink.handle(3, b"not a snapshot", None)
    assert sample(registry, REPEATS) == 2
    assert sample(registry, "rl_export_sink_bad_snapshots_total") == 1
    assert sink.pending_records == 0
    assert sink.idle_offset() == 4
    sink.committed = 4
    assert sink.idle_offset() is None

    await feed(sink, [(4, t.skipped())])
    assert sink.pending_records == 1
    assert sink.idle_offset() is None  # pending: only a flush may move the offset
    assert await sink.flush() == 5
    sink.committed = 5
    assert sink.idle_offset() is None
    await verified(store)


class FlakyListStore(RecordingStore):
    """Fails ``list`` a given number of times (a store outage while reloading a chain)."""

    def __init__(self) -> None:
        super().__init__()
        self.fail_lists = 0

    async def list(self, prefix: str = "", start_after: str = "") -> list[str]:
        if self.fail_lists:
            self.fail_lists -= 1
            raise StoreError("simulated outage")
        return await super().list(prefix, start_after)


async def test_a_store_error_while_reloading_after_a_lost_race_keeps_everything_pending() -> None:
    store = FlakyListStore()
    sink, registry = make_sink(store)
    t0, t1, t2, t3 = (Trace(f"tr-{n}", minute=n) for n in range(4))
    snaps = [t0.completed(), t1.completed(), t2.completed(), t3.completed()]
    await feed(sink, list(enumerate(snaps)))
    await put_winner(store, 1, [rendered(s, None) for s in snaps[:2]])

    store.fail_lists = 1  # the reload after losing fails once
    with pytest.raises(StoreError):
        await sink.flush()
    traces_writer = next(w for w in sink.writers.values() if w.ref == TRACES)
    assert [p.offset for p in traces_writer.pending] == [0, 1, 2, 3]  # nothing let go
    assert sink.idle_offset() is None  # so the group offset cannot move past them

    assert await sink.flush() == 4  # the retry commits what the winner did not cover
    assert spans(await chain(store, TRACES)) == [(0, 1), (2, 3)]
    assert sample(registry, CONFLICTS) >= 1
    report = await verify(store)
    assert report.ok, report.problems


async def test_records_read_after_a_failed_reload_are_checked_against_the_winner() -> None:
    """A record read between a failed reload and the retry must not let the sink commit,
    unchecked, what it read before the winner's commit covered it."""
    store = FlakyListStore()
    sink, registry = make_sink(store, specs=[DEFAULT_CORPORA[2]])
    snaps = [Trace(f"tr-{n}", minute=n).completed() for n in range(5)]
    await feed(sink, list(enumerate(snaps[:4])))
    await put_winner(store, 1, [rendered(s, None) for s in snaps[:2]])

    store.fail_lists = 1  # the reload after losing fails once
    with pytest.raises(StoreError):
        await sink.flush()
    await feed(sink, [(4, snaps[4])])  # reloads the chain, and re-checks what is pending
    assert sink.pending_records == 3
    assert await sink.flush() == 5
    links = await chain(store, TRACES)
    assert spans(links) == [(0, 1), (2, 4)]
    assert links[1][1] == [rendered(s, None) for s in snaps[2:]]
    assert sample(registry, CONFLICTS) == 1
    report = await verify(store)
    assert report.ok, report.problems


async def test_pending_totals_follow_every_writer() -> None:
    store = MemoryStore()
    sink, _ = make_sink(store)
    t0, t1 = Trace("tr-0", minute=0), Trace("tr-1", minute=1)
    await feed(sink, [(0, t0.completed()), (1, t0.evaluated()), (2, t1.completed())])

    def summed() -> tuple[int, int]:
        writers = sink.writers.values()
        return sum(len(w.pending) for w in writers), sum(w.pending_bytes for w in writers)

    def lines() -> int:
        return sum(len(p.line) for w in sink.writers.values() for p in w.pending)

    assert (sink.pending_records, sink.pending_bytes) == summed() == (4, lines())
    await put_winner(store, 0, [rendered(t0.completed(), None)])  # a lost race in traces
    await sink.flush()
    assert (sink.pending_records, sink.pending_bytes) == summed() == (0, 0)


# --- records encoded once per snapshot ------------------------------------------------------


def straightforward(snapshot: dict[str, Any], spec: CorpusSpec) -> bytes | None:
    """The line a corpus holds for a snapshot, rendered as a dict and encoded: None when the
    corpus holds no record for it (not ready, filtered out, deleted)."""
    record = spec.record_for(snapshot)
    return None if record is None or record.get("deleted") else dumps_line(record)


def fast(snapshot: dict[str, Any], spec: CorpusSpec) -> bytes | None:
    lines = SnapshotLines(snapshot)
    if spec.format == "trajectory":  # the sink's own path for trajectory corpora
        return lines.line(spec.source) if spec.holds(lines) else None
    return spec.line(lines)


FILTERED = [
    CorpusSpec(name="passing", source="evaluator", filter={"passed": True}),
    CorpusSpec(name="failing-human", source="human", filter={"passed": False}),
    CorpusSpec(name="by-source", source="human", filter={"reward_source": "human"}),
    CorpusSpec(name="scenario", source=None, filter={"scenario": "happy_path", "rules_version": 1}),
    CorpusSpec(name="never", source=None, filter={"passed": True}),  # traces have no verdict
    CorpusSpec(name="reward", source="evaluator", filter={"reward": 0.9}),
    CorpusSpec(name="min-reward", source="evaluator", filter={"min-reward": 0.5}),
    CorpusSpec(name="labeled", source=None, filter={"labeled": True, "max_severity": 0}),
    CorpusSpec(name="agreed", source=None, filter={"min-labels": 1, "max-spread": 0.1}),
    CorpusSpec(name="sft", source="evaluator", format="messages", filter={"passed": True}),
    CorpusSpec(name="pc", source="human", format="prompt_completion"),
    CorpusSpec(name="kto", source=None, format="kto"),  # traces: no verdict, no kto row
    CorpusSpec(name="kto-evaluator", source="evaluator", format="kto"),
    CorpusSpec(name="executions", source="evaluator", format="executions"),
]


def story() -> list[dict[str, Any]]:
    """Snapshots of one trace through every state a corpus tells apart."""
    odd = [
        {"role": "user", "content": "line\u2028separator, paragraph\u2029separator"},
        {"role": "assistant", "content": "dash \u2014 quotes \u201chi\u201d, nul \u0000 \\"},
    ]
    t, u = Trace('tr-\u2028"q"', minute=1), Trace("tr-2", minute=2)
    return [
        t.completed(messages=odd),  # traces only
        t.evaluated(),
        t.labelled(),  # ready for every source
        t.evaluated(passed=False, score=0.0),
        t.evaluated(passed=True, score=1.0),
        t.retracted(),  # no longer ready for human
        t.deleted(),
        u.completed(),
        u.evaluated(passed=False, score=0.1 + 0.2),
    ]


def as_read(snapshot: dict[str, Any]) -> dict[str, Any]:
    """The snapshot as the sink reads it from the topic (messages as RawJson)."""
    return decode_snapshot(encode_snapshot(snapshot)[0])


def test_lines_are_the_rendered_records_byte_for_byte() -> None:
    snapshots = [as_read(s) for s in story()]
    outcomes = set()
    for snapshot in snapshots:
        for spec in [*TRACE_CORPORA, *FILTERED]:
            expected = straightforward(snapshot, spec)
            assert fast(snapshot, spec) == expected, (spec.name, snapshot["revision"])
            outcomes.add((spec.name, expected is None))
            if expected is None:
                continue
            assert expected.endswith(b"}\n")
            row = loads(expected)
            assert next(iter(row)) == "trace_id"
            if spec.format == "trajectory":
                assert row["reward_source"] == spec.source
            else:
                assert list(row)[1] == "revision"
        for source in (None, "human", "evaluator"):
            assert SnapshotLines(snapshot).tombstone_line(source) == dumps_line(
                tombstone(snapshot, source)
            )
    # Every spec saw records and non-records, so both answers of holds() were compared.
    assert {name for name, none in outcomes if none} >= {"human", "evaluator", "passing"}
    assert {name for name, none in outcomes if not none} >= {s.name for s in TRACE_CORPORA}


@pytest.mark.parametrize(
    "messages",
    [
        b'[{"content":"plain"}]',
        '[{"content":"dash \u2014 and a raw \u2028 line separator"}]'.encode(),
        '[{"content":"a raw \u2029 paragraph separator"}]'.encode(),
        '[{"content":"\u00e2\u20ac no separator, other 0xE2 bytes"}]'.encode(),
    ],
)
def test_raw_messages_are_escaped_as_dumps_escapes_them(messages: bytes) -> None:
    """Messages come from the topic as they were written: whatever bytes they hold, their
    line is the one dumps writes (U+2028 and U+2029 escaped)."""
    snapshot = as_read(Trace("tr-1").completed())
    snapshot["messages"] = RawJson(messages)
    line = SnapshotLines(snapshot).line(None)
    assert line == dumps_line(render(snapshot, None))
    assert "\u2028".encode() not in line
    assert "\u2029".encode() not in line


def test_odd_values_fall_back_to_plain_encoding_with_the_same_bytes() -> None:
    t = Trace("tr-1")
    t.completed()
    base = as_read(t.labelled())
    cases = {
        "a NUL byte of its own": {"scenario": RawJson(b'"\0"')},  # never from the topic
        "messages not RawJson": {"messages": [{"role": "user", "content": "a, b"}]},
        "a reward with commas": {"human": {"reward": [1, 2], "passed": True}},
        "negative zero": {"evaluator": {"reward": -0.0, "passed": False}},
        "an int reward": {"evaluator": {"reward": 1, "passed": True}},
        "tiny and huge": {"human": {"reward": 1e-7, "passed": None}, "evaluator": None},
    }
    for name, change in cases.items():
        snapshot = {**base, **change}
        for source in (None, "human", "evaluator"):
            lines = SnapshotLines(snapshot)
            if lines.ready(source):
                assert lines.line(source) == dumps_line(render(snapshot, source)), name


def test_a_line_for_a_source_a_snapshot_is_not_ready_for_is_refused() -> None:
    t = Trace("tr-1")
    snapshot = as_read(t.completed())
    with pytest.raises(ValueError, match="not ready"):
        SnapshotLines(snapshot).line("human")
    gone = as_read(t.deleted())
    with pytest.raises(ValueError, match="not ready"):
        SnapshotLines(gone).line(None)


async def test_the_sink_writes_the_rendered_records_to_every_corpus() -> None:
    store = MemoryStore()
    specs = [*DEFAULT_CORPORA, *FILTERED]  # a trace's snapshots reach no comparisons corpus
    sink, _ = make_sink(store, specs=specs)
    snapshots = story()
    await feed(sink, list(enumerate(snapshots)))
    await sink.flush()
    for spec in specs:
        ref = CorpusRef(ORG, PROJECT, spec.name)
        stored = b"".join(store.objects[ref.key(c.shard)] for c, _ in await chain(store, ref))
        expected: list[bytes] = []
        held: dict[str, bool | str] = {}
        for snapshot in map(as_read, snapshots):
            line = straightforward(snapshot, spec)
            was = held.get(snapshot["trace_id"])
            if line is not None:
                expected.append(line)
                held[snapshot["trace_id"]] = True
            elif was is True or (snapshot["deleted"] and was != "erased"):
                expected.append(dumps_line(tombstone(snapshot, spec.source)))
                held[snapshot["trace_id"]] = "erased" if snapshot["deleted"] else False
        assert stored == (b"".join(expected) if spec.source != "comparisons" else b""), spec.name
    await verified(store)


def test_encode_lines_matches_encode_shard() -> None:
    rows = [rendered(Trace(f"tr-{n}", minute=n).completed(), None) for n in range(3)]
    rows.insert(1, tombstone({**rows[0], "revision": 2}, None))
    for compression in ("none", "gzip"):
        assert encode_lines(
            [dumps_line(r) for r in rows],
            [r["updated_at"] for r in rows if "updated_at" in r],
            compression,
        ) == encode_shard(rows, compression)


# --- freshness ------------------------------------------------------------------------------


async def test_freshness_is_observed_for_every_committed_record() -> None:
    store = MemoryStore()
    sink, registry = make_sink(store)
    now_ms = int(time.time() * 1000)
    t = Trace("tr-1")
    await feed(sink, [(0, t.completed())], now_ms - 7_000)  # traces
    await feed(sink, [(1, t.evaluated())], now_ms - 40_000)  # evaluator, traces
    await feed(sink, [(2, t.skipped())])  # no event time: not observed
    await sink.flush()
    name = "rl_export_sink_freshness_seconds"
    assert sample(registry, f"{name}_count") == 3
    assert sample(registry, f"{name}_bucket", le="5.0") == 0
    assert sample(registry, f"{name}_bucket", le="10.0") == 1
    assert sample(registry, f"{name}_bucket", le="60.0") == 3
    assert 7 + 40 + 40 <= sample(registry, f"{name}_sum") < 7 + 40 + 40 + 3 * 60


class RevokingConsumer:
    """Like aiokafka's consumer: seeking a partition that is not assigned is an error. The
    partition is revoked while its committed offset is asked for (a rebalance at an await)."""

    def __init__(self, tp: TopicPartition) -> None:
        self.assigned = {tp}
        self.seeks: list[tuple[TopicPartition, int]] = []

    def assignment(self) -> set[TopicPartition]:
        return set(self.assigned)

    async def committed(self, tp: TopicPartition) -> int:
        self.assigned.clear()
        return 7

    def seek(self, tp: TopicPartition, offset: int) -> None:
        if tp not in self.assigned:
            raise IllegalStateError(f"No current assignment for partition {tp}")
        self.seeks.append((tp, offset))


async def test_a_partition_revoked_while_seeking_back_is_left_to_its_next_owner() -> None:
    tp = TopicPartition("trajectories", 3)
    consumer = RevokingConsumer(tp)
    await _seek_committed(consumer, tp)  # type: ignore[arg-type]
    assert consumer.seeks == []


async def test_a_partition_that_only_seeded_has_no_offset_to_commit() -> None:
    # Made on assignment to seed its new chains, before any record: committing "the offset
    # after the last record read" would move the group's offset back to 0 (the soak saw it).
    sink, _ = make_sink(MemoryStore())
    assert await sink.seed_new_chains() == []
    assert sink.idle_offset() is None


# --- quiet chains held back (corpus_max_age_s) ---------------------------------------------

QUIET = CorpusRef(ORG, "quiet", "traces")


def quiet_sink(store: MemoryStore) -> PartitionSink:
    sink, _ = make_sink(store, max_age_s=1.0, quiet_max_age_s=60.0, quiet_records=3)
    return sink


async def test_a_quiet_chain_waits_and_the_safe_offset_stays_at_its_first_line() -> None:
    store = MemoryStore()
    sink = quiet_sink(store)
    busy = [Trace(f"tr-b{n}").completed() for n in range(3)]
    await feed(sink, [(0, busy[0]), (1, Trace("tr-q").completed(project="quiet")),
                      (2, busy[1]), (3, busy[2])])  # fmt: skip
    # The partition's age bound passed: the busy chain (3 lines) commits, the quiet one (1)
    # waits, and the offset safe to commit is the quiet line's.
    assert await sink.flush(everything=False) == 1
    assert [ids(rows) for _, rows in await chain(store, TRACES)] == [
        [("tr-b0", 1, False), ("tr-b1", 1, False), ("tr-b2", 1, False)]
    ]
    assert await chain(store, QUIET) == []
    assert sink.pending_records == 1
    assert sink.first_pending_at is None
    assert sink.held_until is not None
    assert not sink.due(sink.held_until - 1)
    assert sink.due(sink.held_until)
    # Its own bound passed: it commits, and the offset moves past everything read.
    sink.writers[(ORG, "quiet", "traces")].first_pending_at -= 60.0
    assert await sink.flush(everything=False) == 4
    links = await chain(store, QUIET)
    assert (spans(links), [ids(rows) for _, rows in links]) == ([(0, 3)], [[("tr-q", 1, False)]])
    assert sink.held_until is None
    assert sink.pending_records == 0
    await verified(store)


async def test_lines_that_waited_count_in_the_quiet_freshness_histogram() -> None:
    """The freshness objective (and its alert) is for lines that did not wait by design:
    a quiet chain's held lines are observed in a histogram of their own."""
    store = MemoryStore()
    sink, registry = make_sink(store, max_age_s=1.0, quiet_max_age_s=60.0, quiet_records=3)
    await feed(sink, [(0, Trace("tr-b0").completed()), (1, Trace("tr-b1").completed()),
                      (2, Trace("tr-b2").completed()),
                      (3, Trace("tr-q").completed(project="quiet"))], event_ms=1)  # fmt: skip
    await sink.flush(everything=False)  # the busy chain commits, the quiet one waits
    assert sample(registry, "rl_export_sink_freshness_seconds_count") == 3
    sink.writers[(ORG, "quiet", "traces")].first_pending_at -= 60.0
    await sink.flush(everything=False)
    assert sample(registry, "rl_export_sink_quiet_freshness_seconds_count") == 1
    assert sample(registry, "rl_export_sink_freshness_seconds_count") == 3


async def test_more_lines_or_a_deletion_end_the_wait_and_everything_flushes_all() -> None:
    store = MemoryStore()
    sink = quiet_sink(store)
    quiet = [Trace(f"tr-q{n}") for n in range(3)]
    await feed(sink, [(0, quiet[0].completed(project="quiet"))])
    assert await sink.flush(everything=False) == 0  # held
    await feed(sink, [(1, quiet[1].completed(project="quiet")),
                      (2, quiet[2].completed(project="quiet"))])  # fmt: skip
    assert await sink.flush(everything=False) == 3  # three lines: no longer quiet
    assert [len(rows) for _, rows in await chain(store, QUIET)] == [3]
    # A deletion is never held, however few the lines.
    await feed(sink, [(3, quiet[0]._merge("trace.deleted", project="quiet"))])
    assert sink.pending_records == 3  # its tombstone, in every corpus
    assert await sink.flush(everything=False) == 4
    assert sink.pending_records == 0
    assert ids((await chain(store, QUIET))[-1][1]) == [("tr-q0", ERASED_REVISION, True)]
    # A flush of everything (the buffer's budget, a replay) holds nothing back.
    await feed(sink, [(4, Trace("tr-q9").completed(project="quiet"))])
    assert await sink.flush() == 5
    assert sink.pending_records == 0
    await verified(store)


async def test_a_restart_from_the_held_offset_repeats_and_loses_nothing() -> None:
    store = MemoryStore()
    sink = quiet_sink(store)
    busy = [Trace(f"tr-b{n}").completed() for n in range(4)]
    items = [(0, busy[0]), (1, Trace("tr-q").completed(project="quiet")), (2, busy[1]),
             (3, busy[2]), (4, busy[3])]  # fmt: skip
    await feed(sink, items)
    safe = await sink.flush(everything=False)
    assert safe == 1
    # The worker stops with the quiet line pending; the next one reads from the offset
    # committed (1) and commits everything.
    again = quiet_sink(store)
    await feed(again, [item for item in items if item[0] >= safe])
    assert await again.flush() == 5
    assert [ids(rows) for _, rows in await chain(store, TRACES)] == [
        [("tr-b0", 1, False), ("tr-b1", 1, False), ("tr-b2", 1, False), ("tr-b3", 1, False)]
    ]
    assert [ids(rows) for _, rows in await chain(store, QUIET)] == [[("tr-q", 1, False)]]
    await verified(store)
