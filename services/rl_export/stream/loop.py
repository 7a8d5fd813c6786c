"""The join loop: a consumer group over the three input topics, the table and the emitter.

A worker runs this loop in ``join_processes`` child processes (:mod:`rl_export.worker.joins`),
each one member of the join's consumer group. How an event travels (the steps match
:meth:`JoinWorker._step` and :meth:`rl_export.stream.processor.JoinProcessor.process`):

1. :class:`JoinWorker`'s consumer (group ``app_id``, manual commits) takes a batch of
   events (up to ``join_batch_size``, waiting at most ``join_batch_window_s``; on a backlog,
   topped up from several fetch responses to ``join_batch_bytes``: :meth:`JoinWorker._fetch`)
   from the three input topics, which are co-partitioned by ``trace_id``, so one trace's
   events always reach the same member.
2. Each event is decoded from its bytes and checked (size, JSON, schema, topic, key,
   partition, clock). One that fails goes to the dead-letter topic with its original
   bytes, its source topic, partition and offset, and the reason in the headers.
3. The event is merged into its trace's state (:func:`rl_export.stream.join.merge`). States
   are read from the table once per trace per batch and kept in a working set.
4. After the batch, every touched state is written to the table once (RocksDB, and its
   changelog topic: :mod:`rl_export.stream.statestore`), and the last snapshot of each trace
   that emitted goes to the ``trajectories`` topic (revisions may skip numbers, which
   the join rules allow). States due to expire (orphans, tombstones) in the batch's partitions
   are deleted; the table keeps the index of what may expire beside the states, and a
   restored partition loads it (no state is read for it).
5. The emitter (:mod:`rl_export.stream.emitter`) sends changelog, snapshots, forwards and
   dead letters in producer batches, in one Kafka transaction per partition per batch that
   also commits that partition's input offsets: exactly once. A partition taken over is
   fenced first (its producer is started, which fences any earlier owner), then its offsets
   are read and its table restored (:meth:`JoinWorker._restore`). With
   ``processing_guarantee=at_least_once`` the batch is sent, acknowledged, then its offsets
   committed. A redelivered event (a producer's retry) is a duplicate: it re-sends the
   current snapshot with the same revision and rewrites the state; the sink drops the
   repeat.

Why not Faust's agents and tables: faust-streaming delivers events one at a time through its
streams, and an agent that did nothing but count topped out at about 4,700 events/s here,
half of what the worker must sustain. This loop does what the Faust table did (a RocksDB
store per partition, a compacted changelog, restore on assignment) with batches end to end.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Iterable
from typing import Any

from aiokafka import AIOKafkaConsumer, ConsumerRebalanceListener
from aiokafka.coordinator.assignors.range import RangePartitionAssignor
from aiokafka.errors import (
    CommitFailedError,
    IllegalStateError,
    KafkaError,
    TopicAuthorizationFailedError,
    TransactionalIdAuthorizationFailed,
)

from rl_export.kafka import access
from rl_export.kafka.access import Role
from rl_export.kafka.client import KafkaConnection
from rl_export.kafka.retrying import start_when_reachable, stop_quietly
from rl_export.model.errors import KafkaSecurityError
from rl_export.model.events import EventFamily
from rl_export.runtime.metrics import Metrics
from rl_export.runtime.settings import Settings
from rl_export.stream.emitter import FlushError, KafkaEmitter
from rl_export.stream.offsets import stable_committed
from rl_export.stream.processor import InMessage, JoinProcessor, expiry_mark_of
from rl_export.stream.rubriccheck import RubricSource
from rl_export.stream.statestore import ChangelogTable, PartitionStore, StoreLockedError, restore

log = logging.getLogger(__name__)

_BACKLOG_RECORDS = 64
"""A poll that brings this many records or more means a backlog: top the batch up (_fetch)."""
_TOP_UP_MS = 10
"""How long a topped-up batch waits for the next fetch response."""


class JoinWorker:
    """The join stage: a consumer group over the three input topics, the table, the emitter.

    One loop does everything, so nothing else touches the table: fetch a batch, take over
    newly assigned partitions, process, flush (which commits, exactly once), commit (at
    least once). A rebalance waits for the batch in hand (the lock); a batch fetched across
    a rebalance is put back and read again (:meth:`_unread`). Nothing waits while holding
    the lock for something another member must let go of (a sibling's store, a rebalance):
    see :meth:`_restore`.
    """

    def __init__(
        self, settings: Settings, metrics: Metrics, rubrics: RubricSource | None = None
    ) -> None:
        self.settings = settings
        self.table = ChangelogTable(
            settings.state_store,
            settings.data_dir / "worker" / settings.app_id,
            cache_bytes=settings.state_cache_mib * 1024 * 1024,
        )
        self.emitter = KafkaEmitter(settings, self.table, metrics)
        families = {
            settings.topic_traces: EventFamily.TRACES,
            settings.topic_evaluations: EventFamily.EVALUATIONS,
            settings.topic_labels: EventFamily.LABELS,
        }
        self.processor = JoinProcessor(
            settings, self.table, self.emitter, metrics, families, rubrics=rubrics
        )
        self.lock = asyncio.Lock()
        self.epoch = 0  # bumped by every rebalance
        self.to_restore: set[int] = set()  # assigned, not yet open and restored
        self.assigned: set[int] = set()
        self.revoking = False  # a revocation waits for the lock: cut a restore short
        self.ready = asyncio.Event()
        self._last_scan = time.monotonic()
        self._locked: dict[int, tuple[float, float]] = {}  # partition -> (since, last log)
        self._stop = asyncio.Event()

    @property
    def live(self) -> set[int]:
        """Partitions whose table is open and restored: their events are processed."""
        return self.assigned - self.to_restore

    async def run(self, stop: asyncio.Event) -> None:
        worker = self

        class Listener(ConsumerRebalanceListener):  # type: ignore[misc]
            async def on_partitions_revoked(self, revoked: Any) -> None:
                worker.revoking = True
                try:
                    async with worker.lock:  # the batch in hand finishes and commits first
                        worker.epoch += 1
                        worker.ready.clear()
                        await worker._drop({tp.partition for tp in revoked})
                finally:
                    worker.revoking = False

            async def on_partitions_assigned(self, assigned: Any) -> None:
                async with worker.lock:
                    worker.epoch += 1
                    partitions = {tp.partition for tp in assigned}
                    worker.to_restore |= partitions - worker.assigned
                    worker.assigned |= partitions
                    if not worker.to_restore:  # none new, or none at all: more members
                        worker.ready.set()  # than partitions is allowed, just idle
                    log.info("join assigned partitions %s", sorted(worker.assigned))

        self._stop = stop
        kafka = KafkaConnection.of(self.settings)
        uses = access.join_consumer(self.settings)
        try:
            started = await start_when_reachable(
                self.emitter.start, "join producer", stop, log, check=kafka.check
            )
        except KafkaError as exc:  # an idempotent producer refused (Kafka before 3.0)
            raise access.refused(self.settings, Role.WORKER, access.join_producer(
                self.settings), exc) or exc from None  # fmt: skip
        if not started:
            return
        session_ms = int(self.settings.session_timeout_s * 1000)
        consumer = AIOKafkaConsumer(
            **kafka.aiokafka(),
            group_id=uses.group,
            enable_auto_commit=False,
            auto_offset_reset="earliest",
            # Forwards are written in the join's transactions: never read an aborted one.
            isolation_level="read_committed",
            max_poll_records=self.settings.join_batch_size,
            max_partition_fetch_bytes=256 * 1024,
            fetch_max_bytes=4 * 1024 * 1024,  # what is fetched ahead, held in memory
            # Range, not aiokafka's default round robin: it gives each member the same
            # partition numbers of every input topic, so one trace's events meet in one
            # member. Round robin does that only by luck (when the members divide the
            # partitions), and with three members of eight partitions it does not.
            partition_assignment_strategy=(RangePartitionAssignor,),
            session_timeout_ms=session_ms,
            # A member learns of a rebalance at its next heartbeat: every second, not every
            # quarter session, so a worker's second join process joining costs one second.
            heartbeat_interval_ms=min(session_ms // 4, 1000),
            # How long the group waits for us to finish a batch and let go of our partitions
            # when it rebalances (aiokafka's default is the session timeout): a batch stuck
            # behind a broker restart must not get us thrown out of the group.
            rebalance_timeout_ms=max(60_000, session_ms),
            # Static membership (KIP-345): a restart within the session timeout gets the
            # same partitions back with no rebalance of the others.
            group_instance_id=None if self.settings.instance_id is None
            else f"{self.settings.instance_id}-join",
        )  # fmt: skip
        consumer.subscribe(list(uses.reads), listener=Listener())
        try:
            if not await start_when_reachable(
                consumer.start, "join consumer", stop, log, check=kafka.check
            ):
                return
            while not stop.is_set():
                await self._step(consumer)
        except KafkaError as exc:  # the broker's ACLs refused the consumer: name what
            raise access.refused(self.settings, Role.WORKER, uses, exc) or exc from None
        finally:
            # Not under the lock: aiokafka's stop lets a rebalance under way (a sibling that
            # stopped first) finish, and our callbacks take the lock.
            await stop_quietly(consumer.stop, "join consumer", log)
            async with self.lock:
                await self.emitter.close()
                self.table.close_all()

    async def _drop(self, partitions: set[int]) -> None:
        """Let go of partitions (revoked or lost): their stores, index and producers."""
        for partition in partitions:
            self.table.close(partition)
            self.processor.forget_partition(partition)
            self.assigned.discard(partition)
            self.to_restore.discard(partition)
            self._locked.pop(partition, None)
        await self.emitter.close_tasks(partitions)

    async def _fetch(self, consumer: AIOKafkaConsumer) -> dict[Any, list[Any]]:
        """A batch: up to ``join_batch_size`` events, topped up while a backlog lasts.

        One fetch response holds at most ``max_partition_fetch_bytes`` per partition (a few
        hundred events), and every partition's batch is one transaction: on a backlog, a
        batch of one response would pay a transaction per few hundred events. So while the
        last poll brought a backlog's worth (``_BACKLOG_RECORDS`` or more), the batch takes
        what the next responses bring, until it is full (``join_batch_size`` events or
        ``join_batch_bytes``), the window has passed, or none comes within ``_TOP_UP_MS``.
        Live traffic (a few records a poll) is processed at once. What a batch holds in
        memory (its states, snapshots and changelog records) grows with it: on the bench,
        the default 512 KiB costs about 20 MiB more peak RSS than one-response batches, and
        2 MiB 60-95 MiB more, for no difference in events/s that five rounds could show.
        """
        size = self.settings.join_batch_size
        window_s = self.settings.join_batch_window_s
        fetched: dict[Any, list[Any]] = await consumer.getmany(
            timeout_ms=int(window_s * 1000), max_records=size
        )
        count = last = sum(len(records) for records in fetched.values())
        if last < _BACKLOG_RECORDS:
            return fetched
        held = sum(len(r.value or b"") for records in fetched.values() for r in records)
        deadline = time.monotonic() + window_s
        bound = self.settings.join_batch_bytes
        while (last >= _BACKLOG_RECORDS and count < size and held < bound
               and time.monotonic() < deadline):  # fmt: skip
            more = await consumer.getmany(timeout_ms=_TOP_UP_MS, max_records=size - count)
            last = 0
            for tp, records in more.items():
                fetched.setdefault(tp, []).extend(records)
                last += len(records)
                held += sum(len(r.value or b"") for r in records)
            count += last
        return fetched

    async def _step(self, consumer: AIOKafkaConsumer) -> None:
        epoch = self.epoch
        fetched = await self._fetch(consumer)
        async with self.lock:
            taken: set[int] = set()
            if self.to_restore:
                taken = await self._restore(consumer)
            if epoch != self.epoch or taken:  # a rebalance came in while we fetched
                await self._unread(consumer, fetched, taken)
                return
            live = self.live
            messages = [
                InMessage(
                    tp.topic,
                    tp.partition,
                    r.offset,
                    r.key,
                    r.value,
                    r.timestamp,
                    None,
                    r.headers,
                )
                for tp, records in fetched.items()
                if tp.partition in live
                for r in records
            ]
            if messages:
                lost = await _process_until_done(self.processor, messages, self._stop)
                self._record_positions()
                if lost and self._stop.is_set():  # stopping with these not committed
                    await self._drop(lost)
                elif lost:
                    await self._lose(consumer, lost)
                if not self.emitter.transactional:  # exactly once: committed in the flush
                    await self._commit(consumer, fetched, lost)
            if time.monotonic() - self._last_scan >= self.settings.expiry_scan_interval_s:
                self._load_expiry(self.live)  # drops entries of states that moved on

    async def _commit(
        self, consumer: AIOKafkaConsumer, fetched: dict[Any, list[Any]], lost: set[int]
    ) -> None:
        offsets = {
            tp: records[-1].offset + 1
            for tp, records in fetched.items()
            if records and tp.partition in self.live and tp.partition not in lost
        }
        try:
            await consumer.commit(offsets)
        except (CommitFailedError, IllegalStateError) as exc:
            # The group moved on (we were too slow, or paused): the partitions'
            # new owner reads these events again; the join treats them as repeats.
            log.warning("join commit refused, a rebalance is under way: %s", exc)
        except KafkaError as exc:  # the broker is away: read again, as repeats
            log.warning("join commit failed: %r", exc)

    async def _lose(self, consumer: AIOKafkaConsumer, lost: set[int]) -> None:
        """Our producer of these partitions was fenced: another member owns them now.

        We were a zombie (paused past the session timeout, or cut off from the broker): drop
        them unwritten and rejoin the group, which may give them back, with a new producer.
        """
        log.warning("join partitions %s were taken over by another member; rejoining the group",
                    sorted(lost))  # fmt: skip
        await self._drop(lost)
        self.ready.clear()
        # aiokafka has no public call for this (Java's enforceRebalance).
        consumer._coordinator.request_rejoin()

    async def _unread(
        self, consumer: AIOKafkaConsumer, fetched: dict[Any, list[Any]], taken: set[int]
    ) -> None:
        """Put back a batch fetched across a rebalance: read it again, from its start.

        The records may come from before the rebalance or from the positions it reset;
        either way the consumer's position is now past them, and dropping them unseen would
        let the next commit skip them. Each partition we still own goes back to the first
        record of the batch, or to its committed offset if that is earlier (read stable: the
        last batch's transaction may not be applied yet, :mod:`rl_export.stream.offsets`;
        a stale offset would process that batch again). Partitions just
        ``taken`` over are already at the offsets their last owner committed.
        """
        starts = {
            tp: records[0].offset
            for tp, records in fetched.items()
            if records and tp in consumer.assignment() and tp.partition not in taken
        }
        try:
            committed = await stable_committed(consumer, self.settings.app_id, starts)
        except KafkaError:
            committed = {}
        for tp, start in starts.items():
            offset = committed.get(tp)
            consumer.seek(tp, start if offset is None else min(start, offset))

    async def _restore(self, consumer: AIOKafkaConsumer) -> set[int]:
        """Take over newly assigned partitions; return those taken over now.

        1. Start their transactional producers: this fences any earlier owner (a zombie)
           and completes or aborts what it left open (:mod:`rl_export.stream.emitter`).
        2. Open their stores. A store a sibling join process still has open (it has not
           let go of a partition the group moved to us) is retried at the next step, with
           the partition paused: waiting here would hold the lock, and with it our own
           revocation, which the sibling's progress may need (two siblings each waiting
           for a store the other holds, while the group waits for both).
        3. Restore the opened stores from the changelog (read committed), and seek their
           input partitions to the committed offsets, read after step 1 and stable (the
           transaction the fencing completed may not be applied yet at the group
           coordinator: :mod:`rl_export.stream.offsets`).
        """
        partitions = sorted(self.to_restore)
        try:
            await self.emitter.open_tasks(partitions)  # 1.
            stores: dict[int, PartitionStore] = {}
            for partition in partitions:  # 2.
                try:
                    stores[partition] = self.table.open(partition)
                except StoreLockedError:
                    self._wait_for_store(consumer, partition)
            if stores:  # 3.
                await restore(
                    KafkaConnection.of(self.settings), self.settings.topic_changelog, stores,
                    should_stop=lambda: self.revoking, mark_of=expiry_mark_of,
                )  # fmt: skip
                if self.revoking:  # cut short: the revocation closes them; restored next time
                    return set()
                await self._seek_committed(consumer, set(stores))
        except KafkaSecurityError:
            raise
        except (KafkaError, OSError) as exc:  # the broker is away: the next step tries again
            refused = access.refused(self.settings, Role.WORKER, self._uses(exc), exc)
            if refused is not None:  # an ACL is missing: no retry can help
                raise refused from None
            log.warning("taking over partitions %s failed (%r); trying again", partitions, exc)
            await asyncio.sleep(1.0)
            return set()
        self.to_restore -= set(stores)
        self._load_expiry(stores)
        if not self.to_restore:
            self.ready.set()
        return set(stores)

    def _uses(self, exc: BaseException) -> access.Client:
        """Which client a refusal during a take-over came from: the producers' start names
        transactional ids, the restore reads the changelog, the offsets are the group's."""
        if isinstance(exc, TransactionalIdAuthorizationFailed):
            return access.join_producer(self.settings)
        if isinstance(exc, TopicAuthorizationFailedError):
            return access.table_restore(self.settings)
        return access.join_consumer(self.settings)

    def _wait_for_store(self, consumer: AIOKafkaConsumer, partition: int) -> None:
        tps = [tp for tp in consumer.assignment() if tp.partition == partition]
        consumer.pause(*tps)
        now = time.monotonic()
        since, logged = self._locked.get(partition, (now, float("-inf")))
        if now - logged >= 10:
            log.info("partition %d's store is still open in a sibling join process; waiting "
                     "(%.0fs so far)", partition, now - since)  # fmt: skip
            logged = now
        self._locked[partition] = (since, logged)

    async def _seek_committed(self, consumer: AIOKafkaConsumer, partitions: set[int]) -> None:
        """Start the partitions' input at the committed offsets (the earliest if none)."""
        tps = [tp for tp in consumer.assignment() if tp.partition in partitions]
        committed = await stable_committed(consumer, self.settings.app_id, tps)
        fresh = []
        for tp in tps:
            offset = committed.get(tp)
            if offset is None:
                fresh.append(tp)
            else:
                consumer.seek(tp, offset)
        if fresh:
            await consumer.seek_to_beginning(*fresh)
        consumer.resume(*tps)
        for partition in partitions:
            self._locked.pop(partition, None)

    def _load_expiry(self, partitions: Iterable[int]) -> None:
        """The expiry index of these partitions, from their stores' (no state is read).

        A store written before it kept the index is scanned once, and its index written.
        """
        found = 0
        for partition in partitions:
            store = self.table.stores.get(partition)
            if store is None:
                continue
            if not store.indexed:
                started = time.monotonic()
                marks = self.processor.rebuild_expiry(store.items(), partition=partition)
                store.write({}, dict[bytes, bytes | None](marks))
                store.set_indexed()
                took = time.monotonic() - started
                log.info("partition %d: expiry index built once, from a scan of every state, "
                         "in %.1fs", partition, took)  # fmt: skip
            found += self.processor.load_expiry(store.marks(), partition)
        self._last_scan = time.monotonic()
        log.info("expiry index loaded: %d states may expire", found)

    def _record_positions(self) -> None:
        for partition, end in self.emitter.positions.items():
            store = self.table.stores.get(partition)
            if store is not None and end > store.changelog_next:
                store.set_changelog_next(end)
        self.emitter.positions.clear()


async def _process_until_done(
    processor: JoinProcessor, messages: list[InMessage], stop: asyncio.Event
) -> set[int]:
    """Retry a failed batch until it goes through; return the partitions lost meanwhile.

    Processing again is safe: events already merged are duplicates that re-send the same
    revision. When some partitions of the batch committed and others did not
    (:class:`FlushError`), only the others are processed again, and a partition another
    member took over (lost) is not processed again at all. Stopping ends the retries: what
    did not commit is read again by whoever owns the partitions next. A batch refused because
    dead letters were too large for their topic is processed again at once: those now go as
    references (each such refusal marks at least one more, so this ends).
    """
    delay = 0.5
    lost: set[int] = set()
    while messages:
        try:
            await processor.process(messages)
            return lost
        except (asyncio.CancelledError, KafkaSecurityError):  # a missing ACL: no retry helps
            raise
        except FlushError as exc:
            lost |= exc.lost
            messages = [m for m in messages if m.partition in exc.failed]
            if not messages:
                return lost
            if exc.retry_now:  # dead letters now known too large go as references: at once
                continue
            log.error("join batch: %s; retrying %d events in %.1fs", exc, len(messages), delay)
        except Exception:
            log.exception("join batch of %d events failed; retrying in %.1fs", len(messages), delay)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), delay)
        if stop.is_set():
            lost |= {m.partition for m in messages}  # not committed: let go of them as they are
            return lost
        delay = min(delay * 2, 30.0)
    return lost
