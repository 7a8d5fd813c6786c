"""The join's Kafka emitter: changelog, snapshots, forwards and dead letters, per task.

A *task* is one partition number of the join: that partition of the three input topics, of
the table and of its changelog, as in Kafka Streams. Everything a batch produces for a
task (the changelog records of its table partition, its snapshots, the forwards and dead
letters of its input events) goes out in producer batches, one per topic partition.

With ``processing_guarantee=exactly_once`` (the default) every task has a transactional
producer of its own, ``transactional.id = <app id>-<partition>``: Kafka Streams'
exactly-once (v1), which fences by transactional id.

1. When the group assigns a partition, :meth:`KafkaEmitter.open_tasks` starts its producer.
   Kafka gives it the next epoch of that transactional id, which fences every earlier
   producer of the task (a paused "zombie" that still thinks it owns the partition) and
   completes or aborts the transaction such a producer left open. Only then does the loop
   read the committed input offsets, waiting until they are stable
   (:mod:`rl_export.stream.offsets`), and restore the table (:mod:`rl_export.stream.loop`),
   so it starts from what the last owner committed, no more and no less.
2. :meth:`KafkaEmitter.flush` runs one transaction per task per batch: the task's records,
   then its input offsets (``send_offsets_to_transaction``), then the commit. A
   read-committed consumer (the table's restore, the sink, the soak's checks) sees all of a
   batch or none of it; the offsets move if and only if the outputs are there.
3. A fenced producer means another member owns the task now: the task is *lost*
   (:class:`FlushError`); the loop drops the partition and rejoins the group.

With ``at_least_once`` one idempotent producer sends everything, :meth:`flush` waits for the
acknowledgements, and the loop commits the offsets after it: a crash between the two
re-sends, and a zombie can still write the changelog after its partitions moved.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
from collections.abc import Mapping
from typing import Any

from aiokafka import AIOKafkaProducer, TopicPartition
from aiokafka.errors import (
    InvalidProducerEpoch,
    InvalidProducerIdMapping,
    InvalidTxnState,
    ProducerFenced,
)

from rl_export.kafka.client import KafkaConnection
from rl_export.kafka.retrying import stop_quietly
from rl_export.model.events import EventRejection
from rl_export.model.records import HEADER_EVENT_MS, Headers
from rl_export.runtime.settings import Settings
from rl_export.stream.processor import InMessage, dead_letter_headers
from rl_export.stream.statestore import ChangelogTable
from rl_export.stream.topics import dead_letter_max_bytes, topic_max_bytes

log = logging.getLogger(__name__)

Outbox = dict[tuple[str, int], list[tuple[bytes | None, bytes | None, Headers]]]
"""What one task sends, by topic partition, in order."""

HEADER_FORWARDED_FROM = "rl-export-forwarded-from"
"""Header of a forwarded input event: ``<topic>/<partition>/<offset>`` where it arrived."""

_FENCED = (ProducerFenced, InvalidProducerEpoch, InvalidProducerIdMapping, InvalidTxnState)


class TaskLostError(Exception):
    """A task's producer was fenced: another member of the group owns the partition now."""

    def __init__(self, task: int) -> None:
        super().__init__(f"join partition {task} is owned by another member now")
        self.task = task


class FlushError(Exception):
    """Part of a batch was not committed.

    ``failed`` tasks rolled back and may be processed again; ``lost`` tasks belong to
    another member now and must be let go. The other tasks of the batch committed.
    """

    def __init__(self, failed: set[int], lost: set[int], cause: BaseException | None) -> None:
        super().__init__(
            f"join partitions {sorted(failed)} rolled back, {sorted(lost)} lost"
            + (f": {cause!r}" if cause else "")
        )
        self.failed = failed
        self.lost = lost


def producer_limits(settings: Settings) -> dict[str, int]:
    """The join producer's batch and request sizes.

    A batch never exceeds what the topics take (``max.message.bytes``, checked per batch by
    the broker), and a record larger than a batch goes in a batch of its own: a
    maximum-size dead letter, an input record's key and value plus our headers
    (:func:`rl_export.stream.topics.dead_letter_max_bytes`), must fit in a request.
    """
    batch = min(1024 * 1024, topic_max_bytes(settings))
    request = max(batch, dead_letter_max_bytes(settings)) + 64 * 1024
    return {"max_batch_size": batch, "max_request_size": request}


class KafkaEmitter:
    """:class:`~rl_export.stream.processor.Emitter` that also carries the table's changelog.

    Messages are buffered per task during a batch and go out at :meth:`flush`.
    ``positions`` holds, per changelog partition, the offset after the last changelog record
    that is committed (exactly once) or acknowledged (at least once).
    """

    def __init__(self, settings: Settings, table: ChangelogTable) -> None:
        self.settings = settings
        self.table = table
        self.transactional = settings.processing_guarantee == "exactly_once"
        self._shared: AIOKafkaProducer | None = None  # at least once
        self._tasks: dict[int, AIOKafkaProducer] = {}  # exactly once: one producer per task
        self._out: dict[int, Outbox] = {}
        self.positions: dict[int, int] = {}
        self._paused = False

    def _producer(self, **extra: Any) -> AIOKafkaProducer:
        return AIOKafkaProducer(
            **KafkaConnection.of(self.settings).aiokafka(),
            acks="all",
            enable_idempotence=True,
            compression_type=self.settings.producer_compression or None,
            **producer_limits(self.settings),
            **extra,
        )

    async def start(self) -> None:
        if not self.transactional:
            self._shared = self._producer()
            await self._shared.start()

    async def open_tasks(self, partitions: list[int]) -> None:
        """Start the transactional producers of newly assigned partitions (fencing zombies).

        Returns once Kafka has given each one its epoch, which it does only after it has
        completed or aborted any transaction an earlier producer of that id left open.
        """
        if not self.transactional:
            return
        new = {
            p: self._producer(
                transactional_id=f"{self.settings.app_id}-{p}",
                # Between two transactions the coordinator may still be writing the last
                # one's markers (CONCURRENT_TRANSACTIONS): retry after 20 ms, not 100.
                retry_backoff_ms=20,
            )
            for p in partitions
            if p not in self._tasks
        }
        results = await asyncio.gather(*(p.start() for p in new.values()), return_exceptions=True)
        failure = next((r for r in results if isinstance(r, BaseException)), None)
        if failure is not None:
            await asyncio.gather(*(p.stop() for p in new.values()), return_exceptions=True)
            raise failure
        self._tasks.update(new)

    async def close_tasks(self, partitions: set[int] | list[int]) -> None:
        """Stop the producers of partitions this member no longer owns; forget their output."""
        producers = [self._tasks.pop(p) for p in partitions if p in self._tasks]
        for p in partitions:
            self._out.pop(p, None)
        # A fenced producer may fail to stop cleanly; it is gone either way.
        await asyncio.gather(*(p.stop() for p in producers), return_exceptions=True)

    def _queue(self, task: int, where: tuple[str, int], key: bytes | None,
               value: bytes | None, headers: Headers) -> None:  # fmt: skip
        """Queue a record for ``where`` (topic, partition), sent by ``task``'s producer."""
        self._out.setdefault(task, {}).setdefault(where, []).append((key, value, headers))

    async def snapshot(
        self, key: bytes, value: bytes, event_ms: int | None, partition: int,
        headers: Headers,
    ) -> None:  # fmt: skip
        if event_ms is not None:
            headers = [(HEADER_EVENT_MS, str(event_ms).encode()), *headers]
        # trajectories is co-partitioned with the inputs: the task's own partition.
        self._queue(partition, (self.settings.topic_trajectories, partition), key, value, headers)

    async def forward(self, message: InMessage, key: bytes, partition: int) -> None:
        """Send an input event on to its trace's partition, its value and headers unchanged.

        Keyed by the trace_id (a producer that sent no key gets one), with a header saying
        where it arrived. Sent by the task the event arrived on, in the batch's flush, so it
        is committed with the offset that covered its first copy.
        """
        origin = f"{message.topic}/{message.partition}/{message.offset}".encode()
        headers = [*message.headers, (HEADER_FORWARDED_FROM, origin)]
        self._queue(message.partition, (message.topic, partition), key, message.value, headers)

    async def dead_letter(self, message: InMessage, rejection: EventRejection) -> None:
        task = max(message.partition, 0)
        self._queue(
            task, (self.settings.topic_dead_letter, task), message.key, message.value,
            dead_letter_headers(message, rejection),
        )  # fmt: skip

    async def flush(self, consumed: Mapping[tuple[str, int], int]) -> None:
        """Send the batch; with exactly once, commit ``consumed`` (input offsets) with it.

        Raises :class:`FlushError` when some tasks did not commit.
        """
        for partition, changes in self.table.take_changes().items():
            for trace_key, state in changes.items():
                changelog = (self.settings.topic_changelog, partition)
                self._queue(partition, changelog, trace_key, state, [])
        out, self._out = self._out, {}
        if out and self.settings.crash_at == "join_pause_before_send" and not self._paused:
            self._paused = True  # fault injection: a zombie with a batch in hand
            log.warning("fault injection: pausing before sending a batch (SIGSTOP)")
            os.kill(os.getpid(), signal.SIGSTOP)
        if not self.transactional:
            await self._send_all(out)
            return
        offsets: dict[int, dict[TopicPartition, int]] = {}
        for (topic, partition), offset in consumed.items():
            if partition >= 0:
                offsets.setdefault(partition, {})[TopicPartition(topic, partition)] = offset
        tasks = sorted(set(out) | set(offsets))
        results = await asyncio.gather(
            *(self._commit(t, out.get(t, {}), offsets.get(t, {})) for t in tasks),
            return_exceptions=True,
        )
        failed: set[int] = set()
        lost: set[int] = set()
        cause: BaseException | None = None
        for task, result in zip(tasks, results, strict=True):
            if isinstance(result, TaskLostError):
                lost.add(task)
            elif isinstance(result, asyncio.CancelledError):
                raise result
            elif isinstance(result, BaseException):
                failed.add(task)
                cause = cause or result
        if failed or lost:
            raise FlushError(failed, lost, cause)

    async def _commit(self, task: int, outbox: Outbox, offsets: dict[TopicPartition, int]) -> None:
        """One transaction: the task's records, its input offsets, the commit."""
        producer = self._tasks.get(task)
        if producer is None:
            raise TaskLostError(task)
        committing = False
        try:
            await producer.begin_transaction()
            sent = await self._send(producer, outbox)
            waits: list[Any] = [future for *_, future in sent]
            if offsets:
                waits.append(producer.send_offsets_to_transaction(offsets, self.settings.app_id))
            results = await asyncio.gather(*waits, return_exceptions=True)
            failure = next((r for r in results if isinstance(r, BaseException)), None)
            if failure is not None:
                raise failure
            # Every record is acknowledged before the commit: a transaction never commits
            # without one of its records (aiokafka would commit past a failed send).
            committing = True
            await producer.commit_transaction()
        except _FENCED as exc:
            raise TaskLostError(task) from exc
        except Exception as exc:
            if committing:
                # The commit's outcome is unknown (the broker went away mid-commit, say): it
                # may have committed. Processing the batch again would then commit it twice
                # (its dead letters twice). Let the partition go instead: its next owner's
                # producer, with the same transactional id, makes the coordinator finish or
                # abort this transaction before the input offsets are read again.
                log.warning(
                    "join partition %d: the transaction's commit failed (%r); its outcome "
                    "is unknown, so the partition is let go", task, exc,
                )  # fmt: skip
                raise TaskLostError(task) from exc
            try:
                await producer.abort_transaction()
            except Exception as abort_failure:  # a fatal state: the producer is unusable
                log.error("join partition %d: transaction failed (%r) and could not be "
                          "aborted (%r)", task, exc, abort_failure)  # fmt: skip
                raise TaskLostError(task) from exc
            raise
        self._note_positions(sent)

    async def _send(
        self, producer: AIOKafkaProducer, outbox: Outbox
    ) -> list[tuple[str, int, int, asyncio.Future[Any]]]:
        """Queue the outbox as producer batches; (topic, partition, records, future) each."""
        sent: list[tuple[str, int, int, asyncio.Future[Any]]] = []
        for (topic, partition), messages in outbox.items():
            batch, count = producer.create_batch(), 0
            for key, value, headers in messages:
                while batch.append(key=key, value=value, timestamp=None, headers=headers) is None:
                    if count == 0:
                        raise ValueError(f"a message for {topic} is larger than a batch")
                    future = await producer.send_batch(batch, topic, partition=partition)
                    sent.append((topic, partition, count, future))
                    batch, count = producer.create_batch(), 0
                count += 1
            if count:
                future = await producer.send_batch(batch, topic, partition=partition)
                sent.append((topic, partition, count, future))
        return sent

    def _note_positions(self, sent: list[tuple[str, int, int, asyncio.Future[Any]]]) -> None:
        changelog = self.settings.topic_changelog
        for topic, partition, count, future in sent:
            if topic == changelog:
                end = future.result().offset + count
                self.positions[partition] = max(self.positions.get(partition, 0), end)

    async def _send_all(self, out: dict[int, Outbox]) -> None:
        """At least once: every task's records through the shared producer; wait for acks."""
        merged: Outbox = {}
        for outbox in out.values():
            for where, messages in outbox.items():
                merged.setdefault(where, []).extend(messages)
        if not merged:
            return
        assert self._shared is not None, "start() the emitter first"
        sent = await self._send(self._shared, merged)
        results = await asyncio.gather(*(future for *_, future in sent), return_exceptions=True)
        failure = next((r for r in results if isinstance(r, BaseException)), None)
        if failure is not None:
            raise failure
        self._note_positions(sent)

    async def close(self) -> None:
        await self.close_tasks(list(self._tasks))
        if self._shared is not None:
            await stop_quietly(self._shared.stop, "join producer", log)
            self._shared = None
