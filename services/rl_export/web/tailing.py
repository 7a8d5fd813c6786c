"""Reading a topic's every partition from a moment ago on, with no consumer group.

Each web instance keeps pictures of what other instances and labelers did that the
corpora may not show yet: the labels topic feeds the overlay (:mod:`rl_export.web.overlay`),
the claims topic the claim book (:mod:`rl_export.labeling.claims`) and the trajectories topic
the index's fresh lines (:mod:`rl_export.web.fresh`). A :class:`Tail`
assigns itself every partition of its client's topic (no group: each instance reads
everything), starts from ``lookback_s`` ago (``offsets_for_times``), hands each value to
``note``, calls ``tick`` after each fetch, and reconnects after any Kafka error but two:

- a refused TLS handshake or login, and a read the broker's ACLs refuse, end the process,
  naming what to fix (:func:`rl_export.kafka.access.refused`);
- a value ``note`` cannot take is skipped, logged (where, never what) and counted
  (``rl_export_web_tail_skipped_total``): no record stops a tail.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable

from aiokafka import AIOKafkaConsumer
from aiokafka.errors import KafkaError

from rl_export.kafka import access
from rl_export.kafka.access import Client, Role
from rl_export.kafka.client import KafkaConnection
from rl_export.kafka.retrying import AUTHORIZATION_FAILED
from rl_export.runtime.settings import Settings

log = logging.getLogger(__name__)


class Tail:
    """Follows one topic from ``lookback_s`` ago on (see the module)."""

    def __init__(
        self, settings: Settings, client: Client, *, lookback_s: float,
        note: Callable[[bytes | None], None], tick: Callable[[], object] = lambda: None,
        skipped: Callable[[], object] = lambda: None,
        committed_only: bool = False,
    ) -> None:  # fmt: skip
        self.settings = settings
        self.kafka = KafkaConnection.of(settings)
        self.client = client
        self.topic = client.reads[0]
        self.lookback_s = lookback_s
        self.note = note
        self.tick = tick
        self.skipped = skipped
        # A topic written in transactions (trajectories): an aborted one is never read.
        self.isolation = "read_committed" if committed_only else "read_uncommitted"

    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            try:
                await self._consume(stop)
            except AUTHORIZATION_FAILED as exc:
                raise access.refused(self.settings, Role.WEB, self.client, exc) or exc from None
            except (KafkaError, OSError) as exc:
                await self.kafka.check()  # a refused TLS handshake or login ends the process
                log.warning("following %s: %s; retrying in 5 s", self.topic, exc)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), 5.0)

    async def _consume(self, stop: asyncio.Event) -> None:
        # Without a group every partition of the topic is assigned to this consumer.
        consumer = AIOKafkaConsumer(
            self.topic,
            **self.kafka.aiokafka(),
            group_id=None,
            enable_auto_commit=False,
            auto_offset_reset="latest",
            isolation_level=self.isolation,
        )
        try:
            await consumer.start()
            for _ in range(100):
                if consumer.assignment():
                    break
                await asyncio.sleep(0.1)
            assigned = sorted(consumer.assignment(), key=lambda tp: tp.partition)
            if not assigned:
                raise KafkaError(f"no partition of {self.topic} was assigned (does it exist?)")
            # The ends first, then the first record since ``lookback_s`` ago; a partition
            # with none starts at the end read before: a record written meanwhile is read.
            # (A lazy seek_to_end resolved at the first fetch skipped a record written
            # between the two: a new trace the index never got.) Under read_committed the
            # end is the last stable offset, so an open transaction is read once committed.
            ends = await consumer.end_offsets(assigned)
            since_ms = int((time.time() - self.lookback_s) * 1000)
            offsets = await consumer.offsets_for_times(dict.fromkeys(assigned, since_ms))
            for tp in assigned:
                found = offsets.get(tp)
                consumer.seek(tp, ends[tp] if found is None else found.offset)
            while not stop.is_set():
                batches = await consumer.getmany(timeout_ms=500, max_records=1000)
                for records in batches.values():
                    for record in records:
                        try:
                            self.note(record.value)
                        except Exception as exc:  # a value nobody expected: never a stop
                            self.skipped()
                            log.error("%s-%d@%d: %s; skipped", record.topic, record.partition,
                                      record.offset, type(exc).__name__)  # fmt: skip
                self.tick()
        finally:
            await consumer.stop()
