"""The sink: append join snapshots to corpora as exactly-once JSON Lines shards.

How a snapshot travels (per ``trajectories`` partition, the steps match the code):

1. The consumer (group ``sink_group``, manual offset commits) hands each record to the
   :class:`PartitionSink` of its partition.
2. For every corpus spec, the snapshot becomes that corpus's record (or tombstone, or
   nothing) and goes to the :class:`ChainWriter` of ``(org, project, corpus, partition)``.
   A writer loads its chain head and holdings from the store when its first record arrives;
   records at offsets its chain already covers are skipped, and revisions the corpus already
   holds are dropped as repeats.
3. When the partition's pending records reach the record, byte or age bound, every writer
   with pending records commits, in this fixed order: (a) the data object, named by its
   content hash; (b) the commit, create-only, covering ``head`` .. the last offset read;
   (c) once all writers of the partition committed, the Kafka offset after that record.
4. A writer that loses the create-only race reloads its chain and keeps only what the
   winner did not cover. After any crash the group offset is at or before every chain head,
   so records are read again and step 2 skips what is already committed.
"""

from __future__ import annotations

import asyncio
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
from aiokafka.errors import CommitFailedError, IllegalStateError
from aiokafka.structs import OffsetAndMetadata

from rl_export.codec import dumps, dumps_line
from rl_export.corpora import (
    DEFAULT_CORPORA,
    SCHEMA_VERSION,
    ChainState,
    Commit,
    Compression,
    CorpusRef,
    CorpusSpec,
    Holding,
    encode_shard,
    load_chain_state,
    utc_now,
)
from rl_export.errors import ObjectExistsError, StoreError
from rl_export.metrics import SinkMetrics
from rl_export.records import decode_snapshot
from rl_export.store import ObjectStore
from rl_export.topics import partition_for

log = logging.getLogger(__name__)

HEADER_EVENT_MS = "rl-export-event-ms"
"""Header of a snapshot: the Kafka timestamp (ms) of the event that caused it."""


def writer_id() -> str:
    """Who writes: host, pid and a random suffix (a restarted process is a new writer)."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


@dataclass(frozen=True)
class SinkConfig:
    """The sink's bounds and options."""

    max_records: int = 10_000
    max_bytes: int = 64 * 1024 * 1024
    max_age_s: float = 10.0
    compression: Compression = "none"
    partitions: int = 8
    crash_at: str = ""  # fault injection for tests: "after_data", "after_commit"


@dataclass
class Pending:
    offset: int
    snapshot: dict[str, Any]
    record: dict[str, Any]
    event_ms: int | None
    line: bytes  # the record as its JSON Lines line, encoded once


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
    ) -> None:
        self.store = store
        self.ref = ref
        self.spec = spec
        self.topic = topic
        self.partition = partition
        self.stream = ref.stream(topic, partition)
        self.config = config
        self.metrics = metrics
        self.writer = writer
        self.state: ChainState | None = None
        self.pending: list[Pending] = []
        self.pending_bytes = 0

    async def load(self) -> ChainState:
        if self.state is None:
            self.state = await load_chain_state(
                self.store,
                self.ref,
                self.stream,
                belongs=lambda t: (
                    partition_for(t.encode(), self.config.partitions) == self.partition
                ),
            )
        return self.state

    async def add(self, offset: int, snapshot: dict[str, Any], event_ms: int | None) -> None:
        """Step 2: decide what this corpus writes for a snapshot, and buffer it."""
        state = await self.load()
        if offset < state.head:
            return  # already in a committed shard
        record = self.spec.record_for(snapshot)
        trace_id = snapshot["trace_id"]
        held = state.held.get(trace_id)
        if record is None or record.get("deleted"):
            if held is None or held.deleted:
                if held is not None and snapshot["revision"] <= held.revision:
                    self.metrics.repeats.inc()
                return  # nothing held: nothing to hide
            if snapshot["revision"] <= held.revision:
                self.metrics.repeats.inc()
                return
            record = {
                "trace_id": trace_id,
                "org": snapshot["org"],
                "project": snapshot["project"],
                "reward_source": self.spec.source,
                "revision": snapshot["revision"],
                "deleted": True,
            }
        elif held is not None and record["revision"] <= held.revision:
            self.metrics.repeats.inc()
            return
        state.held[trace_id] = Holding(record["revision"], bool(record.get("deleted")))
        line = dumps_line(record)
        self.pending.append(Pending(offset, snapshot, record, event_ms, line))
        self.pending_bytes += len(line)

    async def commit(self, last_offset: int) -> None:
        """Step 3 (a) and (b): data object, then the create-only commit; retry after a loss."""
        while self.pending:
            if self.state is None:  # a lost race invalidated it (perhaps a failed reload)
                await self._after_losing()
                continue
            state = self.state
            rows = [p.record for p in self.pending]
            shard = encode_shard(
                rows, self.config.compression, lines=[p.line for p in self.pending]
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
            for p in self.pending:
                if p.event_ms is not None:
                    self.metrics.freshness.observe(max(0.0, now - p.event_ms / 1000))
            state.head = last_offset + 1
            self.pending.clear()
            self.pending_bytes = 0

    async def _after_losing(self) -> None:
        """Another writer created our commit first: take its chain, keep what it left.

        The chain is reloaded before anything pending is let go: if the reload fails, the
        pending records stay, ``state`` stays None, and the next flush starts here again.
        """
        state = await self.load()  # raises before anything pending is let go
        waiting = self.pending
        self.pending, self.pending_bytes = [], 0
        log.warning(
            "%s %s: lost a commit race; chain head is now %d", self.ref.root, self.stream,
            state.head,
        )  # fmt: skip
        for p in waiting:
            await self.add(p.offset, p.snapshot, p.event_ms)


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
            writer = ChainWriter(
                self.store, ref, spec, topic=self.topic, partition=self.partition,
                config=self.config, metrics=self.metrics, writer=self.writer,
            )  # fmt: skip
            self.writers[key] = writer
        return writer

    async def handle(self, offset: int, value: bytes, event_ms: int | None) -> None:
        """Step 2 for one record of the partition."""
        self.last_offset = max(self.last_offset, offset)
        try:
            snapshot = decode_snapshot(value)
        except ValueError as exc:
            self.metrics.bad_snapshots.inc()
            log.error(
                "%s-%d@%d is not a snapshot (%s); skipped", self.topic, self.partition, offset, exc
            )
            return
        org, project = snapshot["org"], snapshot["project"]
        for spec in self.specs:
            await self._writer(org, project, spec).add(offset, snapshot, event_ms)
        if self.first_pending_at is None and self.pending_records:
            self.first_pending_at = time.monotonic()

    @property
    def pending_records(self) -> int:
        return sum(len(w.pending) for w in self.writers.values())

    @property
    def pending_bytes(self) -> int:
        return sum(w.pending_bytes for w in self.writers.values())

    def due(self, now: float) -> bool:
        if not self.pending_records:
            return False
        aged = self.first_pending_at is not None and now - self.first_pending_at >= (
            self.config.max_age_s
        )
        return (
            aged
            or self.pending_records >= self.config.max_records
            or self.pending_bytes >= self.config.max_bytes
        )

    async def flush(self) -> int | None:
        """Steps 3 (a) and (b) for every writer; return the Kafka offset now safe to commit."""
        for writer in self.writers.values():
            if writer.pending:
                await writer.commit(self.last_offset)
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
                for tp in revoked:
                    sink.parts.pop(tp.partition, None)

            async def on_partitions_assigned(self, assigned: Any) -> None:
                sink.assigned.set()

        consumer = AIOKafkaConsumer(
            bootstrap_servers=self.bootstrap,
            group_id=self.group,
            enable_auto_commit=False,
            auto_offset_reset="earliest",
            session_timeout_ms=int(self.session_timeout_s * 1000),
            heartbeat_interval_ms=int(self.session_timeout_s * 250),
            max_poll_records=5000,
        )
        consumer.subscribe([self.topic], listener=Listener())
        await consumer.start()
        try:
            while not stop.is_set():
                batch = await consumer.getmany(timeout_ms=200)
                for tp, records in batch.items():
                    try:
                        await self._handle(consumer, tp, records)
                    except StoreError as exc:
                        await self._rewind(consumer, tp, exc)
                await self._flush_due(consumer)
        finally:
            await consumer.stop()

    async def _handle(self, consumer: AIOKafkaConsumer, tp: TopicPartition, records: Any) -> None:
        """Step 2 for one partition's records, while the partition is still ours."""
        for r in records:
            # A rebalance can run while we await the store: a partition taken away mid-batch
            # must not get a fresh PartitionSink from the rest of a stale batch.
            if tp not in consumer.assignment():
                self.parts.pop(tp.partition, None)
                return
            await self._part(tp.partition).handle(r.offset, r.value, _event_ms(r.headers))

    async def _rewind(self, consumer: AIOKafkaConsumer, tp: TopicPartition, exc: Exception) -> None:
        """The store failed while reading a chain: forget the partition's state, read it again.

        Nothing of it was committed past the group offset, so seeking back to that offset
        (or the beginning) and rebuilding the writers from the store loses nothing.
        """
        self.metrics.store_errors.inc()
        log.error("%s-%d: store failed, reading the partition again: %s", *tp, exc)
        self.parts.pop(tp.partition, None)
        if tp in consumer.assignment():
            committed = await consumer.committed(tp)
            if committed is None:
                await consumer.seek_to_beginning(tp)
            else:
                consumer.seek(tp, committed)
        await asyncio.sleep(1.0)

    async def _flush_due(self, consumer: AIOKafkaConsumer) -> None:
        now = time.monotonic()
        assigned = {tp.partition for tp in consumer.assignment() if tp.topic == self.topic}
        for partition, part in list(self.parts.items()):
            if partition not in assigned:  # revoked while we were busy: its next owner reads it
                self.parts.pop(partition, None)
                continue
            offset = part.idle_offset()
            if part.due(now):
                try:
                    offset = await part.flush()
                except StoreError as exc:
                    self.metrics.store_errors.inc()
                    log.error("flush of %s-%d failed, will retry: %s", self.topic, partition, exc)
                    part.first_pending_at = now  # back off by one age bound
                    continue
            if offset is None or self.parts.get(partition) is not part:
                continue
            try:  # step 3 (c)
                await consumer.commit(
                    {TopicPartition(self.topic, partition): OffsetAndMetadata(offset, "")}
                )
                part.committed = offset
            except (CommitFailedError, IllegalStateError) as exc:
                log.warning("offset commit for partition %d skipped: %s", partition, exc)


def _event_ms(headers: Sequence[tuple[str, bytes]] | None) -> int | None:
    for key, value in headers or ():
        if key == HEADER_EVENT_MS:
            try:
                return int(value)
            except ValueError:
                return None
    return None
