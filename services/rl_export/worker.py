"""The worker: the join stage over the input topics, and the sink beside it.

The join runs in ``join_processes`` child processes of the worker (:class:`ChildJoins`,
2 by default): one Python process is one core, and the join is the heavy stage. The sink,
compaction and the web port stay in the worker's own process; the web port answers for
the children too. With ``join_processes=0`` everything runs in one process.

How an event travels through the join (the steps match :meth:`JoinProcessor.process`):

1. :class:`JoinWorker`'s consumer (group ``app_id``, manual commits) takes a batch of
   events (up to ``join_batch_size``, waiting at most ``join_batch_window_s``) from the three
   input topics, which are co-partitioned by ``trace_id``, so one trace's events always
   reach the same worker.
2. Each event is decoded from its bytes and checked (size, JSON, schema, topic, key,
   partition, clock). One that fails goes to the dead-letter topic with its original
   bytes, its source topic, partition and offset, and the reason in the headers.
3. The event is merged into its trace's state (:func:`rl_export.join.merge`). States are
   read from the table once per trace per batch and kept in a working set.
4. After the batch, every touched state is written to the table once (RocksDB, and its
   changelog topic: :mod:`rl_export.statestore`), and the last snapshot of each trace that
   emitted goes to the ``trajectories`` topic (revisions may skip numbers, which DESIGN.md
   allows). States due to expire (orphans, tombstones) in the batch's partitions are
   deleted; the expiry index is rebuilt from the table whenever a partition is restored.
5. The emitter sends changelog, snapshots and dead letters in producer batches and waits
   for their acknowledgement; only then are the batch's input offsets committed: at least
   once. A redelivered event is a duplicate: it re-sends the current snapshot with the
   same revision and rewrites the state (so a changelog write lost in a crash is made
   good); the sink drops the repeat.

Why not Faust's agents and tables (DESIGN.md names them): faust-streaming delivers events
one at a time through its streams, and an agent that did nothing but count topped out at
about 4,700 events/s here, half of what the worker must sustain. The loop below does what
the Faust table did (a RocksDB store per partition, a compacted changelog, restore on
assignment) with batches end to end.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import gc
import heapq
import logging
import os
import signal
import sys
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Protocol

from aiohttp import ClientError, ClientSession, ClientTimeout, web
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, ConsumerRebalanceListener
from aiokafka.coordinator.assignors.range import RangePartitionAssignor
from aiokafka.errors import CommitFailedError, IllegalStateError, KafkaError
from prometheus_client import CollectorRegistry, Metric, generate_latest
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import Collector

from rl_export.codec import RawJson
from rl_export.compaction import compact, expire
from rl_export.errors import StoreError, WorkerError
from rl_export.events import EventFamily, EventRejection, RejectReason, decode_event, event_type_of
from rl_export.join import (
    JoinConfig,
    RawEvent,
    TraceState,
    current_snapshot,
    dump_state,
    expired,
    load_state,
    merge,
)
from rl_export.metrics import Metrics, SinkMetrics
from rl_export.process import LOOPBACK, free_port
from rl_export.records import encode_snapshot
from rl_export.settings import Settings, child_env
from rl_export.sink import HEADER_EVENT_MS, Sink, SinkConfig
from rl_export.statestore import ChangelogTable, PartitionStore, StoreLockedError, restore
from rl_export.store import open_store
from rl_export.topics import partition_for

log = logging.getLogger(__name__)


@dataclass(slots=True)
class InMessage:
    """What the join needs of one Kafka message; ``handle`` is the transport's own event.

    Not frozen: a frozen dataclass costs five times as much to create, and this is one per
    event.
    """

    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes
    timestamp_ms: int | None = None
    handle: Any = None


class StateTable(Protocol):
    """The join's state, keyed by ``trace_id`` bytes; ``at`` says which message is current."""

    def get(self, key: bytes, at: InMessage) -> bytes | None: ...
    def put(self, key: bytes, value: bytes, at: InMessage) -> None: ...
    def delete(self, key: bytes, at: InMessage) -> None: ...
    def items(self) -> Iterable[tuple[bytes, bytes]]: ...
    def __len__(self) -> int: ...


class Emitter(Protocol):
    """Where snapshots and dead letters go; ``flush`` returns once they are delivered."""

    async def snapshot(
        self, key: bytes, value: bytes, event_ms: int | None, partition: int
    ) -> None: ...
    async def dead_letter(self, message: InMessage, rejection: EventRejection) -> None: ...
    async def flush(self) -> None: ...


class MemoryTable:
    """A dict-backed :class:`StateTable` for unit tests and ``replay``."""

    def __init__(self) -> None:
        self.data: dict[bytes, bytes] = {}

    def get(self, key: bytes, at: InMessage) -> bytes | None:
        return self.data.get(key)

    def put(self, key: bytes, value: bytes, at: InMessage) -> None:
        self.data[key] = value

    def delete(self, key: bytes, at: InMessage) -> None:
        self.data.pop(key, None)

    def items(self) -> Iterable[tuple[bytes, bytes]]:
        return list(self.data.items())

    def __len__(self) -> int:
        return len(self.data)


def dead_letter_headers(message: InMessage, rejection: EventRejection) -> list[tuple[str, bytes]]:
    """Headers that say where a dead letter came from and why (the value is the original)."""
    return [
        ("rl-export-reason", rejection.reason.value.encode()),
        ("rl-export-detail", rejection.detail.encode()[:4096]),
        ("rl-export-source-topic", message.topic.encode()),
        ("rl-export-source-partition", str(message.partition).encode()),
        ("rl-export-source-offset", str(message.offset).encode()),
    ]


@dataclass
class BatchResult:
    """What one batch did (for tests and logs)."""

    snapshots: dict[bytes, dict[str, Any]] = field(default_factory=dict)
    rejected: list[tuple[InMessage, EventRejection]] = field(default_factory=list)
    expired: list[tuple[bytes, str]] = field(default_factory=list)


CONVERSATION = b"\xff"
"""Prefix of the table key that holds a trace's conversation (``CONVERSATION + trace_id``).

A state is written for every event of its trace, its conversation (most of its bytes) only
when it changes: the table and its changelog hold them under two keys. No UTF-8
``trace_id`` starts with the byte 0xFF, so the two kinds of key never meet.
"""


def conversation_key(key: bytes) -> bytes:
    return CONVERSATION + key


@dataclass
class _Touched:
    state: TraceState
    last: InMessage
    conversation: bytes | None  # as the table holds it
    emit: bool = False
    repeated: bool = False  # a redelivered event: rewrite everything, the first write may be lost
    event_ms: int | None = None


class JoinProcessor:
    """Runs steps 2-4 and 6 of the flow above over a batch; no Kafka in here."""

    def __init__(
        self,
        settings: Settings,
        table: StateTable,
        emitter: Emitter,
        metrics: Metrics,
        families: dict[str, EventFamily],
    ) -> None:
        self.settings = settings
        self.table = table
        self.emitter = emitter
        self.metrics = metrics
        self.families = families
        self.config = JoinConfig(human_pass_threshold=settings.human_pass_threshold)
        # partition -> heap of (deadline, trace_id): states that may expire then.
        self._expiry: dict[int, list[tuple[float, bytes]]] = {}
        self._partitions: dict[str, int] = {}

    def _partition_of(self, trace_id: str) -> int:
        """murmur2 in Python costs microseconds: remember recent traces' partitions."""
        partition = self._partitions.get(trace_id)
        if partition is None:
            if len(self._partitions) >= 100_000:
                self._partitions.clear()
            partition = self._partitions[trace_id] = partition_for(
                trace_id.encode(), self.settings.partitions
            )
        return partition

    def _check(self, message: InMessage, now: datetime) -> Any:
        decoded = decode_event(
            message.value,
            max_bytes=self.settings.max_event_bytes,
            now=now,
            future_tolerance_s=self.settings.future_tolerance_s,
            key=message.key,
            family=self.families.get(message.topic),
        )
        if isinstance(decoded, EventRejection):
            return decoded
        expected = self._partition_of(decoded.trace_id)
        if message.partition >= 0 and message.partition != expected:
            return EventRejection(
                RejectReason.WRONG_PARTITION,
                f"trace {decoded.trace_id!r} belongs on partition {expected} (Kafka's default "
                f"partitioner), not {message.partition}",
            )
        return decoded

    async def process(self, messages: list[InMessage], now: float | None = None) -> BatchResult:
        """Decode, merge and emit a batch; write each touched state once."""
        clock = time.time() if now is None else now
        wall = datetime.fromtimestamp(clock, UTC)
        result = BatchResult()
        touched: dict[bytes, _Touched] = {}
        outcomes: Counter[tuple[str, str]] = Counter()
        self.metrics.batch_size.observe(len(messages))

        for message in messages:  # step 2 and 3
            decoded = self._check(message, wall)
            if isinstance(decoded, EventRejection):
                result.rejected.append((message, decoded))
                outcomes["unknown", "rejected"] += 1
                continue
            key = decoded.trace_id.encode()
            entry = touched.get(key)
            conversation = None
            if entry is not None:
                state: TraceState | None = entry.state
            else:
                state, conversation = self._read(key, message)
            raw = RawEvent(
                message.value, message.topic, message.partition, message.offset,
                message.timestamp_ms,
            )  # fmt: skip
            merged = merge(state, decoded, raw, now=clock, config=self.config, build_snapshot=False)
            outcomes[event_type_of(decoded), merged.outcome] += 1
            if entry is None:
                entry = touched[key] = _Touched(merged.state, message, conversation)
            else:
                entry.state, entry.last = merged.state, message
            for item, rejection in merged.rejected:
                origin = InMessage(item.topic, item.partition, item.offset, key, item.value)
                result.rejected.append((origin, rejection))
            if merged.outcome == "duplicate":
                entry.repeated = True
            if merged.emits:
                entry.emit = True
                entry.event_ms = message.timestamp_ms

        latencies: list[float] = []
        for key, entry in touched.items():  # step 4: one table write per trace
            self._write(key, entry)
            self._schedule(key, entry.state, entry.last.partition)
            if entry.emit:  # the last snapshot of the batch: revisions may skip numbers
                snapshot = current_snapshot(entry.state, self.config)
                assert snapshot is not None  # emits only once the trace exists or is deleted
                result.snapshots[key] = snapshot
                # trajectories is co-partitioned with the inputs: the same partition.
                await self.emitter.snapshot(
                    key, encode_snapshot(snapshot), entry.event_ms, entry.last.partition
                )
                if entry.event_ms is not None:
                    latencies.append(max(0.0, clock - entry.event_ms / 1000))
        self.metrics.latency.observe_many(latencies)
        self.metrics.snapshots.inc(len(result.snapshots))
        for message, rejection in result.rejected:
            await self.emitter.dead_letter(message, rejection)
            self.metrics.rejected.labels(rejection.reason.value).inc()
        for (event_type, outcome), count in outcomes.items():
            self.metrics.events.labels(event_type, outcome).inc(count)
        result.expired = self._expire(messages, clock)  # step 6
        await self.emitter.flush()  # delivered before the batch is acked
        self.metrics.table_keys.set(len(self.table))
        return result

    def _read(self, key: bytes, at: InMessage) -> tuple[TraceState | None, bytes | None]:
        """A trace's state from the table, and its conversation as the table holds it."""
        stored = self.table.get(key, at)
        state = None if stored is None else load_state(stored)
        if state is None or state.trace is None or state.trace.messages.data:
            return state, None  # no trace yet, or an older state with its conversation inline
        conversation = self.table.get(conversation_key(key), at)
        if conversation is None:
            raise ValueError(f"the join table has no conversation for {key!r}")
        state.trace.messages = RawJson(conversation)
        return state, conversation

    def _write(self, key: bytes, entry: _Touched) -> None:
        """Write the state; the conversation only when it changed, or after a redelivery."""
        head, _, conversation = dump_state(entry.state).partition(b"\n")
        self.table.put(key, head, entry.last)
        if entry.repeated or conversation != (entry.conversation or b""):
            if conversation:
                self.table.put(conversation_key(key), conversation, entry.last)
            else:
                self.table.delete(conversation_key(key), entry.last)

    def _deadline(self, state: TraceState) -> float | None:
        if state.deleted and state.deleted_at is not None:
            return state.deleted_at + self.settings.tombstone_retention_s
        if state.is_orphan and state.first_pending_at is not None:
            return state.first_pending_at + self.settings.orphan_retention_s
        return None

    def _schedule(self, key: bytes, state: TraceState, partition: int) -> None:
        deadline = self._deadline(state)
        if deadline is not None:
            heapq.heappush(self._expiry.setdefault(partition, []), (deadline, key))

    def rebuild_expiry(
        self, items: Iterable[tuple[bytes, bytes]], partition: int | None = None
    ) -> int:
        """Rebuild the index of states that may expire from a scan; return how many.

        With ``partition``, ``items`` are that partition's and only its index is replaced.
        """
        if partition is None:
            self._expiry.clear()
        else:
            self._expiry.pop(partition, None)
        count = 0
        for key, value in items:
            if key.startswith(CONVERSATION):
                continue
            state = load_state(value)
            if self._deadline(state) is not None:
                where = partition_for(key, self.settings.partitions)
                self._schedule(key, state, where if partition is None else partition)
                count += 1
        return count

    def forget_partition(self, partition: int) -> None:
        """Drop the expiry index of a partition this worker no longer owns."""
        self._expiry.pop(partition, None)

    def _expire(self, messages: list[InMessage], now: float) -> list[tuple[bytes, str]]:
        dropped: list[tuple[bytes, str]] = []
        at_partition = {m.partition: m for m in messages}
        for partition, at in at_partition.items():
            heap = self._expiry.get(partition)
            while heap and heap[0][0] <= now:
                _, key = heapq.heappop(heap)
                stored = self.table.get(key, at)
                if stored is None:
                    continue
                kind = expired(
                    load_state(stored),
                    now,
                    self.settings.orphan_retention_s,
                    self.settings.tombstone_retention_s,
                )
                if kind is not None:  # the state may have moved on since it was indexed
                    self.table.delete(key, at)
                    self.table.delete(conversation_key(key), at)
                    self.metrics.expired.labels(kind).inc()
                    dropped.append((key, kind))
        return dropped


# --- Kafka ---------------------------------------------------------------------------------


class KafkaEmitter:
    """:class:`Emitter` that also carries the table's changelog; everything goes at ``flush``.

    Messages are buffered during a batch and sent with one producer batch per topic
    partition (``create_batch``/``send_batch``), then ``flush`` waits for every
    acknowledgement. The worker commits the input offsets only after that, so what a batch
    sent is durable before the batch counts as done. ``positions`` holds, per changelog
    partition, the offset after the last acknowledged changelog record.
    """

    def __init__(self, settings: Settings, table: ChangelogTable) -> None:
        self.settings = settings
        self.table = table
        self._producer: AIOKafkaProducer | None = None
        self._out: dict[tuple[str, int], list[tuple[bytes | None, bytes | None, Headers]]] = {}
        self.positions: dict[int, int] = {}

    async def start(self) -> None:
        self._producer = AIOKafkaProducer(
            bootstrap_servers=self.settings.kafka_bootstrap,
            acks="all",
            enable_idempotence=True,
            max_batch_size=1024 * 1024,
            max_request_size=self.settings.max_event_bytes * 2 + 64 * 1024,
            compression_type=self.settings.producer_compression or None,
        )
        await self._producer.start()

    def _queue(self, topic: str, partition: int, key: bytes | None, value: bytes | None,
               headers: Headers) -> None:  # fmt: skip
        self._out.setdefault((topic, partition), []).append((key, value, headers))

    async def snapshot(
        self, key: bytes, value: bytes, event_ms: int | None, partition: int
    ) -> None:
        headers = [] if event_ms is None else [(HEADER_EVENT_MS, str(event_ms).encode())]
        self._queue(self.settings.topic_trajectories, partition, key, value, headers)

    async def dead_letter(self, message: InMessage, rejection: EventRejection) -> None:
        self._queue(
            self.settings.topic_dead_letter, max(message.partition, 0), message.key,
            message.value, dead_letter_headers(message, rejection),
        )  # fmt: skip

    async def flush(self) -> None:
        for partition, changes in self.table.take_changes().items():
            for trace_key, state in changes.items():
                self._queue(self.settings.topic_changelog, partition, trace_key, state, [])
        out, self._out = self._out, {}
        if not out:
            return
        assert self._producer is not None, "start() the emitter first"
        sent: list[tuple[str, int, int, asyncio.Future[Any]]] = []
        for (topic, partition), messages in out.items():
            batch, count = self._producer.create_batch(), 0
            for key, value, headers in messages:
                while batch.append(key=key, value=value, timestamp=None, headers=headers) is None:
                    if count == 0:
                        raise ValueError(f"a message for {topic} is larger than a batch")
                    sent.append(
                        (topic, partition, count, await self._send(batch, topic, partition))
                    )
                    batch, count = self._producer.create_batch(), 0
                count += 1
            if count:
                sent.append((topic, partition, count, await self._send(batch, topic, partition)))
        changelog = self.settings.topic_changelog
        for topic, partition, count, future in sent:
            metadata = await future
            if topic == changelog:
                end = metadata.offset + count
                self.positions[partition] = max(self.positions.get(partition, 0), end)

    async def _send(self, batch: Any, topic: str, partition: int) -> asyncio.Future[Any]:
        assert self._producer is not None
        future: asyncio.Future[Any] = await self._producer.send_batch(
            batch, topic, partition=partition
        )
        return future

    async def close(self) -> None:
        if self._producer is not None:
            await self._producer.stop()
            self._producer = None


Headers = list[tuple[str, bytes]]


class JoinWorker:
    """The join stage: a consumer group over the three input topics, the table, the emitter.

    One loop does everything, so nothing else touches the table: fetch a batch, restore
    newly assigned partitions, process, flush, commit the batch's offsets. A rebalance waits
    for the batch in hand (the lock); a batch fetched across a rebalance is put back and
    read again (:meth:`_unread`).
    """

    def __init__(self, settings: Settings, metrics: Metrics) -> None:
        self.settings = settings
        self.table = ChangelogTable(
            settings.state_store, settings.data_dir / "worker" / settings.app_id
        )
        self.emitter = KafkaEmitter(settings, self.table)
        families = {
            settings.topic_traces: EventFamily.TRACES,
            settings.topic_evaluations: EventFamily.EVALUATIONS,
            settings.topic_labels: EventFamily.LABELS,
        }
        self.processor = JoinProcessor(settings, self.table, self.emitter, metrics, families)
        self.lock = asyncio.Lock()
        self.epoch = 0  # bumped by every rebalance
        self.to_restore: set[int] = set()
        self.assigned: set[int] = set()
        self.ready = asyncio.Event()
        self._last_scan = time.monotonic()

    async def run(self, stop: asyncio.Event) -> None:
        worker = self

        class Listener(ConsumerRebalanceListener):  # type: ignore[misc]
            async def on_partitions_revoked(self, revoked: Any) -> None:
                async with worker.lock:  # the batch in hand finishes and commits first
                    worker.epoch += 1
                    worker.ready.clear()
                    for partition in {tp.partition for tp in revoked}:
                        worker.table.close(partition)
                        worker.processor.forget_partition(partition)
                        worker.assigned.discard(partition)
                        worker.to_restore.discard(partition)

            async def on_partitions_assigned(self, assigned: Any) -> None:
                async with worker.lock:
                    worker.epoch += 1
                    partitions = {tp.partition for tp in assigned}
                    worker.to_restore |= partitions - worker.assigned
                    worker.assigned |= partitions
                    if not worker.to_restore:  # none new, or none at all: more members
                        worker.ready.set()  # than partitions is allowed, just idle
                    log.info("join assigned partitions %s", sorted(worker.assigned))

        await self.emitter.start()
        consumer = AIOKafkaConsumer(
            bootstrap_servers=self.settings.kafka_bootstrap,
            group_id=self.settings.app_id,
            enable_auto_commit=False,
            auto_offset_reset="earliest",
            max_poll_records=self.settings.join_batch_size,
            max_partition_fetch_bytes=4 * 1024 * 1024,
            # Range, not aiokafka's default round robin: it gives each member the same
            # partition numbers of every input topic, so one trace's events meet in one
            # member. Round robin does that only by luck (when the members divide the
            # partitions), and with three members of eight partitions it does not.
            partition_assignment_strategy=(RangePartitionAssignor,),
            session_timeout_ms=int(self.settings.session_timeout_s * 1000),
            heartbeat_interval_ms=int(self.settings.session_timeout_s * 1000 / 4),
        )
        consumer.subscribe(list(self.settings.input_topics), listener=Listener())
        await consumer.start()
        try:
            while not stop.is_set():
                await self._step(consumer)
        finally:
            async with self.lock:
                await consumer.stop()
                await self.emitter.close()
                self.table.close_all()

    async def _step(self, consumer: AIOKafkaConsumer) -> None:
        epoch = self.epoch
        fetched = await consumer.getmany(
            timeout_ms=int(self.settings.join_batch_window_s * 1000),
            max_records=self.settings.join_batch_size,
        )
        async with self.lock:
            if self.to_restore:
                await self._restore()
            if epoch != self.epoch:  # a rebalance came in while we fetched
                await self._unread(consumer, fetched)
                return
            messages = [
                InMessage(tp.topic, tp.partition, r.offset, r.key, r.value, r.timestamp, None)
                for tp, records in fetched.items()
                for r in records
            ]
            if messages:
                await _process_until_done(self.processor, messages)
                self._record_positions()
                offsets = {tp: records[-1].offset + 1 for tp, records in fetched.items() if records}
                try:
                    await consumer.commit(offsets)
                except (CommitFailedError, IllegalStateError) as exc:
                    # The group moved on (we were too slow, or paused): the partitions'
                    # new owner reads these events again; the join treats them as repeats.
                    log.warning("join commit refused, a rebalance is under way: %s", exc)
            if time.monotonic() - self._last_scan >= self.settings.expiry_scan_interval_s:
                self._rebuild_expiry(self.assigned)

    async def _unread(self, consumer: AIOKafkaConsumer, fetched: dict[Any, list[Any]]) -> None:
        """Put back a batch fetched across a rebalance: read it again, from its start.

        The records may come from before the rebalance or from the positions it reset;
        either way the consumer's position is now past them, and dropping them unseen would
        let the next commit skip them. Each partition we still own goes back to the first
        record of the batch, or to its committed offset if that is earlier.
        """
        for tp, records in fetched.items():
            if not records or tp not in consumer.assignment():
                continue
            start = records[0].offset
            try:
                committed = await consumer.committed(tp)
            except KafkaError:
                committed = None
            consumer.seek(tp, start if committed is None else min(start, committed))

    async def _restore(self) -> None:
        partitions = sorted(self.to_restore)
        stores = {p: await self._open(p) for p in partitions}
        await restore(self.settings.kafka_bootstrap, self.settings.topic_changelog, stores)
        self.to_restore.clear()
        self._rebuild_expiry(partitions)
        self.ready.set()

    async def _open(self, partition: int) -> PartitionStore:
        """Open a partition's store, waiting while its previous owner still has it open.

        The join processes of a worker share its data dir. When the group moves a partition
        from one to another, the first may still be finishing its batch (or, if it missed
        the rebalance, learn of it only at its next heartbeat) before it closes the store.
        """
        deadline = time.monotonic() + max(30.0, 3 * self.settings.session_timeout_s)
        while True:
            try:
                return self.table.open(partition)
            except StoreLockedError:
                if time.monotonic() >= deadline:
                    raise
                log.info("partition %d's store is still open elsewhere; waiting", partition)
                await asyncio.sleep(0.5)

    def _rebuild_expiry(self, partitions: Iterable[int]) -> None:
        found = 0
        for partition in partitions:
            store = self.table.stores.get(partition)
            if store is not None:
                found += self.processor.rebuild_expiry(store.items(), partition=partition)
        self._last_scan = time.monotonic()
        log.info("expiry index rebuilt: %d states may expire", found)

    def _record_positions(self) -> None:
        for partition, end in self.emitter.positions.items():
            store = self.table.stores.get(partition)
            if store is not None and end > store.changelog_next:
                store.set_changelog_next(end)
        self.emitter.positions.clear()


async def _process_until_done(processor: JoinProcessor, messages: list[InMessage]) -> None:
    """Retry a failed batch until it goes through; its offsets are committed only after.

    Processing again is safe: events already merged are duplicates that re-send the same
    revision.
    """
    delay = 0.5
    while True:
        try:
            await processor.process(messages)
            return
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("join batch of %d events failed; retrying in %.1fs", len(messages), delay)
            await asyncio.sleep(delay)
            delay = min(delay * 2, 30.0)


# --- the worker process ------------------------------------------------------------------------


def build_sink(settings: Settings, registry: CollectorRegistry) -> Sink:
    return Sink(
        bootstrap=settings.kafka_bootstrap,
        topic=settings.topic_trajectories,
        group=settings.sink_group,
        store=open_store(settings.store_url),
        metrics=SinkMetrics(registry),
        config=SinkConfig(
            max_records=settings.shard_max_records,
            max_bytes=settings.shard_max_bytes,
            max_age_s=settings.shard_max_age_s,
            compression=settings.shard_compression,
            partitions=settings.partitions,
            crash_at=settings.crash_at,
        ),
        specs=settings.corpora,
        session_timeout_s=settings.session_timeout_s,
    )


async def compact_corpora(sink: Sink, settings: Settings) -> None:
    """Compact what this worker writes; other workers may race, create-only decides."""
    for ref in sink.corpora_written():
        try:
            made = await compact(
                sink.store, ref, writer=sink.writer, compression=settings.shard_compression
            )
            await expire(sink.store, ref, retention_s=settings.shard_retention_s, now=time.time())
        except StoreError as exc:
            log.error("compaction of %s failed, will retry: %s", ref.root, exc)
            continue
        if made is not None:
            sink.metrics.compactions.inc()
            log.info("%s: generation %d, %d records", ref.root, made.generation, made.records)


class JoinStage(Protocol):
    """The join as the worker's pages see it: in this process or in a child process."""

    async def run(self, stop: asyncio.Event) -> None: ...
    async def is_ready(self) -> bool: ...
    async def metrics_text(self) -> bytes: ...


class InProcessJoin:
    """The join in the worker's own process (``join_processes=0``)."""

    def __init__(self, settings: Settings) -> None:
        self.registry = CollectorRegistry()
        self.worker = JoinWorker(settings, Metrics(self.registry))

    async def run(self, stop: asyncio.Event) -> None:
        await self.worker.run(stop)

    async def is_ready(self) -> bool:
        return self.worker.ready.is_set() and not self.worker.to_restore

    async def metrics_text(self) -> bytes:
        return generate_latest(self.registry)


class _Child:
    """One join process: its OS process and its private loopback port."""

    def __init__(self, index: int) -> None:
        self.index = index
        self.port = free_port()
        self.proc: asyncio.subprocess.Process | None = None


class ChildJoins:
    """The join in ``join_processes`` child processes, so it can use more than one core.

    Each child is ``python -m rl_export.join_process PARENT_PID PORT``, one more member of
    the join's consumer group (the partitions are shared among all the children of all the
    workers, like Kafka Streams' stream threads). A child takes its settings from the same
    ``RL_EXPORT_`` environment, writes to the worker's log, serves ``/readyz`` and
    ``/metrics`` on a loopback port that only this parent reads, and dies with the parent
    (PR_SET_PDEATHSIG), so a worker killed with SIGKILL leaves no join behind. When a child
    exits on its own, the worker stops with an error: a worker without its join must not
    look healthy. The worker's ``/metrics`` shows the children's join metrics summed.
    """

    def __init__(self, settings: Settings, count: int) -> None:
        self.settings = settings
        self.children = [_Child(i) for i in range(count)]
        self.http: ClientSession | None = None

    async def run(self, stop: asyncio.Event) -> None:
        self.http = ClientSession(timeout=ClientTimeout(total=5))
        exits: dict[asyncio.Task[int], _Child] = {}
        stopping = asyncio.create_task(stop.wait())
        try:
            for child in self.children:
                child.proc = await asyncio.create_subprocess_exec(
                    sys.executable, "-m", "rl_export.join_process", str(os.getpid()),
                    str(child.port), env=child_env(self.settings, os.environ),
                    stdin=asyncio.subprocess.DEVNULL,
                )  # fmt: skip
                exits[asyncio.create_task(child.proc.wait())] = child
                log.info("join process %d started (pid %d)", child.index, child.proc.pid)
            done, _ = await asyncio.wait([*exits, stopping], return_when=asyncio.FIRST_COMPLETED)
            for task in done:
                if task in exits:
                    raise WorkerError(
                        f"join process {exits[task].index} exited with code {task.result()}"
                    )
        finally:
            stopping.cancel()
            await self._stop(list(exits))
            await self.http.close()

    async def _stop(self, exits: list[asyncio.Task[int]]) -> None:
        """SIGTERM: each child finishes its batch and commits, like a worker; then SIGKILL."""
        running = [c.proc for c in self.children if c.proc and c.proc.returncode is None]
        for proc in running:
            proc.terminate()
        if exits:
            _, late = await asyncio.wait(exits, timeout=30)
            if late:
                log.error("%d join process(es) did not stop within 30s; killing", len(late))
        for proc in running:
            if proc.returncode is None:
                proc.kill()
                await proc.wait()

    async def _get(self, child: _Child, path: str) -> tuple[int, bytes] | None:
        if self.http is None or child.proc is None or child.proc.returncode is not None:
            return None
        try:
            async with self.http.get(f"http://{LOOPBACK}:{child.port}{path}") as response:
                return response.status, await response.read()
        except (ClientError, OSError, TimeoutError):
            return None  # not listening yet, or going away

    async def is_ready(self) -> bool:
        answers = await asyncio.gather(*(self._get(c, "/readyz") for c in self.children))
        return all(a is not None and a[0] == 200 for a in answers)

    async def metrics_text(self) -> bytes:
        answers = await asyncio.gather(*(self._get(c, "/metrics") for c in self.children))
        return sum_metrics([a[1].decode() for a in answers if a is not None and a[0] == 200])


def sum_metrics(texts: list[str]) -> bytes:
    """Prometheus texts of processes with the same metrics, as one text of their sums.

    Counters, histogram buckets, sums and counts, and gauges (table keys) all add up across
    the join processes, which own disjoint partitions. The ``_created`` timestamps do not
    add up, and are left out.
    """
    families: dict[str, Metric] = {}
    values: dict[str, dict[tuple[str, tuple[tuple[str, str], ...]], float]] = {}
    for text in texts:
        for family in text_string_to_metric_families(text):
            if family.name.endswith("_created"):
                continue
            if family.name not in families:
                families[family.name] = Metric(family.name, family.documentation, family.type)
                values[family.name] = {}
            for sample in family.samples:
                key = (sample.name, tuple(sorted(sample.labels.items())))
                values[family.name][key] = values[family.name].get(key, 0.0) + sample.value
    registry = CollectorRegistry()
    registry.register(_Families(families, values))
    return generate_latest(registry)


class _Families(Collector):
    def __init__(
        self,
        families: dict[str, Metric],
        values: dict[str, dict[tuple[str, tuple[tuple[str, str], ...]], float]],
    ) -> None:
        self.families = families
        self.values = values

    def collect(self) -> Iterable[Metric]:
        for name, family in self.families.items():
            for (sample, labels), value in self.values[name].items():
                family.add_sample(sample, dict(labels), value)
            yield family


async def _serve_pages(
    host: str,
    port: int,
    ready: Callable[[], Awaitable[bool]],
    metrics_text: Callable[[], Awaitable[bytes]],
) -> web.AppRunner:
    async def healthz(request: web.Request) -> web.Response:
        return web.json_response({"status": "ok"})

    async def readyz(request: web.Request) -> web.Response:
        is_ready = await ready()
        return web.json_response({"ready": is_ready}, status=200 if is_ready else 503)

    async def metrics_page(request: web.Request) -> web.Response:
        return web.Response(body=await metrics_text(), content_type="text/plain")

    app = web.Application()
    app.add_routes(
        [
            web.get("/healthz", healthz),
            web.get("/readyz", readyz),
            web.get("/metrics", metrics_page),
        ]
    )
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, host, port).start()
    return runner


async def serve_worker(settings: Settings, stop: asyncio.Event) -> None:
    """Run the join, the sink, compaction and the web pages until ``stop`` is set."""
    registry = CollectorRegistry()
    sink = build_sink(settings, registry)
    join: JoinStage = (
        ChildJoins(settings, settings.join_processes) if settings.join_processes else (
            InProcessJoin(settings))
    )  # fmt: skip

    async def ready() -> bool:
        return sink.assigned.is_set() and await join.is_ready()

    async def metrics_text() -> bytes:
        return generate_latest(registry) + await join.metrics_text()

    runner = await _serve_pages(settings.web_host, settings.worker_web_port, ready, metrics_text)

    async def compaction_timer() -> None:
        while not stop.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), settings.compaction_interval_s)
            if not stop.is_set():
                await compact_corpora(sink, settings)

    tasks = [
        asyncio.create_task(join.run(stop), name="join"),
        asyncio.create_task(sink.run(stop), name="sink"),
        asyncio.create_task(compaction_timer(), name="compaction"),
    ]
    try:
        await _run_stages(tasks, stop)
    finally:
        await runner.cleanup()
        await sink.store.close()


async def serve_join(settings: Settings, port: int, stop: asyncio.Event) -> None:
    """The join child's main: the join, and its pages on a loopback port for the parent."""
    join = InProcessJoin(settings)
    runner = await _serve_pages(LOOPBACK, port, join.is_ready, join.metrics_text)
    try:
        await _run_stages([asyncio.create_task(join.run(stop), name="join")], stop)
    finally:
        await runner.cleanup()


async def _run_stages(tasks: list[asyncio.Task[None]], stop: asyncio.Event) -> None:
    """Wait for the stages; one that fails stops the others and raises its error."""
    try:
        done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
        for task in done:
            task.result()
    finally:
        stop.set()
        for task in tasks:
            if not task.done():
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(asyncio.shield(task), 40)
                task.cancel()


_LOG_LEVELS = {"crit": "CRITICAL", "error": "ERROR", "warn": "WARNING", "info": "INFO",
               "debug": "DEBUG"}  # fmt: skip


def _configure_logging(settings: Settings) -> None:
    logging.basicConfig(
        level=_LOG_LEVELS[settings.log_level],
        format="[%(asctime)s] [%(process)d] [%(levelname)s] %(name)s: %(message)s",
        force=True,  # the command line set up warnings-only logging before
    )
    logging.getLogger("aiokafka").setLevel(logging.WARNING)


def tune_gc() -> None:
    """Run CPython's cycle collector less often, and never over the start-up objects.

    The join and the sink allocate a hundred-odd objects per event, nearly all freed by
    reference counting; with the default generation-0 threshold (700 allocations) the cycle
    collector still ran every few events, and its older generations walked every module,
    schema and client object loaded at start. ``gc.freeze`` moves those out of its way, and
    a threshold of 50,000 lets it run once per few hundred events. In process this cut the
    join's time per event by about 7 %; garbage cycles (rare here: mostly failed futures)
    wait a little longer to be collected.
    """
    gc.collect()
    gc.freeze()
    gc.set_threshold(50_000, 20, 100)


def _stop_on_signals(stop: asyncio.Event) -> None:
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)


def run_worker(settings: Settings) -> int:
    """Check the topics, then run the worker until SIGTERM/SIGINT; return the exit code."""
    from rl_export.topics import ensure_service_topics

    _configure_logging(settings)

    async def main() -> None:
        await ensure_service_topics(settings)  # refuses when a partition count differs
        stop = asyncio.Event()
        _stop_on_signals(stop)
        tune_gc()
        log.info("worker starting: join group %s in %d processes (0: in this one), sink group "
                 "%s, store %s", settings.app_id, settings.join_processes, settings.sink_group,
                 settings.store_url)  # fmt: skip
        await serve_worker(settings, stop)
        log.info("worker stopped")

    asyncio.run(main())  # a WorkerError is reported by the command line, in one line
    return 0


def run_join_process(parent_pid: int, port: int) -> int:
    """A join child of a worker (see :class:`ChildJoins`); return the exit code."""
    _die_with(parent_pid)
    settings = Settings()
    _configure_logging(settings)

    async def main() -> None:
        stop = asyncio.Event()
        _stop_on_signals(stop)
        tune_gc()

        async def watch_parent() -> None:  # where PR_SET_PDEATHSIG does not exist
            while not stop.is_set():
                if os.getppid() != parent_pid:
                    log.error("the worker (pid %d) is gone; the join stops", parent_pid)
                    stop.set()
                await asyncio.sleep(1)

        watcher = asyncio.create_task(watch_parent())
        log.info("join process starting: group %s", settings.app_id)
        try:
            await serve_join(settings, port, stop)
        finally:
            watcher.cancel()
        log.info("join process stopped")

    asyncio.run(main())
    return 0


def _die_with(parent_pid: int) -> None:
    """Ask Linux to SIGKILL this process when its parent dies; exit if it already has."""
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != parent_pid:
        raise SystemExit(1)


_PR_SET_PDEATHSIG = 1  # from <linux/prctl.h>
