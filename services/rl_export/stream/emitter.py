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

No record stops a partition. A dead letter the dead-letter topic refuses for its size (an
input topic that takes larger records than the dead-letter topic, or a topic changed while
the worker runs) fails its batch once; the batch is processed again, and that event goes as
a *dead-letter reference* instead: its source, size, reason and first bytes
(:func:`rl_export.stream.deadletters.dead_letter_reference`), counted in
``rl_export_dead_letter_references_total``. Only a failed send is looked at: an event's size
costs nothing on the way. A send the broker's ACLs refuse ends the process, naming the
operation and the topic (:func:`rl_export.kafka.access.refused`).
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
    MessageSizeTooLargeError,
    OutOfOrderSequenceNumber,
    ProducerFenced,
    RecordListTooLargeError,
)

from rl_export.kafka import access
from rl_export.kafka.access import Role
from rl_export.kafka.client import KafkaConnection
from rl_export.kafka.retrying import AUTHORIZATION_FAILED, stop_quietly
from rl_export.model.errors import KafkaSecurityError
from rl_export.model.events import EventRejection
from rl_export.model.snapshots import HEADER_EVENT_MS, Headers
from rl_export.runtime.metrics import Metrics
from rl_export.runtime.settings import Settings
from rl_export.stream.deadletters import (
    dead_letter_headers,
    dead_letter_reference,
    dead_letter_source,
)
from rl_export.stream.processor import InMessage
from rl_export.stream.statestore import ChangelogTable
from rl_export.stream.topics import dead_letter_max_bytes, topic_max_bytes

log = logging.getLogger(__name__)

Outbox = dict[tuple[str, int], list[tuple[bytes | None, bytes | None, Headers]]]
"""What one task sends, by topic partition, in order."""

HEADER_FORWARDED_FROM = "rl-export-forwarded-from"
"""Header of a forwarded input event: ``<topic>/<partition>/<offset>`` where it arrived."""

_FENCED = (ProducerFenced, InvalidProducerEpoch, InvalidProducerIdMapping, InvalidTxnState)
_TOO_LARGE = (MessageSizeTooLargeError, RecordListTooLargeError)

Sent = list[tuple[str, int, int, int, "asyncio.Future[Any]"]]
"""The producer batches of a flush: (topic, partition, first record's index in the outbox's
list for that topic partition, records, the batch's future)."""


class TaskLostError(Exception):
    """A task's producer was fenced: another member of the group owns the partition now."""

    def __init__(self, task: int) -> None:
        super().__init__(f"join partition {task} is owned by another member now")
        self.task = task


class FlushError(Exception):
    """Part of a batch was not committed.

    ``failed`` tasks rolled back and may be processed again; ``lost`` tasks belong to
    another member now and must be let go. The other tasks of the batch committed.
    ``retry_now``: the failure taught the emitter which dead letters go as references, so
    processing again at once goes further (no back-off).
    """

    def __init__(
        self, failed: set[int], lost: set[int], cause: BaseException | None,
        retry_now: bool = False,
    ) -> None:  # fmt: skip
        super().__init__(
            f"join partitions {sorted(failed)} rolled back, {sorted(lost)} lost"
            + (f": {cause!r}" if cause else "")
        )
        self.failed = failed
        self.lost = lost
        self.retry_now = retry_now


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

    def __init__(
        self, settings: Settings, table: ChangelogTable, metrics: Metrics | None = None
    ) -> None:
        self.settings = settings
        self.table = table
        self.metrics = metrics
        self.transactional = settings.processing_guarantee == "exactly_once"
        self._shared: AIOKafkaProducer | None = None  # at least once
        self._tasks: dict[int, AIOKafkaProducer] = {}  # exactly once: one producer per task
        self._out: dict[int, Outbox] = {}
        self.positions: dict[int, int] = {}
        self._paused = False
        # Events whose dead letter the dead-letter topic refused for its size, by where they
        # came from: sent as references when their batch is processed again.
        self.too_large: dict[tuple[str, int, int], str] = {}

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
            producer = self._producer()
            try:
                await producer.start()
            except BaseException:
                await producer.stop()  # never left unclosed
                raise
            self._shared = producer

    async def open_tasks(self, partitions: list[int]) -> None:
        """Start the transactional producers of newly assigned partitions (fencing zombies).

        Returns once Kafka has given each one its epoch, which it does only after it has
        completed or aborted any transaction an earlier producer of that id left open.
        """
        if not self.transactional:
            return
        new = {
            p: self._producer(
                transactional_id=access.transactional_id(self.settings, p),
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
        headers: Headers, *, task: int | None = None,
    ) -> None:  # fmt: skip
        if event_ms is not None:
            headers = [(HEADER_EVENT_MS, str(event_ms).encode()), *headers]
        # trajectories is co-partitioned with the inputs: the task's own partition (but for a
        # pair's snapshot, on its pair id's partition).
        self._queue(partition if task is None else task,
                    (self.settings.topic_trajectories, partition), key, value, headers)  # fmt: skip

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
        where = (self.settings.topic_dead_letter, task)
        refused = self.too_large.get((message.topic, message.partition, message.offset))
        if refused is not None:  # the topic took not its bytes: where it is, and what it was
            self._queue(task, where, *dead_letter_reference(message, rejection, refused))
            if self.metrics is not None:
                self.metrics.dead_letter_references.labels(rejection.reason.value).inc()
            return
        headers = dead_letter_headers(message, rejection)
        self._queue(task, where, message.key, message.value, headers)

    async def flush(self, consumed: Mapping[tuple[str, int], int]) -> None:
        """Send the batch; with exactly once, commit ``consumed`` (input offsets) with it.

        Raises :class:`FlushError` when some tasks did not commit.
        """
        for partition, changes in self.table.take_changes().items():
            for trace_key, state in changes.items():
                changelog = (self.settings.topic_changelog, partition)
                self._queue(partition, changelog, trace_key, state, [])
        out, self._out = self._out, {}
        marked = len(self.too_large)
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
            elif isinstance(result, asyncio.CancelledError | KafkaSecurityError):
                raise result  # a cancellation, or a missing ACL: no retry helps
            elif isinstance(result, BaseException):
                failed.add(task)
                cause = cause or result
        for task in set(tasks) - failed - lost:  # committed: their references went out
            self._forget_too_large(task)
        if failed or lost:
            raise FlushError(failed, lost, cause, retry_now=len(self.too_large) > marked)

    async def _commit(self, task: int, outbox: Outbox, offsets: dict[TopicPartition, int]) -> None:
        """One transaction: the task's records, its input offsets, the commit."""
        producer = self._tasks.get(task)
        if producer is None:
            raise TaskLostError(task)
        committing = renew = False
        try:
            await producer.begin_transaction()
            sent = await self._send(producer, outbox)
            waits: list[Any] = [future for *_, future in sent]
            if offsets:
                waits.append(producer.send_offsets_to_transaction(offsets, self.settings.app_id))
            results = await asyncio.gather(*waits, return_exceptions=True)
            failure = next((r for r in results if isinstance(r, BaseException)), None)
            if failure is not None:
                refused, renew = self._refused(outbox, sent, results)
                raise refused or failure
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
                _read_transaction_error(producer)
                await producer.abort_transaction()
            except Exception as abort_failure:  # a fatal state: the producer is unusable
                log.error("join partition %d: transaction failed (%r) and could not be "
                          "aborted (%r)", task, exc, abort_failure)  # fmt: skip
                raise TaskLostError(task) from exc
            if renew or isinstance(exc, OutOfOrderSequenceNumber):
                await self._renew(task)
            if isinstance(exc, AUTHORIZATION_FAILED):  # the topic's metadata, refused at send
                raise self._named(exc) from None
            raise
        self._note_positions(sent)

    async def _send(self, producer: AIOKafkaProducer, outbox: Outbox) -> Sent:
        """Queue the outbox as producer batches (see :data:`Sent`)."""
        sent: Sent = []
        for (topic, partition), messages in outbox.items():
            batch, first, count = producer.create_batch(), 0, 0
            for key, value, headers in messages:
                while batch.append(key=key, value=value, timestamp=None, headers=headers) is None:
                    if count == 0:
                        raise ValueError(f"a message for {topic} is larger than a batch")
                    future = await producer.send_batch(batch, topic, partition=partition)
                    sent.append((topic, partition, first, count, future))
                    batch, first, count = producer.create_batch(), first + count, 0
                count += 1
            if count:
                future = await producer.send_batch(batch, topic, partition=partition)
                sent.append((topic, partition, first, count, future))
        return sent

    def _refused(
        self, outbox: Outbox, sent: Sent, results: list[Any]
    ) -> tuple[KafkaSecurityError | None, bool]:
        """Why the broker refused part of a flush, when it tells us more than a retry would;
        and whether a batch was too large (then the producer is renewed: :meth:`_renew`).

        A dead-letter batch too large for its topic: its events are noted, and sent as
        references when the batch is processed again (the module's docstring); a topic the
        ACLs refuse: the error naming the operation, which ends the process. The results
        follow ``sent`` (and the offsets' result after them).
        """
        too_large = False
        for (topic, partition, first, count, _), result in zip(sent, results, strict=False):
            if isinstance(result, AUTHORIZATION_FAILED):
                uses = access.join_producer(self.settings)
                return access.refused(self.settings, Role.WORKER, uses, result, [topic]), False
            too_large |= isinstance(result, _TOO_LARGE)
            if isinstance(result, _TOO_LARGE) and topic == self.settings.topic_dead_letter:
                refused = outbox[(topic, partition)][first : first + count]
                for _key, _value, headers in refused:
                    source = dead_letter_source(headers)
                    if source is not None:
                        self.too_large[source] = type(result).__name__
                log.warning(
                    "%s-%d refused %d dead letter(s) of up to %d bytes (its max.message.bytes):"
                    " they go as references (source, size, reason, first bytes)", topic,
                    partition, count, max(len(value or b"") for _k, value, _h in refused),
                )  # fmt: skip
            elif isinstance(result, _TOO_LARGE):
                log.error("%s-%d refused a batch of %d record(s) for its size: raise its "
                          "max.message.bytes", topic, partition, count)  # fmt: skip
        if len(results) > len(sent) and isinstance(results[-1], AUTHORIZATION_FAILED):
            uses = access.join_producer(self.settings)  # the offsets: the join's group
            return access.refused(self.settings, Role.WORKER, uses, results[-1]), False
        return None, too_large

    async def _renew(self, task: int) -> None:
        """Replace a task's producer by a new one of the same transactional id.

        aiokafka counts a refused batch's sequence numbers as sent: every later batch to
        that partition would be refused as OUT_OF_ORDER_SEQUENCE_NUMBER, for good. A new
        producer gets a new epoch of the id, whose sequences start from zero (what Java's
        producer does by itself, KIP-360). If it cannot start now, the task has no producer
        and is let go at its next commit (:class:`TaskLostError`).
        """
        old = self._tasks.pop(task, None)
        if old is not None:
            await asyncio.gather(old.stop(), return_exceptions=True)
        log.info("join partition %d: a new transactional producer after a refused batch", task)
        await self.open_tasks([task])

    def _named(self, exc: BaseException) -> BaseException:
        """An ACL refusal of the join's producers, as the error that names it."""
        uses = access.join_producer(self.settings)
        return access.refused(self.settings, Role.WORKER, uses, exc) or exc

    def _forget_too_large(self, task: int) -> None:
        if self.too_large:
            for source in [s for s in self.too_large if s[1] == task]:
                del self.too_large[source]

    def _note_positions(self, sent: Sent) -> None:
        changelog = self.settings.topic_changelog
        for topic, partition, _first, count, future in sent:
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
        try:
            sent = await self._send(self._shared, merged)
        except AUTHORIZATION_FAILED as exc:  # the topic's metadata, refused at send
            raise self._named(exc) from None
        results = await asyncio.gather(*(future for *_, future in sent), return_exceptions=True)
        failure = next((r for r in results if isinstance(r, BaseException)), None)
        if failure is not None:
            refused, renew = self._refused(merged, sent, results)
            if renew or isinstance(failure, OutOfOrderSequenceNumber):
                await self._renew_shared()
            raise refused or failure
        self.too_large.clear()
        self._note_positions(sent)

    async def _renew_shared(self) -> None:
        """At least once: a new idempotent producer after a refused batch (see :meth:`_renew`)."""
        old, self._shared = self._shared, None
        if old is not None:
            await asyncio.gather(old.stop(), return_exceptions=True)
        await self.start()

    async def close(self) -> None:
        await self.close_tasks(list(self._tasks))
        if self._shared is not None:
            await stop_quietly(self._shared.stop, "join producer", log)
            self._shared = None


def _read_transaction_error(producer: AIOKafkaProducer) -> None:
    """Read the error a failed transaction's waiter holds, before aborting it.

    aiokafka sets a refused batch's error on the transaction's waiter, and the abort replaces
    that waiter without reading it: asyncio then logs "Future exception was never retrieved"
    with a traceback when it is collected, on every refused batch.
    """
    manager = getattr(producer, "_txn_manager", None)
    waiter = getattr(manager, "_transaction_waiter", None)
    if isinstance(waiter, asyncio.Future) and waiter.done() and not waiter.cancelled():
        waiter.exception()
