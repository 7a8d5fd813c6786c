"""The join loop: a consumer group over the three input topics, the table and the emitter.

A worker runs this loop in ``join_processes`` child processes (:mod:`rl_export.worker.joins`),
each one member of the join's consumer group. How an event travels (the steps match
:meth:`JoinWorker._step` and :meth:`rl_export.stream.processor.JoinProcessor.process`):

1. :class:`JoinWorker`'s consumer (group ``app_id``, manual commits) takes a batch of
   events (up to ``join_batch_size``, waiting at most ``join_batch_window_s``) from the three
   input topics, which are co-partitioned by ``trace_id``, so one trace's events always
   reach the same member.
2. Each event is decoded from its bytes and checked (size, JSON, schema, topic, key,
   partition, clock). One that fails goes to the dead-letter topic with its original
   bytes, its source topic, partition and offset, and the reason in the headers.
3. The event is merged into its trace's state (:func:`rl_export.stream.join.merge`). States
   are read from the table once per trace per batch and kept in a working set.
4. After the batch, every touched state is written to the table once (RocksDB, and its
   changelog topic: :mod:`rl_export.stream.statestore`), and the last snapshot of each trace
   that emitted goes to the ``trajectories`` topic (revisions may skip numbers, which
   DESIGN.md allows). States due to expire (orphans, tombstones) in the batch's partitions
   are deleted; the expiry index is rebuilt from the table whenever a partition is restored.
5. The emitter (:mod:`rl_export.stream.emitter`) sends changelog, snapshots and dead letters
   in producer batches and waits for their acknowledgement; only then are the batch's input
   offsets committed: at least once. A redelivered event is a duplicate: it re-sends the
   current snapshot with the same revision and rewrites the state (so a changelog write lost
   in a crash is made good); the sink drops the repeat.

Why not Faust's agents and tables: faust-streaming delivers events one at a time through its
streams, and an agent that did nothing but count topped out at about 4,700 events/s here,
half of what the worker must sustain. This loop does what the Faust table did (a RocksDB
store per partition, a compacted changelog, restore on assignment) with batches end to end.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterable
from typing import Any

from aiokafka import AIOKafkaConsumer, ConsumerRebalanceListener
from aiokafka.coordinator.assignors.range import RangePartitionAssignor
from aiokafka.errors import CommitFailedError, IllegalStateError, KafkaError

from rl_export.common.events import EventFamily
from rl_export.common.metrics import Metrics
from rl_export.common.settings import Settings
from rl_export.stream.emitter import KafkaEmitter
from rl_export.stream.processor import InMessage, JoinProcessor
from rl_export.stream.statestore import ChangelogTable, PartitionStore, StoreLockedError, restore

log = logging.getLogger(__name__)


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
            settings.state_store,
            settings.data_dir / "worker" / settings.app_id,
            cache_bytes=settings.state_cache_mib * 1024 * 1024,
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
            max_partition_fetch_bytes=256 * 1024,
            fetch_max_bytes=4 * 1024 * 1024,  # what is fetched ahead, held in memory
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
