"""The sink: append join snapshots to corpora as exactly-once JSON Lines shards.

How a snapshot travels (per ``trajectories`` partition, the steps match the code):

1. The consumer (group ``sink_group``, manual offset commits) hands each record to the
   :class:`PartitionSink` of its partition.
2. For every corpus spec, the snapshot becomes that corpus's record (or tombstone, or
   nothing; redacted when the spec asks: :meth:`CorpusSpec.scrub`) and goes to the
   :class:`ChainWriter` of ``(org, project, corpus, partition)``.
   A writer loads its chain head, and what the corpus holds for its partition's traces (on
   every chain: :func:`rl_export.corpora.layout.load_chain_state`), from the store when its
   first record arrives; records at offsets its chain already covers are skipped, and
   revisions the corpus already holds are dropped as repeats.
3. When the partition's pending records reach the record, byte or age bound (or the
   partitions together hold the sink's buffer bound, and this one holds most:
   :func:`flushed_early`), every writer with pending records commits, in this fixed order:
   (a) the data object, named by its content hash; (b) the commit, create-only, covering
   ``head`` .. the last offset read; (c) once all writers of the partition committed, the
   Kafka offset after that record. A flush the store refused is tried again one age bound
   later; while the partitions together hold more than the buffer bound after a flush
   (the store is refusing commits), the consumer is paused (:meth:`Sink._hold_back`).
4. A writer that loses the create-only race reloads its chain and keeps only what the
   winner did not cover. After any crash the group offset is at or before every chain head,
   so records are read again and step 2 skips what is already committed. A batch fetched or
   handled across a rebalance is dropped, and every partition read again from its group
   offset with fresh state (:meth:`Sink._reread`).
"""

from __future__ import annotations

import asyncio
import gc
import logging
import os
import signal
import socket
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from aiokafka import AIOKafkaConsumer, ConsumerRebalanceListener, TopicPartition
from aiokafka.errors import CommitFailedError, IllegalStateError, KafkaError
from aiokafka.structs import OffsetAndMetadata

from rl_export.common.codec import dumps
from rl_export.common.errors import ObjectExistsError, StoreError
from rl_export.common.metrics import SinkMetrics
from rl_export.common.partitioning import Partitioner, partition_for
from rl_export.common.records import (
    HEADER_EVENT_MS,
    HEADER_RECORD_AT,
    SnapshotLines,
    decode_snapshot,
)
from rl_export.common.retrying import start_when_reachable, stop_quietly
from rl_export.common.specs import DEFAULT_CORPORA, CorpusSpec
from rl_export.corpora.backfill import seed_chain
from rl_export.corpora.layout import (
    SCHEMA_VERSION,
    ChainState,
    Commit,
    Compression,
    CorpusRef,
    encode_lines,
    load_chain_state,
    utc_now,
)
from rl_export.corpora.store import ObjectStore

log = logging.getLogger(__name__)


def writer_id() -> str:
    """Who writes: host, pid and a random suffix (a restarted process is a new writer)."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


@dataclass(frozen=True)
class SinkConfig:
    """The sink's bounds and options."""

    max_records: int = 10_000
    max_bytes: int = 64 * 1024 * 1024
    max_age_s: float = 10.0
    # What all the partitions may hold together (the bounds above are each partition's).
    buffer_bytes: int = 32 * 1024 * 1024
    compression: Compression = "none"
    partitions: int = 8
    partitioner: Partitioner = "murmur2"  # how trace_id maps to a trajectories partition
    crash_at: str = ""  # fault injection for tests: "after_data", "after_commit"


@dataclass(slots=True)
class Pending:
    """A line waiting for the next commit, with what re-checking it after a lost race needs.

    Not the snapshot: the decision a corpus makes for a snapshot depends only on whether it
    holds a record for it (``deleted`` says it holds none: the line is a tombstone), the
    trace and the revision; the line for that decision never changes.
    """

    offset: int
    trace_id: str
    revision: int
    deleted: bool  # the line is a tombstone
    erased: bool  # the trace itself is deleted (trace.deleted)
    line: bytes  # the record as its JSON Lines line, encoded once
    updated_at: str | None  # the record's, for the commit (a tombstone has none)
    event_ms: int | None


@dataclass(slots=True)
class PendingTotals:
    """Records and bytes pending in all the writers of a partition.

    The writers keep it current as their pending lists change, so the sink can check its
    bounds after every record without summing over every writer.
    """

    records: int = 0
    bytes: int = 0


class ChainWriter:
    """Appends one corpus's records for one topic partition to its chain."""

    def __init__(
        self,
        store: ObjectStore,
        ref: CorpusRef,
        spec: CorpusSpec,
        *,
        topic: str,
        partition: int,
        config: SinkConfig,
        metrics: SinkMetrics,
        writer: str,
        totals: PendingTotals | None = None,
        seed: CorpusRef | None = None,
    ) -> None:
        self.store = store
        self.seed = seed  # the corpus a new chain is seeded from (backfill), if any
        self.ref = ref
        self.spec = spec
        self.topic = topic
        self.partition = partition
        self.stream = ref.stream(topic, partition)
        self.config = config
        self.metrics = metrics
        self.writer = writer
        self.totals = PendingTotals() if totals is None else totals
        self.state: ChainState | None = None
        self.pending: list[Pending] = []
        self.pending_bytes = 0

    def _belongs(self, trace_id: str) -> bool:
        config = self.config
        return partition_for(trace_id.encode(), config.partitions, config.partitioner) == (
            self.partition
        )

    async def load(self) -> ChainState:
        """The chain's head and holdings from the store; a new chain is seeded first
        (:mod:`rl_export.corpora.backfill`)."""
        if self.state is None:
            state = await load_chain_state(
                self.store,
                self.ref,
                self.stream,
                belongs=self._belongs,
                partitioning=(self.config.partitioner, self.config.partitions),
            )
            if state.head == 0 and self.seed is not None and not self.pending:
                state = await seed_chain(
                    self.store, self.ref, self.spec, self.seed, state, stream=self.stream,
                    belongs=self._belongs,
                    keep=lambda st, t, r, d: self._keep(st, t, r, deleted=d, erased=False),
                    compression=self.config.compression, writer=self.writer,
                    metrics=self.metrics,
                )  # fmt: skip
            self.state = state
        return self.state

    async def loaded(self) -> ChainState:
        """The chain's state, loaded from the store if it is not yet (or no longer) known."""
        if self.state is not None:
            return self.state
        if self.pending:
            # A lost race whose reload failed: what is pending must be checked against the
            # reloaded chain as well, not committed after it unchecked.
            return await self._after_losing()
        return await self.load()

    def add(self, offset: int, snapshot: SnapshotLines, event_ms: int | None) -> None:
        """Step 2: decide what this corpus writes for a snapshot, and buffer it.

        The chain must be :meth:`loaded`. (Not a coroutine that awaits it: this runs for every
        corpus and record, and the chain is loaded once.)
        """
        state = self.state
        if state is None:
            raise RuntimeError(f"{self.ref.root} {self.stream}: the chain is not loaded")
        if offset < state.head:
            return  # already in a committed shard
        spec, source = self.spec, self.spec.source
        holds = spec.holds(snapshot)
        erased = snapshot.deleted
        line = None
        if holds and spec.format != "trajectory":  # a row only if the format has one
            line = spec.held_line(snapshot)
            holds = line is not None
        if self._keep(state, snapshot.trace_id, snapshot.revision, deleted=not holds,
                      erased=erased):  # fmt: skip
            if line is None:
                line = snapshot.line(source) if holds else snapshot.tombstone_line(source)
            if holds and spec.redact:  # a corpus written scrubbed (never the default ones)
                line, counts = spec.scrub(line)
                for kind, n in counts.items():
                    self.metrics.redactions.labels(kind).inc(n)
            updated_at = snapshot.updated_at if holds else None
            self._append(
                Pending(
                    offset, snapshot.trace_id, snapshot.revision, not holds, erased, line,
                    updated_at, event_ms,
                )
            )  # fmt: skip

    def _keep(
        self, state: ChainState, trace_id: str, revision: int, *, deleted: bool, erased: bool
    ) -> bool:
        """Whether a record (or, ``deleted``, no record) at a revision changes what the corpus
        holds; if so, hold it.

        A revision the corpus holds, or an older one, is a repeat. No record where the corpus
        holds none, or only a tombstone, changes nothing; where it holds a record, no record
        means a tombstone. A deleted trace (``erased``) gets its tombstone even where the
        corpus holds nothing: an older revision replayed later, on another chain, must find
        the deletion and not bring the trace back.
        """
        code = state.held.get(trace_id)  # revision * 2 + deleted (ChainState)
        if code is not None and revision <= code >> 1:
            self.metrics.repeats.inc()
            return False
        if deleted and not erased and (code is None or code & 1):
            return False  # nothing held: nothing to hide
        state.hold(trace_id, revision, deleted)
        return True

    def _append(self, pending: Pending) -> None:
        self.pending.append(pending)
        size = len(pending.line)
        self.pending_bytes += size
        self.totals.records += 1
        self.totals.bytes += size

    def _take_pending(self) -> list[Pending]:
        """Empty the pending list, returning what it held."""
        taken = self.pending
        self.totals.records -= len(taken)
        self.totals.bytes -= self.pending_bytes
        self.pending, self.pending_bytes = [], 0
        return taken

    async def commit(self, last_offset: int) -> None:
        """Step 3 (a) and (b): data object, then the create-only commit; retry after a loss."""
        while self.pending:
            if self.state is None:  # a lost race invalidated it (perhaps a failed reload)
                await self._after_losing()
                continue
            state = self.state
            shard = encode_lines(
                [p.line for p in self.pending],
                [p.updated_at for p in self.pending if p.updated_at],
                self.config.compression,
            )
            started = time.monotonic()
            data_key = self.ref.data_key(self.stream, state.head, shard.sha256, shard.compression)
            await self.store.put(data_key, shard.data)
            if self.config.crash_at == "after_data":
                os.kill(os.getpid(), signal.SIGKILL)
            commit = Commit(
                topic=self.topic,
                partition=self.partition,
                from_offset=state.head,
                last_offset=last_offset,
                shard=self.ref.relative(data_key),
                records=shard.records,
                bytes=len(shard.data),
                sha256=shard.sha256,
                compression=shard.compression,
                schema_version=SCHEMA_VERSION,
                min_updated_at=shard.min_updated_at,
                max_updated_at=shard.max_updated_at,
                writer=self.writer,
                created_at=utc_now(),
            )
            try:
                await self.store.put_if_absent(
                    self.ref.manifest_key(self.stream, state.head),
                    dumps(commit.model_dump(mode="json")),
                )
            except ObjectExistsError:
                self.metrics.conflicts.inc()
                self.state = None  # reloaded, and pending re-checked, at the top of the loop
                continue
            now = time.time()
            self.metrics.commit_latency.observe(time.monotonic() - started)
            self.metrics.commits.labels(self.spec.name).inc()
            self.metrics.records.labels(self.spec.name).inc(shard.records)
            self.metrics.bytes.labels(self.spec.name).inc(len(shard.data))
            self.metrics.freshness.observe_many(
                [max(0.0, now - p.event_ms / 1000) for p in self.pending if p.event_ms is not None]
            )
            state.head = last_offset + 1
            self._take_pending()

    async def _after_losing(self) -> ChainState:
        """Another writer created our commit first: take its chain, keep what it left.

        The chain is reloaded before anything pending is let go: if the reload fails, the
        pending records stay, ``state`` stays None, and the next flush (or record) starts
        here again. What is kept goes through the same checks as in :meth:`add`, against the
        reloaded holdings.
        """
        state = await self.load()  # raises before anything pending is let go
        waiting = self._take_pending()
        log.warning(
            "%s %s: lost a commit race; chain head is now %d", self.ref.root, self.stream,
            state.head,
        )  # fmt: skip
        for p in waiting:
            if p.offset >= state.head and self._keep(
                state, p.trace_id, p.revision, deleted=p.deleted, erased=p.erased
            ):
                self._append(p)
        return state


def seed_source(specs: Sequence[CorpusSpec]) -> CorpusSpec | None:
    """The corpus new corpora are backfilled from: the first that holds every trace's latest
    snapshot (no reward source, ``trajectory`` format, no filter), ``traces`` by default."""
    for spec in specs:
        if spec.source is None and spec.format == "trajectory" and spec.everything:
            return spec
    return None


@dataclass
class PartitionSink:
    """Everything the sink does for one ``trajectories`` partition."""

    store: ObjectStore
    topic: str
    partition: int
    specs: Sequence[CorpusSpec]
    config: SinkConfig
    metrics: SinkMetrics
    writer: str
    writers: dict[tuple[str, str, str], ChainWriter] = field(default_factory=dict)
    last_offset: int = -1
    first_pending_at: float | None = None
    committed: int = -1  # the Kafka offset last committed for this partition
    retry_after: float = 0.0  # a flush the store refused: not tried early before this
    totals: PendingTotals = field(default_factory=PendingTotals, init=False)
    # The writers of each (org, project), one per spec in order: one lookup per record.
    _project_writers: dict[tuple[str, str], tuple[ChainWriter, ...]] = field(
        default_factory=dict, init=False, repr=False
    )

    def idle_offset(self) -> int | None:
        """With nothing pending, the offset after the last record read, if not yet committed.

        Records that wrote nothing (repeats, not ready, skipped) must still move the group
        offset, or a partition whose tail is all repeats would lag forever.
        """
        if self.pending_records or self.last_offset + 1 <= self.committed:
            return None
        return self.last_offset + 1

    def _writer(self, org: str, project: str, spec: CorpusSpec) -> ChainWriter:
        key = (org, project, spec.name)
        writer = self.writers.get(key)
        if writer is None:
            ref = CorpusRef(org, project, spec.name)
            seed = seed_source(self.specs)
            writer = ChainWriter(
                self.store, ref, spec, topic=self.topic, partition=self.partition,
                config=self.config, metrics=self.metrics, writer=self.writer,
                totals=self.totals,
                seed=None if seed is None or seed is spec else CorpusRef(org, project, seed.name),
            )  # fmt: skip
            self.writers[key] = writer
        return writer

    def _writers_of(self, org: str, project: str) -> tuple[ChainWriter, ...]:
        writers = self._project_writers.get((org, project))
        if writers is None:
            writers = tuple(self._writer(org, project, spec) for spec in self.specs)
            self._project_writers[(org, project)] = writers
        return writers

    async def handle(
        self, offset: int, value: bytes, event_ms: int | None, record_at: bytes | None = None
    ) -> None:
        """Step 2 for one record of the partition (``record_at``: the snapshot's header).

        The snapshot's lines are shared by the corpora: encoded at most once, and not at all
        for a snapshot in the record layout, whose value holds them.
        """
        self.last_offset = max(self.last_offset, offset)
        lines = None if record_at is None else SnapshotLines.from_record(value, record_at)
        if lines is None:
            try:
                lines = SnapshotLines(decode_snapshot(value))
            except ValueError as exc:
                self.metrics.bad_snapshots.inc()
                log.error(
                    "%s-%d@%d is not a snapshot (%s); skipped", self.topic, self.partition,
                    offset, exc,
                )  # fmt: skip
                return
        for writer in self._writers_of(lines.org, lines.project):
            if writer.state is None:
                await writer.loaded()
            writer.add(offset, lines, event_ms)
        if self.first_pending_at is None and self.totals.records:
            self.first_pending_at = time.monotonic()

    @property
    def pending_records(self) -> int:
        return self.totals.records

    @property
    def pending_bytes(self) -> int:
        return self.totals.bytes

    def due(self, now: float) -> bool:
        records = self.totals.records
        if not records:
            return False
        # The deadline as ``retry_after`` and the callers compute it: ``now - first`` can
        # round below the bound at the very moment ``first + bound``.
        aged = self.first_pending_at is not None and now >= (
            self.first_pending_at + self.config.max_age_s
        )
        return (
            aged or records >= self.config.max_records or self.totals.bytes >= self.config.max_bytes
        )

    async def flush(self) -> int | None:
        """Steps 3 (a) and (b) for every writer; return the Kafka offset now safe to commit.

        The writers' chains are independent, so they commit concurrently (a store round trip
        or an fsync each, not one after another). Every commit finishes before the first
        error is raised: a writer is never committing twice at once.
        """
        results = await asyncio.gather(
            *(w.commit(self.last_offset) for w in self.writers.values() if w.pending),
            return_exceptions=True,
        )
        for result in results:
            if isinstance(result, BaseException):
                raise result
        self.first_pending_at = None
        if self.config.crash_at == "after_commit":
            os.kill(os.getpid(), signal.SIGKILL)
        return self.last_offset + 1 if self.last_offset >= 0 else None


class Sink:
    """Consumes ``trajectories`` with a plain aiokafka consumer group and runs the steps."""

    def __init__(
        self,
        *,
        bootstrap: str,
        topic: str,
        group: str,
        store: ObjectStore,
        metrics: SinkMetrics,
        config: SinkConfig,
        specs: Sequence[CorpusSpec] = DEFAULT_CORPORA,
        session_timeout_s: float = 10.0,
    ) -> None:
        self.bootstrap = bootstrap
        self.topic = topic
        self.group = group
        self.store = store
        self.metrics = metrics
        self.config = config
        self.specs = specs
        self.session_timeout_s = session_timeout_s
        self.writer = writer_id()
        self.parts: dict[int, PartitionSink] = {}
        self.assigned = asyncio.Event()
        self.epoch = 0  # bumped by every rebalance
        self.paused = False  # reading paused: the buffer is over its bound (_hold_back)

    def corpora_written(self) -> list[CorpusRef]:
        """The corpora this sink has written to (for periodic compaction)."""
        refs = {w.ref for part in self.parts.values() for w in part.writers.values()}
        return sorted(refs, key=lambda r: r.root)

    def _part(self, partition: int) -> PartitionSink:
        part = self.parts.get(partition)
        if part is None:
            part = self.parts[partition] = PartitionSink(
                self.store, self.topic, partition, self.specs, self.config, self.metrics,
                self.writer,
            )  # fmt: skip
        return part

    async def run(self, stop: asyncio.Event) -> None:
        """Consume, buffer and commit until ``stop`` is set."""
        sink = self

        class Listener(ConsumerRebalanceListener):  # type: ignore[misc]
            async def on_partitions_revoked(self, revoked: Any) -> None:
                # Pending records of a lost partition are read again by its next owner,
                # from the group offset, which never passed them.
                sink.epoch += 1
                for tp in revoked:
                    sink.parts.pop(tp.partition, None)

            async def on_partitions_assigned(self, assigned: Any) -> None:
                sink.epoch += 1
                sink.assigned.set()
                log.info("sink assigned partitions %s", sorted(tp.partition for tp in assigned))

        consumer = AIOKafkaConsumer(
            bootstrap_servers=self.bootstrap,
            group_id=self.group,
            enable_auto_commit=False,
            auto_offset_reset="earliest",
            # The join writes snapshots in transactions: a fenced zombie's aborted ones
            # must never reach a corpus.
            isolation_level="read_committed",
            session_timeout_ms=int(self.session_timeout_s * 1000),
            heartbeat_interval_ms=min(int(self.session_timeout_s * 250), 1000),
            max_poll_records=5000,
            max_partition_fetch_bytes=512 * 1024,
            fetch_max_bytes=8 * 1024 * 1024,  # what is fetched ahead, held in memory
        )
        consumer.subscribe([self.topic], listener=Listener())
        if not await start_when_reachable(consumer.start, "sink consumer", stop, log):
            return
        try:
            while not stop.is_set():
                epoch = self.epoch
                batch = await consumer.getmany(timeout_ms=200)
                for tp, records in batch.items():
                    if self.epoch != epoch:
                        break
                    try:
                        await self._handle(consumer, tp, records, epoch)
                    except StoreError as exc:
                        await self._rewind(consumer, tp, exc)
                if self.epoch != epoch:
                    await self._reread(consumer)
                    continue
                await self._flush_due(consumer)
        finally:
            await stop_quietly(consumer.stop, "sink consumer", log)

    async def _reread(self, consumer: AIOKafkaConsumer) -> None:
        """A rebalance came in while a batch was fetched or handled: start over from the
        committed offsets, with fresh partition state.

        The batch may hold records fetched before the rebalance, from positions past the
        group offset (the records in between were pending in partition state the revocation
        dropped). Handling them in fresh state would let a commit cover offsets whose
        records it does not hold: a loss, which the soak found. Nothing pending here was
        committed, so reading again from the group offset loses and repeats nothing.
        """
        for tp in list(consumer.assignment()):
            if tp.topic != self.topic:
                continue
            self.parts.pop(tp.partition, None)
            await _seek_committed(consumer, tp)

    async def _handle(
        self, consumer: AIOKafkaConsumer, tp: TopicPartition, records: Any, epoch: int
    ) -> None:
        """Step 2 for one partition's records, while the partition is still ours."""
        for r in records:
            # A rebalance can run while we await the store: a partition taken away mid-batch
            # (even if given back) must not get a fresh PartitionSink from the rest of a
            # stale batch; the caller reads it again.
            if self.epoch != epoch or tp not in consumer.assignment():
                self.parts.pop(tp.partition, None)
                return
            await self._part(tp.partition).handle(r.offset, r.value, *_snapshot_headers(r.headers))

    async def _rewind(self, consumer: AIOKafkaConsumer, tp: TopicPartition, exc: Exception) -> None:
        """The store failed while reading a chain: forget the partition's state, read it again.

        Nothing of it was committed past the group offset, so seeking back to that offset
        (or the beginning) and rebuilding the writers from the store loses nothing.
        """
        self.metrics.store_errors.inc()
        log.error("%s-%d: store failed, reading the partition again: %s", *tp, exc)
        self.parts.pop(tp.partition, None)
        await _seek_committed(consumer, tp)
        await asyncio.sleep(1.0)

    async def _flush_due(self, consumer: AIOKafkaConsumer) -> None:
        """Flush every partition that is due, concurrently; then commit their offsets."""
        now = time.monotonic()
        assigned = {tp.partition for tp in consumer.assignment() if tp.topic == self.topic}
        due: list[PartitionSink] = []
        waiting: list[PartitionSink] = []  # holding records, within their own bounds
        offsets: dict[int, tuple[PartitionSink, int]] = {}
        for partition, part in list(self.parts.items()):
            if partition not in assigned:  # revoked while we were busy: its next owner reads it
                self.parts.pop(partition, None)
            elif part.due(now):
                due.append(part)
            elif part.pending_records:
                waiting.append(part)
            elif (offset := part.idle_offset()) is not None:
                offsets[partition] = (part, offset)
        early = flushed_early(waiting, self.config.buffer_bytes, now)
        self.metrics.early_flushes.inc(len(early))
        due += early
        results = await asyncio.gather(*(part.flush() for part in due), return_exceptions=True)
        refused = False
        for part, result in zip(due, results, strict=True):
            if isinstance(result, StoreError):
                refused = True
                self.metrics.store_errors.inc()
                log.error(
                    "flush of %s-%d failed, will retry: %s", self.topic, part.partition, str(result)
                )  # the text: a record must not hold the request's frames
                part.first_pending_at = now  # back off by one age bound
                part.retry_after = now + self.config.max_age_s
            elif isinstance(result, BaseException):
                raise result
            elif result is not None:
                offsets[part.partition] = (part, result)
        if refused:
            del results, result
            await free_refused_requests()
        self._hold_back(consumer)
        ready = {p: (part, o) for p, (part, o) in offsets.items() if self.parts.get(p) is part}
        if not ready:
            return
        try:  # step 3 (c)
            await consumer.commit(
                {
                    TopicPartition(self.topic, p): OffsetAndMetadata(o, "")
                    for p, (_, o) in ready.items()
                }
            )
        except (CommitFailedError, IllegalStateError, KafkaError) as exc:
            # Committed later, or read again by the next owner (and skipped: the chains
            # already hold it).
            log.warning("offset commit for partitions %s skipped: %r", sorted(ready), exc)
            return
        for part, offset in ready.values():
            part.committed = offset

    def _hold_back(self, consumer: AIOKafkaConsumer) -> None:
        """Pause reading while the buffer holds more than its bound after a flush; resume
        once it does not.

        After a flush the buffer is over its bound only when the store refused commits
        (every other partition over its share was just committed), and reading on would
        grow it for as long as the store is down. Paused, the consumer still heartbeats
        and keeps its partitions; the refused flushes are tried again one age bound later,
        and reading resumes after the first that brings the buffer back under its bound.
        """
        held = sum(part.pending_bytes for part in self.parts.values())
        self.metrics.buffered_bytes.set(held)
        over = held > self.config.buffer_bytes
        if over:  # again after a rebalance: newly assigned partitions start unpaused
            consumer.pause(*(tp for tp in consumer.assignment() if tp.topic == self.topic))
        if over and not self.paused:
            log.warning("the sink holds %s bytes of records, over its bound of %s, and the "
                        "store refuses commits: reading paused until it takes them again",
                        f"{held:,}", f"{self.config.buffer_bytes:,}")  # fmt: skip
        elif self.paused and not over:
            consumer.resume(*consumer.paused())
            log.info("the sink's buffer is within its bound again: reading resumed")
        self.paused = over
        self.metrics.paused.set(1 if over else 0)


async def free_refused_requests() -> None:
    """Collect the garbage cycles a refused store request leaves behind.

    A failed request's exception, and the frames it passed through (ours, aiobotocore's,
    aiohttp's), refer to each other, and they hold the shard's bytes and the HTTP
    request's copy of them. :func:`rl_export.common.gctune.tune_gc` runs the cycle
    collector once per 50,000 allocations, and a sink waiting on a store that is down
    allocates few: each refused round stayed in memory, 64 MiB a round on the bench's
    traffic, past 1 GiB in three minutes of an outage. A collection here takes 30-50 ms,
    once per refused round. It waits one turn of the event loop first: until the gathered
    flushes' done callbacks have run, the loop still holds the failed tasks.
    """
    await asyncio.sleep(0)
    gc.collect()


def flushed_early(waiting: Sequence[PartitionSink], budget: int, now: float) -> list[PartitionSink]:
    """The partitions to commit before their own bounds, so that the sink's buffer stays
    within ``budget`` bytes of records.

    Each partition's bounds (records, bytes, age) hold its shards to a size; this holds
    what all of them buffer together, which a backlog would otherwise fill to the age
    bound on every partition at once. Past the budget the partitions holding most go
    first (the largest shards), until the rest hold at most half of it, so that a sink at
    its budget does not commit a sliver at every poll. Checked after each poll: the
    buffer can pass the budget by one poll's records. A partition whose flush the store
    refused is not tried again before its ``retry_after`` (one age bound), so a store that
    is down is not asked at every poll; it still counts towards what the buffer holds.
    """
    held = sum(p.pending_bytes for p in waiting)
    if held <= budget:
        return []
    early = []
    retryable = (p for p in waiting if p.retry_after <= now)
    for part in sorted(retryable, key=lambda p: p.pending_bytes, reverse=True):
        if held <= budget // 2:
            break
        early.append(part)
        held -= part.pending_bytes
    return early


async def _seek_committed(consumer: AIOKafkaConsumer, tp: TopicPartition) -> None:
    """Move a partition's position back to its group offset (or the beginning), asking
    again while the broker is away, unless the partition is taken from us meanwhile (the
    sink does not hold off rebalances while it works, so that can happen at any await)."""
    while tp in consumer.assignment():
        try:
            committed = await consumer.committed(tp)
        except KafkaError as exc:
            log.warning("%s-%d: cannot read the committed offset: %r", *tp, exc)
            await asyncio.sleep(1.0)
            continue
        try:
            if committed is None:
                await consumer.seek_to_beginning(tp)
            else:
                consumer.seek(tp, committed)
        except IllegalStateError:  # revoked while we asked: its next owner starts there
            log.info("%s-%d: revoked while seeking to its group offset", *tp)
        return


def _snapshot_headers(
    headers: Sequence[tuple[str, bytes]] | None,
) -> tuple[int | None, bytes | None]:
    """A snapshot's event time (ms) and where its record's parts are, from its headers."""
    event_ms = record_at = None
    for key, value in headers or ():
        if key == HEADER_EVENT_MS:
            event_ms = _int(value)
        elif key == HEADER_RECORD_AT:
            record_at = value
    return event_ms, record_at


def _int(value: bytes) -> int | None:
    try:
        return int(value)
    except ValueError:
        return None
