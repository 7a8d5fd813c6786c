"""The change feed: a message on ``RL_EXPORT_TOPIC_COMMITS`` for every corpus commit.

DESIGN.md section 13; docs/guides/tables.md has the Airflow and Dagster sensors. A compacted
topic keyed by ``<org>/<project>/<corpus>``, one JSON value per commit::

    {"org", "project", "corpus", "kind": "commit" | "compaction",
     "position": {"generation": g | null, "chains": {"<topic>-<partition>": next offset}},
     "records", "new_records", "max_updated_at", "delta_version", "created_at"}

- ``kind: commit``: a chain commit of the sink. ``position.chains`` names its one chain and
  the offset after it (``generation`` is null: a chain does not know the latest
  compaction); ``records`` are the lines it committed (records and tombstones),
  ``new_records`` those of traces the corpus did not hold; ``delta_version`` is null (the
  sink writes no table version).
- ``kind: compaction``: a generation, with every chain's position it covers; ``records``
  its live records, ``new_records`` the rows its table write inserted, ``delta_version``
  the table's version that holds it (null when no table was written).

**At least once, not exactly once.** A commit is made in the object store and announced on
Kafka: two systems, no transaction spans both. So the sink announces after its commit
(step 3 (b) of :mod:`rl_export.corpora.sink`), and commits its Kafka offset (step 3 (c))
only once the broker has acknowledged every announcement made so far (:meth:`Feed.flush`;
one not acknowledged is sent again at the next flush). After a crash between the two, the
partition is read again from its group offset, and each chain writer, as it loads its
chain, announces again every commit whose offsets lie at or after the first record read
(:meth:`~rl_export.corpora.chain.ChainWriter.load`): none is lost, some come twice.
A consumer drops a repeat by its key and ``position`` (a chain's offsets only grow).
Compaction messages are sent after the generation and its table write, best effort: a
crash in between loses one, and the next generation's (whose position covers it) says more.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Mapping
from typing import Any

from aiokafka import AIOKafkaProducer
from aiokafka.errors import KafkaError

from rl_export.corpora.commits import Commit
from rl_export.corpora.compacted import Compaction
from rl_export.corpora.layout import CorpusRef
from rl_export.model.codec import dumps
from rl_export.runtime.metrics import SinkMetrics

log = logging.getLogger(__name__)


def feed_key(ref: CorpusRef) -> bytes:
    return ref.root.encode()


def commit_message(ref: CorpusRef, commit: Commit) -> dict[str, Any]:
    """The message of a chain commit."""
    return {
        "org": ref.org, "project": ref.project, "corpus": ref.corpus, "kind": "commit",
        "position": {"generation": None, "chains": {commit.stream: commit.last_offset + 1}},
        "records": commit.records,
        "new_records": commit.new_records if commit.new_records is not None else commit.records,
        "max_updated_at": commit.max_updated_at, "delta_version": None,
        "created_at": commit.created_at,
    }  # fmt: skip


def compaction_message(
    ref: CorpusRef, compaction: Compaction, delta_version: int | None, inserted: int | None
) -> dict[str, Any]:
    """The message of a compaction generation (``inserted``: rows its table write added;
    None without a table write: the records the generation gained over its base are not
    known then, and it says 0)."""
    return {
        "org": ref.org, "project": ref.project, "corpus": ref.corpus, "kind": "compaction",
        "position": {"generation": compaction.generation,
                     "chains": dict(sorted(compaction.positions.items()))},
        "records": compaction.records, "new_records": inserted or 0,
        "max_updated_at": None, "delta_version": delta_version,
        "created_at": compaction.created_at,
    }  # fmt: skip


class Feed:
    """Sends the feed's messages; remembers each until the broker acknowledges it."""

    def __init__(
        self,
        topic: str,
        producer: Callable[[], AIOKafkaProducer],
        metrics: SinkMetrics,
        timeout_s: float = 5.0,  # a flush waits this long for the broker, then keeps them
    ) -> None:
        self.topic = topic
        self._make = producer
        self.metrics = metrics
        self.timeout_s = timeout_s
        self._producer: AIOKafkaProducer | None = None
        # Messages not acknowledged yet, in the order made: (key, value, kind).
        self._waiting: list[tuple[bytes, bytes, str]] = []
        self._lock = asyncio.Lock()  # the sink's and compaction's flushes, one at a time

    def announce(self, ref: CorpusRef, message: Mapping[str, Any]) -> None:
        """Queue a message; :meth:`flush` sends it."""
        self._waiting.append((feed_key(ref), dumps(dict(message)), str(message["kind"])))

    @property
    def waiting(self) -> int:
        return len(self._waiting)

    async def flush(self) -> bool:
        """Send every queued message and wait for the broker; True when none is left.

        A message the broker did not take stays queued for the next flush (logged and
        counted); the producer is then made again.
        """
        async with self._lock:
            return await self._flush()

    async def _flush(self) -> bool:
        if not self._waiting:
            return True
        batch = list(self._waiting)
        try:
            async with asyncio.timeout(self.timeout_s):
                producer = await self._ready()
                sent = [await producer.send(self.topic, value, key=key)
                        for key, value, _ in batch]  # fmt: skip
                await asyncio.gather(*sent)
        except (TimeoutError, KafkaError, OSError) as exc:
            self.metrics.feed_errors.inc()
            log.warning(
                "change feed %s: %d message(s) not acknowledged (%s); sent again with the "
                "next commits", self.topic, len(batch), type(exc).__name__,
            )  # fmt: skip
            await self._reset()
            return False
        del self._waiting[: len(batch)]
        for _, _, kind in batch:
            self.metrics.feed_messages.labels(kind).inc()
        return not self._waiting

    async def _ready(self) -> AIOKafkaProducer:
        if self._producer is None:
            producer = self._make()
            try:
                await producer.start()
            except BaseException:
                with contextlib.suppress(Exception):
                    await producer.stop()
                raise
            self._producer = producer
        return self._producer

    async def _reset(self) -> None:
        """Stop the producer, whether or not the broker answers (within 5 s). Awaited
        directly, not as a task of its own: its ``stop`` starts (and marks it closed) even
        when this task is being cancelled."""
        producer, self._producer = self._producer, None
        if producer is None:
            return
        try:
            async with asyncio.timeout(5):
                await producer.stop()
        except (TimeoutError, KafkaError, OSError) as exc:
            log.warning("change feed: its producer stopped while Kafka was unreachable (%r)", exc)

    async def close(self) -> None:
        """Stop the producer. Messages not acknowledged yet are not tried again: the Kafka
        offsets did not pass their commits, which are announced again after a restart."""
        await self._reset()
