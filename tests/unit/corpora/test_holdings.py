"""What a corpus holds spans all its chains: a replay and the stream never repeat each other.

A replay writes chains of its own (``replay-<run id>-<p>``) beside the stream's
(``trajectories-<p>``), partitioned the same way. Every writer of partition ``p`` loads what
the corpus holds from the latest compaction (its holdings index and tombstones) and every
chain of ``p``, so a backfill over streamed events, or a stream over replayed ones, writes
no ``(trace_id, revision)`` twice; and a deletion, even once compaction has left it out of
the parts, keeps hiding older revisions that arrive on another chain.
"""

from __future__ import annotations

import io
from typing import Any

import orjson
from prometheus_client import CollectorRegistry

from rl_export.corpora.chain import SinkConfig
from rl_export.corpora.chainstate import load_chain_state
from rl_export.corpora.commits import read_chain
from rl_export.corpora.compacted import latest_compaction
from rl_export.corpora.compaction import compact
from rl_export.corpora.layout import CorpusRef
from rl_export.corpora.partition import PartitionSink
from rl_export.corpora.reader import CorpusReader
from rl_export.corpora.store import MemoryStore
from rl_export.corpora.verify import verify
from rl_export.export import write_export
from rl_export.formats.specs import DEFAULT_CORPORA
from rl_export.model.partitioning import partition_for
from rl_export.runtime.metrics import SinkMetrics
from tests.unit.corpora.test_sink import REPEATS, Trace, feed, sample

PARTITIONS = 8
PARTITION = 5
TRACES = CorpusRef("acme", "bot", "traces")
HUMAN = CorpusRef("acme", "bot", "human")


def ids_in(partition: int, count: int, prefix: str = "tr") -> list[str]:
    out, n = [], 0
    while len(out) < count:
        candidate = f"{prefix}-{n}"
        if partition_for(candidate.encode(), PARTITIONS) == partition:
            out.append(candidate)
        n += 1
    return out


def sink(store: MemoryStore, topic: str) -> tuple[PartitionSink, CollectorRegistry]:
    registry = CollectorRegistry()
    return PartitionSink(
        store=store, topic=topic, partition=PARTITION, specs=DEFAULT_CORPORA,
        config=SinkConfig(partitions=PARTITIONS), metrics=SinkMetrics(registry),
        writer=f"writer-{topic}",
    ), registry  # fmt: skip


def history(trace_ids: list[str], traces: list[Trace] | None = None) -> list[dict[str, Any]]:
    """Snapshots of a few traces: completed, evaluated, labelled (three revisions each)."""
    out = []
    for trace_id in trace_ids:
        trace = Trace(trace_id)
        out += [trace.completed(), trace.evaluated(), trace.labelled()]
        if traces is not None:
            traces.append(trace)
    return out


async def write(store: MemoryStore, topic: str, snapshots: list[dict[str, Any]]) -> float:
    part, registry = sink(store, topic)
    await feed(part, list(enumerate(snapshots)))
    if part.pending_records:
        await part.flush()
    return sample(registry, REPEATS)


async def latest(store: MemoryStore, ref: CorpusRef) -> dict[str, int]:
    reader = CorpusReader(store, ref)
    return {r["trace_id"]: r["revision"] async for r in reader.records(latest_only=True)}


async def test_a_replay_over_streamed_events_writes_nothing_the_stream_wrote() -> None:
    store = MemoryStore()
    snapshots = history(ids_in(PARTITION, 4))
    await write(store, "trajectories", snapshots)
    before = dict(store.objects)
    repeats = await write(store, "replay-backfill-1", snapshots)
    assert repeats > 0
    assert store.objects == before  # every record was already held: no commit at all
    report = await verify(store)
    assert report.ok, report.problems
    assert await latest(store, TRACES) == {s["trace_id"]: 3 for s in snapshots}


async def test_a_stream_over_replayed_events_writes_nothing_the_replay_wrote() -> None:
    store = MemoryStore()
    snapshots = history(ids_in(PARTITION, 4))
    await write(store, "replay-backfill-1", snapshots[:6])  # the first two traces
    await write(store, "trajectories", snapshots)  # the stream has them all
    report = await verify(store)
    assert report.ok, report.problems  # no (trace_id, revision) in both chains
    assert await latest(store, TRACES) == {s["trace_id"]: 3 for s in snapshots}
    on_stream = {
        r["trace_id"] for _, rows in await read_chain(store, TRACES, "trajectories-5", 0)
        for r in rows
    }  # fmt: skip
    assert on_stream == {s["trace_id"] for s in snapshots[6:]}


async def test_a_deletion_hides_older_revisions_on_another_chain_after_compaction() -> None:
    store = MemoryStore()
    [kept, gone] = ids_in(PARTITION, 2)
    old, doomed = Trace(gone), Trace(kept)
    older = [old.completed(), old.labelled()]
    await write(store, "trajectories", [*older, old.deleted(), doomed.completed()])
    compaction = await compact(store, TRACES, writer="c", partitioning=("murmur2", PARTITIONS))
    assert compaction is not None
    assert compaction.tombstones is not None  # the parts leave the deletion out; this keeps it
    assert compaction.records == 1

    await write(store, "replay-late-1", older)  # an old export, replayed
    assert gone not in await latest(store, TRACES)
    assert gone not in await latest(store, HUMAN)
    report = await verify(store)
    assert report.ok, report.problems


async def test_past_the_tombstones_retention_the_erasure_log_keeps_the_trace_deleted() -> None:
    """The case above with the tombstone past its retention: the erasure log (kept for good)
    still refuses the older revision; without it, it would come back."""
    store = MemoryStore()
    [gone] = ids_in(PARTITION, 1)
    old = Trace(gone)
    older = [old.completed(), old.labelled()]
    await write(store, "trajectories", [*older, old.deleted()])
    compaction = await compact(
        store, TRACES, writer="c", partitioning=("murmur2", PARTITIONS), tombstone_retention_s=0
    )
    assert compaction is not None
    assert compaction.tombstones is None
    await write(store, "replay-late-1", older)
    assert gone not in await latest(store, TRACES)
    # What the log protects against: the same without it.
    for key in [k for k in store.objects if k.startswith("_erasures/")]:
        del store.objects[key]
    await write(store, "replay-late-2", older)
    assert gone in await latest(store, TRACES)  # the join would accept it again too


async def test_a_record_written_by_a_writer_that_did_not_know_is_left_out_then_dropped() -> None:
    """A replay that began before a deletion (its writers loaded what the corpus held then)
    writes a newer revision of the deleted trace after the compaction dropped its tombstone:
    exports leave it out (the erasure log), and the next compaction drops it."""
    store = MemoryStore()
    gone, kept = ids_in(PARTITION, 2)
    old, other = Trace(gone), Trace(kept)
    await write(store, "trajectories", [old.completed(), other.completed()])
    early, _ = sink(store, "replay-early")
    await feed(early, [(0, other.evaluated())])  # its writers load the corpus now
    await write(store, "stream-2", [old.deleted()])  # another run's chain deletes it
    await compact(store, TRACES, writer="c", tombstone_retention_s=0.001)
    late = Trace(gone)  # the replay's own join: it never saw the deletion
    await feed(early, [(1, late.completed()), (2, late.evaluated())])
    await early.flush()
    assert gone in await latest(store, TRACES)  # on its chain, newer than anything held

    async def exported() -> set[str]:
        out = io.BytesIO()
        await write_export(store, TRACES, format="trajectory", out=out, redact="none")
        return {orjson.loads(line)["trace_id"] for line in out.getvalue().splitlines()}

    assert await exported() == {kept}
    made = await compact(store, TRACES, writer="c")
    assert made is not None
    assert made.records == 1
    assert await exported() == {kept}


async def test_the_holdings_index_gives_what_reading_the_parts_gives() -> None:
    store = MemoryStore()
    for partition in range(PARTITIONS):
        traces = ids_in(partition, 3, prefix=f"p{partition}")
        part = PartitionSink(
            store=store, topic="trajectories", partition=partition, specs=DEFAULT_CORPORA,
            config=SinkConfig(partitions=PARTITIONS), metrics=SinkMetrics(CollectorRegistry()),
            writer="w",
        )  # fmt: skip
        made_traces: list[Trace] = []
        snapshots = history(traces, made_traces)
        snapshots.append(made_traces[0].deleted())  # one tombstone each
        await feed(part, list(enumerate(snapshots)))
        await part.flush()
    made = await compact(store, TRACES, writer="c", partitioning=("murmur2", PARTITIONS))
    assert made is not None
    assert made.holdings is not None
    assert len(made.holdings["parts"]) == PARTITIONS
    for partition in range(PARTITIONS):
        stream = f"trajectories-{partition}"

        def belongs(trace_id: str, p: int = partition) -> bool:
            return partition_for(trace_id.encode(), PARTITIONS) == p

        indexed = await load_chain_state(
            store, TRACES, stream, belongs, partitioning=("murmur2", PARTITIONS)
        )
        read = await load_chain_state(store, TRACES, stream, belongs, partitioning=None)
        assert indexed.held == read.held
        assert indexed.head == read.head
        assert sum(code & 1 for code in indexed.held.values()) == 1  # the tombstone
    report = await verify(store)
    assert report.ok, report.problems
    assert report.orphans == 0  # the index and tombstones are named by the compaction

    # A missing index part is a problem for verify.
    compaction = await latest_compaction(store, TRACES)
    assert compaction is not None
    assert compaction.holdings is not None
    del store.objects[TRACES.key(compaction.holdings["parts"][2]["shard"])]
    report = await verify(store)
    assert any("holdings of partition 2" in p for p in report.problems), report.problems
