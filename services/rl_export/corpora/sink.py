"""The sink: append join snapshots to corpora as exactly-once JSON Lines shards.

How a snapshot travels (per ``trajectories`` partition, the steps match the code):

0. When the partition is assigned, the chain of every corpus that has none on it yet is
   seeded from the seed corpus's history (``traces``; :mod:`rl_export.corpora.backfill`),
   in every project with history there, before any new event (:meth:`Sink._seed`): a
   corpus added to ``RL_EXPORT_CORPORA`` gets its history on a quiet stream too.
1. The consumer (group ``sink_group``, manual offset commits) hands each record to the
   :class:`~rl_export.corpora.partition.PartitionSink` of its partition.
2. For every corpus spec, the snapshot becomes that corpus's record (or tombstone, or
   nothing; redacted when the spec asks: :meth:`CorpusSpec.scrub`) and goes to the
   :class:`~rl_export.corpora.chain.ChainWriter` of ``(org, project, corpus, partition)``.
   A writer loads its chain head, and what the corpus holds for its partition's traces (on
   every chain: :func:`rl_export.corpora.chainstate.load_chain_state`), from the store when its
   first record arrives; records at offsets its chain already covers are skipped, and
   revisions the corpus already holds are dropped as repeats.
3. When the partition's pending records reach the record, byte or age bound (or the
   partitions together hold the sink's buffer bound, and this one holds most:
   :func:`flushed_early`), every writer with pending records commits, in this fixed order:
   (a) the data object, named by its content hash; (b) the commit, create-only, covering
   ``head`` .. the last offset read, then its message queued for the change feed
   (:mod:`rl_export.corpora.feed`); (c) once all writers of the partition committed and
   the broker acknowledged every queued message, the Kafka offset after that record. A
   flush the store refused is tried again one age bound later; while the partitions
   together hold more than the buffer bound after a flush (the store is refusing commits),
   the consumer is paused (:meth:`Sink._hold_back`).
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
import time
from collections.abc import Callable, Sequence
from typing import Any

from aiokafka import AIOKafkaConsumer, ConsumerRebalanceListener, TopicPartition
from aiokafka.errors import CommitFailedError, IllegalStateError, KafkaError
from aiokafka.structs import OffsetAndMetadata

from rl_export.corpora.chain import SinkConfig, writer_id
from rl_export.corpora.compacted import Compaction
from rl_export.corpora.feed import Feed, compaction_message
from rl_export.corpora.layout import CorpusRef
from rl_export.corpora.partition import PartitionSink
from rl_export.corpora.store import ObjectStore
from rl_export.corpora.table import TableCommit
from rl_export.formats.specs import DEFAULT_CORPORA, CorpusSpec
from rl_export.kafka.client import KafkaConnection
from rl_export.kafka.retrying import AUTHORIZATION_FAILED, start_when_reachable, stop_quietly
from rl_export.model.errors import StoreError
from rl_export.model.snapshots import HEADER_EVENT_MS, HEADER_RECORD_AT
from rl_export.runtime.metrics import SinkMetrics

log = logging.getLogger(__name__)


class Sink:
    """Consumes ``trajectories`` with a plain aiokafka consumer group and runs the steps."""

    def __init__(
        self,
        *,
        kafka: KafkaConnection,
        topic: str,
        group: str,
        store: ObjectStore,
        metrics: SinkMetrics,
        config: SinkConfig,
        specs: Sequence[CorpusSpec] = DEFAULT_CORPORA,
        session_timeout_s: float = 10.0,
        instance_id: str | None = None,
        on_refused: Callable[[BaseException], Exception | None] = lambda exc: None,
        feed: Feed | None = None,
    ) -> None:
        self.kafka = kafka
        self.feed = feed  # the change feed (None: no messages)
        self.topic = topic
        self.group = group
        self.store = store
        self.metrics = metrics
        self.config = config
        self.specs = specs
        self.session_timeout_s = session_timeout_s
        self.instance_id = instance_id  # a static member of the group (KIP-345) when set
        self.on_refused = on_refused  # the error naming what the broker's ACLs refused
        self.writer = writer_id()
        self.parts: dict[int, PartitionSink] = {}
        self.unseeded: set[int] = set()  # assigned partitions whose new chains are not seeded
        self.assigned = asyncio.Event()
        self.epoch = 0  # bumped by every rebalance
        self.paused = False  # reading paused: the buffer is over its bound (_hold_back)

    def corpora_written(self) -> list[CorpusRef]:
        """The corpora this sink has written to (for periodic compaction)."""
        refs = {w.ref for part in self.parts.values() for w in part.writers.values()}
        return sorted(refs, key=lambda r: r.root)

    def tail_commits(self) -> dict[CorpusRef, int]:
        """Per corpus this sink writes, the commits it made since :meth:`compacted` was last
        told of it, scaled to every partition from the ones it holds: an estimate of the
        corpus's tail, without listing a chain (compaction's schedule: worker/main.py)."""
        counts: dict[CorpusRef, int] = {}
        for part in self.parts.values():
            for writer in part.writers.values():
                counts[writer.ref] = counts.get(writer.ref, 0) + writer.commits
        share = self.config.partitions / max(1, len(self.parts))
        return {ref: round(n * share) for ref, n in counts.items()}

    def compacted(self, ref: CorpusRef) -> None:
        """The corpus was compacted (or found with nothing new): count its commits afresh."""
        for part in self.parts.values():
            for writer in part.writers.values():
                if writer.ref == ref:
                    writer.commits = 0

    def _part(self, partition: int) -> PartitionSink:
        part = self.parts.get(partition)
        if part is None:
            part = self.parts[partition] = PartitionSink(
                self.store, self.topic, partition, self.specs, self.config, self.metrics,
                self.writer, feed=self.feed,
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
                    sink.unseeded.discard(tp.partition)

            async def on_partitions_assigned(self, assigned: Any) -> None:
                sink.epoch += 1
                sink.unseeded.update(tp.partition for tp in assigned if tp.topic == sink.topic)
                sink.assigned.set()
                log.info("sink assigned partitions %s", sorted(tp.partition for tp in assigned))

        consumer = AIOKafkaConsumer(
            **self.kafka.aiokafka(),
            group_id=self.group,
            enable_auto_commit=False,
            auto_offset_reset="earliest",
            # The join writes snapshots in transactions: a fenced zombie's aborted ones
            # must never reach a corpus.
            isolation_level="read_committed",
            session_timeout_ms=int(self.session_timeout_s * 1000),
            group_instance_id=None if self.instance_id is None else f"{self.instance_id}-sink",
            heartbeat_interval_ms=min(int(self.session_timeout_s * 250), 1000),
            max_poll_records=5000,
            max_partition_fetch_bytes=512 * 1024,
            fetch_max_bytes=8 * 1024 * 1024,  # what is fetched ahead, held in memory
        )
        consumer.subscribe([self.topic], listener=Listener())
        try:
            if not await start_when_reachable(
                consumer.start, "sink consumer", stop, log, check=self.kafka.check
            ):
                return
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
                await self._seed(consumer, epoch)
                await self._flush_due(consumer)
        except AUTHORIZATION_FAILED as exc:  # the broker's ACLs refuse us: name what is missing
            raise self.on_refused(exc) or exc from None
        finally:
            try:  # the feed's producer first: its stop begins even if we are cancelled
                if self.feed is not None:
                    await self.feed.close()
            finally:
                await stop_quietly(consumer.stop, "sink consumer", log)

    async def announce_compaction(
        self, ref: CorpusRef, compaction: Compaction, table: TableCommit | None
    ) -> None:
        """Tell the change feed of a compaction generation (best effort: see the feed)."""
        if self.feed is None:
            return
        self.feed.announce(ref, compaction_message(
            ref, compaction, None if table is None else table.version,
            None if table is None else table.inserted,
        ))  # fmt: skip
        await self.feed.flush()

    async def _seed(self, consumer: AIOKafkaConsumer, epoch: int) -> None:
        """Step 0 for the partitions assigned since the last round: seed their new chains
        whether or not an event comes (a corpus added on a quiet stream gets its history)."""
        for partition in sorted(self.unseeded):
            tp = TopicPartition(self.topic, partition)
            if self.epoch != epoch or tp not in consumer.assignment():
                return  # a rebalance: the partitions assigned now say what to seed
            try:
                seeded = await self._part(partition).seed_new_chains()
            except StoreError as exc:
                await self._rewind(consumer, tp, exc)
                return  # tried again next round
            self.unseeded.discard(partition)
            if seeded:
                log.info("%s-%d: seeded %d new chain(s) on assignment", self.topic,
                         partition, len(seeded))  # fmt: skip

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
        aged = len(due)  # the early ones commit everything they hold
        due += early
        results = await asyncio.gather(
            *(part.flush(everything=n >= aged) for n, part in enumerate(due)),
            return_exceptions=True,
        )
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
        if self.feed is not None and not await self.feed.flush():
            return  # step 3 (c) waits for the feed: its messages go again at the next round
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
    request's copy of them. :func:`rl_export.runtime.gctune.tune_gc` runs the cycle
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
