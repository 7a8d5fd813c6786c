"""The worker: a Faust app whose agent joins the input topics, and the sink beside it.

How an event travels through the worker (the steps match :meth:`JoinProcessor.process`):

1. The agent takes a batch of events (up to ``join_batch_size``, waiting at most
   ``join_batch_window_s``) from the three input topics, which are co-partitioned by
   ``trace_id``, so one trace's events always reach the same worker.
2. Each event is decoded from its bytes and checked (size, JSON, schema, topic, key,
   partition, clock). One that fails goes to the dead-letter topic with its original
   bytes, its source topic, partition and offset, and the reason in the headers.
3. The event is merged into its trace's state (:func:`rl_export.join.merge`). States are
   read from the table once per trace per batch and kept in a working set.
4. After the batch, every touched state is written to the table once (RocksDB and its
   changelog topic), then the last snapshot of each trace that emitted is sent to the
   ``trajectories`` topic (revisions may skip numbers, which DESIGN.md allows).
5. Faust acks the batch; its consumer commit flushes the producer (changelog, snapshots,
   dead letters) before it commits offsets: at least once. A redelivered event is a
   duplicate: it re-sends the current snapshot with the same revision and rewrites the
   state (so a changelog write lost in a crash is made good); the sink drops the repeat.
6. States due to expire (orphans, tombstones) in the batch's partitions are deleted.
   A read-only timer rebuilds the expiry index from the table after a restart.
"""

from __future__ import annotations

import asyncio
import heapq
import logging
import time
import weakref
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Protocol

import orjson
from aiokafka import AIOKafkaProducer
from prometheus_client import CollectorRegistry, generate_latest

from rl_export.compaction import compact, expire
from rl_export.errors import StoreError
from rl_export.events import EventFamily, EventRejection, RejectReason, decode_event, event_type_of
from rl_export.join import JoinConfig, RawEvent, TraceState, dump_state, expired, load_state, merge
from rl_export.metrics import Metrics, SinkMetrics
from rl_export.settings import Settings
from rl_export.sink import HEADER_EVENT_MS, Sink, SinkConfig
from rl_export.store import open_store
from rl_export.topics import partition_for

log = logging.getLogger(__name__)

TABLE_NAME = "trace-state"


@dataclass(frozen=True)
class InMessage:
    """What the join needs of one Kafka message; ``handle`` is the transport's own event."""

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

    async def snapshot(self, key: bytes, value: bytes, event_ms: int | None) -> None: ...
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


@dataclass
class _Touched:
    state: TraceState
    last: InMessage
    emit: bool = False
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
        expected = partition_for(decoded.trace_id.encode(), self.settings.partitions)
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
        self.metrics.batch_size.observe(len(messages))

        for message in messages:  # step 2 and 3
            decoded = self._check(message, wall)
            if isinstance(decoded, EventRejection):
                result.rejected.append((message, decoded))
                self.metrics.events.labels("unknown", "rejected").inc()
                continue
            key = decoded.trace_id.encode()
            entry = touched.get(key)
            if entry is not None:
                state: TraceState | None = entry.state
            else:
                stored = self.table.get(key, message)
                state = None if stored is None else load_state(stored)
            raw = RawEvent(
                message.value, message.topic, message.partition, message.offset,
                message.timestamp_ms,
            )  # fmt: skip
            merged = merge(state, decoded, raw, now=clock, config=self.config)
            self.metrics.events.labels(event_type_of(decoded), merged.outcome).inc()
            if entry is None:
                entry = touched[key] = _Touched(merged.state, message)
            else:
                entry.state, entry.last = merged.state, message
            for item, rejection in merged.rejected:
                origin = InMessage(item.topic, item.partition, item.offset, key, item.value)
                result.rejected.append((origin, rejection))
            if merged.snapshot is not None:
                entry.emit = True
                entry.event_ms = message.timestamp_ms
                result.snapshots[key] = merged.snapshot

        for key, entry in touched.items():  # step 4: one table write per trace
            self.table.put(key, dump_state(entry.state), entry.last)
            self._schedule(key, entry.state, entry.last.partition)
        for key, snapshot in result.snapshots.items():
            event_ms = touched[key].event_ms
            await self.emitter.snapshot(key, orjson.dumps(snapshot), event_ms)
            self.metrics.snapshots.inc()
            if event_ms is not None:
                self.metrics.latency.observe(max(0.0, clock - event_ms / 1000))
        for message, rejection in result.rejected:
            await self.emitter.dead_letter(message, rejection)
            self.metrics.rejected.labels(rejection.reason.value).inc()
        await self.emitter.flush()  # delivered before the batch is acked

        result.expired = self._expire(messages, clock)  # step 6
        self.metrics.table_keys.set(len(self.table))
        return result

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

    def rebuild_expiry(self, items: Iterable[tuple[bytes, bytes]]) -> int:
        """Rebuild the index of states that may expire from a full scan; return how many."""
        self._expiry.clear()
        count = 0
        for key, value in items:
            state = load_state(value)
            if self._deadline(state) is not None:
                self._schedule(key, state, partition_for(key, self.settings.partitions))
                count += 1
        return count

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
                    self.metrics.expired.labels(kind).inc()
                    dropped.append((key, kind))
        return dropped


# --- Faust ---------------------------------------------------------------------------------


def _set_current_event(event: Any) -> None:
    """Make ``event`` Faust's current event.

    Faust tables and the RocksDB store find a key's partition from the current event. The
    agent handles a whole batch at once, so it names the event each table access belongs to.
    """
    from faust.streams import _current_event

    _current_event.set(weakref.ref(event))


def _app_class(input_topics: set[str]) -> Any:
    """A Faust App whose consumer cannot lose input events around a rebalance.

    Two gaps in faust-streaming 0.15 (with aiokafka 0.14), both closed here:

    * Messages fetched while a rebalance is under way are skipped (right) but also *acked*,
      so a later commit can move the group's offset past events no agent processed. We
      refuse acks for messages of an older generation.
    * After a rebalance Faust seeks each partition back to its committed offset, but
      aiokafka only seeks when one exists: a partition with nothing committed yet stays
      where the skipped messages left it. We seek those input partitions to the beginning.

    Either way the events are read again, and the join treats the ones it had already seen
    as duplicates.
    """
    import faust
    from faust.transport.drivers import aiokafka as driver

    class GuardedConsumer(driver.Consumer):
        def ack(self, message: Any) -> bool:
            if message.generation_id != self.app.consumer_generation_id:
                return False
            acked: bool = super().ack(message)
            return acked

        async def seek_to_committed(self) -> Any:
            committed = await super().seek_to_committed()
            fresh = [tp for tp, off in committed.items() if not off and tp.topic in input_topics]
            if fresh:
                await self._thread.seek_to_beginning(*fresh)
            return committed

    class GuardedTransport(driver.Transport):
        Consumer = GuardedConsumer

    class JoinApp(faust.App):
        def _new_transport(self) -> Any:
            return GuardedTransport(self.conf.broker_consumer, self)

    return JoinApp


class FaustTable:
    """:class:`StateTable` over a Faust table (RocksDB or memory, changelog-backed)."""

    def __init__(self, table: Any) -> None:
        self.table = table

    def get(self, key: bytes, at: InMessage) -> bytes | None:
        _set_current_event(at.handle)
        value: bytes | None = self.table.get(key)
        return value

    def put(self, key: bytes, value: bytes, at: InMessage) -> None:
        _set_current_event(at.handle)
        self.table[key] = value

    def delete(self, key: bytes, at: InMessage) -> None:
        _set_current_event(at.handle)
        self.table.pop(key, None)

    def items(self) -> Iterator[tuple[bytes, bytes]]:
        yield from self.table.items()

    def __len__(self) -> int:
        return len(self.table)


class KafkaEmitter:
    """:class:`Emitter` with a producer of its own: batched, and flushed once per batch.

    Faust's producer sends one message at a time through a small buffer; snapshots carry
    whole conversations, so they go through a batching aiokafka producer instead.
    :meth:`flush` waits for the broker's acknowledgement of everything sent for a batch, and
    the agent calls it before the batch is acked, so at least once holds as with Faust's.
    """

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self._producer: AIOKafkaProducer | None = None
        self._pending: list[asyncio.Future[Any]] = []

    async def _send(self, topic: str, key: bytes | None, value: bytes,
                    headers: list[tuple[str, bytes]]) -> None:  # fmt: skip
        if self._producer is None:
            self._producer = AIOKafkaProducer(
                bootstrap_servers=self.settings.kafka_bootstrap,
                acks="all",
                enable_idempotence=True,
                linger_ms=5,
                max_batch_size=1024 * 1024,
                max_request_size=self.settings.max_event_bytes * 2 + 64 * 1024,
            )
            await self._producer.start()
        self._pending.append(await self._producer.send(topic, value, key=key, headers=headers))

    async def snapshot(self, key: bytes, value: bytes, event_ms: int | None) -> None:
        headers = [] if event_ms is None else [(HEADER_EVENT_MS, str(event_ms).encode())]
        await self._send(self.settings.topic_trajectories, key, value, headers)

    async def dead_letter(self, message: InMessage, rejection: EventRejection) -> None:
        await self._send(
            self.settings.topic_dead_letter, message.key, message.value,
            dead_letter_headers(message, rejection),
        )  # fmt: skip

    async def flush(self) -> None:
        pending, self._pending = self._pending, []
        if pending:
            await asyncio.gather(*pending)

    async def close(self) -> None:
        if self._producer is not None:
            await self._producer.stop()
            self._producer = None


@dataclass
class WorkerApp:
    """The Faust app with its processor and metrics."""

    app: Any
    processor: JoinProcessor
    metrics: Metrics
    changelog_topic: str
    sink: Sink


def changelog_topic_name(settings: Settings) -> str:
    return f"{settings.app_id}-{TABLE_NAME}-changelog"


def build_app(settings: Settings, registry: CollectorRegistry | None = None) -> WorkerApp:
    """Declare the Faust app, its table, topics, agent, timer and web pages."""
    import faust

    datadir = settings.data_dir / "worker" / settings.app_id
    datadir.mkdir(parents=True, exist_ok=True)
    raw: Any = faust.Schema(key_type=bytes, value_type=bytes, key_serializer="raw",
                       value_serializer="raw")  # fmt: skip
    app = _app_class(set(settings.input_topics))(
        settings.app_id,
        broker=[f"kafka://{server}" for server in settings.kafka_bootstrap.split(",")],
        store=settings.state_store,
        datadir=str(datadir),
        topic_partitions=settings.partitions,
        topic_replication_factor=settings.replication_factor,
        topic_disable_leader=True,
        # Bytes in, bytes out: we decode events ourselves (pydantic from JSON bytes). Set on
        # the app as well as the topics, since Faust falls back to the app's serializers.
        key_serializer="raw",
        value_serializer="raw",
        processing_guarantee="at_least_once",
        consumer_auto_offset_reset="earliest",
        broker_session_timeout=settings.session_timeout_s,
        broker_heartbeat_interval=settings.session_timeout_s / 4,
        producer_acks=-1,
        producer_max_request_size=settings.max_event_bytes * 2 + 64 * 1024,
        producer_linger=0.01,
        web_enabled=True,
        web_bind=settings.web_host,
        web_host=settings.web_host,
        web_port=settings.worker_web_port,
        web_in_thread=False,
    )
    families = {
        settings.topic_traces: EventFamily.TRACES,
        settings.topic_evaluations: EventFamily.EVALUATIONS,
        settings.topic_labels: EventFamily.LABELS,
    }
    inputs = app.topic(*families, schema=raw, partitions=settings.partitions)
    # No schema= here: a table declared with a Schema starves the agent of its events
    # (faust-streaming 0.15); the app-level raw serializers apply to the changelog.
    table = app.Table(
        TABLE_NAME, default=None, partitions=settings.partitions, key_type=bytes, value_type=bytes
    )
    registry = registry or CollectorRegistry()
    metrics = Metrics(registry)
    sink = Sink(
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
    processor = JoinProcessor(
        settings, FaustTable(table), KafkaEmitter(settings), metrics, families
    )

    # Faust has no type information, so its decorators are untyped for mypy.
    @app.agent(inputs, concurrency=1)  # type: ignore[untyped-decorator]
    async def join(stream: Any) -> None:  # step 1: decode, merge, emit; nothing else here
        async for batch in stream.take_events(
            settings.join_batch_size, within=settings.join_batch_window_s
        ):
            messages = [
                InMessage(
                    e.message.topic,
                    e.message.partition,
                    e.message.offset,
                    e.message.key,
                    e.message.value,
                    _timestamp_ms(e.message.timestamp),
                    e,
                )
                for e in batch
            ]
            await _process_until_done(processor, messages)

    @app.task  # type: ignore[untyped-decorator]
    async def keep_expiry_index() -> None:
        """Rebuild the expiry index after every rebalance, and now and then.

        A read-only scan without awaits, so it never interleaves with the agent, which
        alone writes the table.
        """
        generation, last = None, 0.0
        while not app.should_stop:
            await asyncio.sleep(2.0)
            due = time.monotonic() - last >= settings.expiry_scan_interval_s
            if _ready(app) and (app.consumer_generation_id != generation or due):
                generation, last = app.consumer_generation_id, time.monotonic()
                found = processor.rebuild_expiry(processor.table.items())
                log.info("expiry index rebuilt: %d states may expire", found)

    @app.task  # type: ignore[untyped-decorator]
    async def run_sink() -> None:
        """The sink stage, in the same process: its own consumer group on trajectories."""
        await sink.run(asyncio.Event())  # cancelled when the worker stops

    @app.timer(settings.compaction_interval_s)  # type: ignore[untyped-decorator]
    async def compact_corpora() -> None:
        """Compact what this worker writes; other workers may race, create-only decides."""
        for ref in sink.corpora_written():
            try:
                made = await compact(
                    sink.store, ref, writer=sink.writer, compression=settings.shard_compression
                )
                await expire(
                    sink.store, ref, retention_s=settings.shard_retention_s, now=time.time()
                )
            except StoreError as exc:
                log.error("compaction of %s failed, will retry: %s", ref.root, exc)
                continue
            if made is not None:
                sink.metrics.compactions.inc()
                log.info("%s: generation %d, %d records", ref.root, made.generation, made.records)

    @app.page("/healthz")  # type: ignore[untyped-decorator]
    async def healthz(web: Any, request: Any) -> Any:
        return web.json({"status": "ok"})

    @app.page("/readyz")  # type: ignore[untyped-decorator]
    async def readyz(web: Any, request: Any) -> Any:
        ready = _ready(app) and sink.assigned.is_set()
        return web.json({"ready": ready}, status=200 if ready else 503)

    @app.page("/metrics")  # type: ignore[untyped-decorator]
    async def metrics_page(web: Any, request: Any) -> Any:
        # aiohttp takes the charset separately from the media type.
        return web.bytes(generate_latest(metrics.registry), content_type="text/plain")

    return WorkerApp(app, processor, metrics, changelog_topic_name(settings), sink)


async def _process_until_done(processor: JoinProcessor, messages: list[InMessage]) -> None:
    """Retry a failed batch until it goes through, never letting Faust ack it unprocessed.

    Faust acks a batch's events when the agent's generator is closed, even by an exception,
    so a send timeout or a broker error would otherwise drop the batch. Processing again is
    safe: events already merged are duplicates that re-send the same revision.
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


def _timestamp_ms(value: float | None) -> int | None:
    return None if value is None else int(value * 1000)


def _ready(app: Any) -> bool:
    """Joined the group, assigned partitions, table recovered, not rebalancing."""
    try:
        assigned = app.assignor.assigned_actives()
        recovered = app.tables.recovery.completed.is_set()
    except AttributeError:  # before the consumer and tables exist
        return False
    return bool(assigned) and recovered and not app.rebalancing


def run_worker(settings: Settings) -> int:
    """Check the topics, then run the worker until SIGTERM/SIGINT; return the exit code."""
    import faust

    from rl_export.topics import check_partition_counts, ensure_service_topics, partition_counts

    async def check_topics() -> dict[str, int]:
        await ensure_service_topics(settings)
        return await partition_counts(settings.kafka_bootstrap, [changelog_topic_name(settings)])

    check_partition_counts(asyncio.run(check_topics()), settings.partitions)
    asyncio.set_event_loop(asyncio.new_event_loop())  # asyncio.run closed the previous one
    built = build_app(settings)
    worker = faust.Worker(built.app, loglevel=settings.log_level, quiet=True)
    try:
        worker.execute_from_commandline()  # returns only by raising SystemExit
    except SystemExit as exc:
        return int(exc.code or 0)
