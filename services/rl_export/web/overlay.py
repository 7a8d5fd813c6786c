"""Read-your-writes for the Label queue: what labelers did that the corpora may not show yet.

A label travels broker -> join -> sink -> corpus -> index before the queue can see it: seconds
(the sink's shard age bound) plus the index's poll. So the web service remembers, per
(org, project, labeler, trace), the latest label action it knows of, and the queue query hides
traces labeled or skipped since and brings back those whose label was retracted since.

Two sources feed it: the instance that published an event notes it at once (before it answers
202), and every instance reads the labels topic (:class:`LabelsFollower`), so a labeler whose
next request lands on another instance behind a load balancer sees the same queue within that
instance's consumer lag (milliseconds), not the corpora's. An entry is dropped after
``web_overlay_ttl_s``: by then the corpora hold the event (or the worker is down, and the
queue shows what the corpora say). Pure but for the clock; the follower is the I/O.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime

from aiokafka import AIOKafkaConsumer
from aiokafka.errors import KafkaError
from pydantic import ValidationError

from rl_export.common.events import EVENT_ADAPTER, LabelRetracted, LabelSkipped, LabelSubmitted
from rl_export.common.settings import Settings

log = logging.getLogger(__name__)


@dataclass
class Known:
    """What is known of a labeler's actions on one trace: the latest label or retraction
    (the join's "latest": ``occurred_at`` then ``event_id``) and whether they skipped it
    (skips are for good)."""

    label: tuple[tuple[datetime, str], bool] | None = None  # (order, True: label, False: retract)
    skipped: bool = False
    noted_at: float = 0.0  # monotonic, of the latest note


class Overlay:
    """Per labeler, their recent label actions by trace (see the module)."""

    def __init__(self, ttl_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.ttl_s = ttl_s
        self.clock = clock
        self._known: dict[tuple[str, str, str], dict[str, Known]] = {}

    def note(self, event: LabelSubmitted | LabelSkipped | LabelRetracted) -> None:
        """Remember a label event (a repeated or older one changes nothing)."""
        per_trace = self._known.setdefault((event.org, event.project, event.labeler), {})
        known = per_trace.setdefault(event.trace_id, Known())
        known.noted_at = self.clock()
        if isinstance(event, LabelSkipped):
            known.skipped = True
            return
        order = event.order_key()
        if known.label is None or order > known.label[0]:
            known.label = (order, isinstance(event, LabelSubmitted))

    def ask(self, org: str, project: str, labeler: str) -> tuple[list[str], list[str]]:
        """(hidden, returned) trace ids for the labeler's queue: labeled or skipped since,
        and label retracted since (the query keeps out what the corpus says was skipped)."""
        per_trace = self._known.get((org, project, labeler))
        if not per_trace:
            return [], []
        self._drop_old(per_trace)
        hidden, returned = [], []
        for trace_id, known in per_trace.items():
            labeled = known.label is not None and known.label[1]
            if known.skipped or labeled:
                hidden.append(trace_id)
            elif known.label is not None:
                returned.append(trace_id)
        return hidden, returned

    def _drop_old(self, per_trace: dict[str, Known]) -> None:
        now = self.clock()
        for trace_id in [t for t, k in per_trace.items() if now - k.noted_at > self.ttl_s]:
            del per_trace[trace_id]

    def expire(self) -> None:
        """Drop every entry older than the TTL (called now and then)."""
        for key in list(self._known):
            self._drop_old(self._known[key])
            if not self._known[key]:
                del self._known[key]


class LabelsFollower:
    """Reads the labels topic from ``ttl`` ago on and notes every label event (module)."""

    def __init__(self, settings: Settings, overlay: Overlay) -> None:
        self.settings = settings
        self.overlay = overlay

    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            try:
                await self._consume(stop)
            except (KafkaError, OSError) as exc:
                log.warning("labels follower: %s; retrying in 5 s", exc)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), 5.0)

    async def _consume(self, stop: asyncio.Event) -> None:
        topic = self.settings.topic_labels
        # Without a group every partition of the topic is assigned to this consumer.
        consumer = AIOKafkaConsumer(
            topic,
            bootstrap_servers=self.settings.kafka_bootstrap,
            group_id=None,
            enable_auto_commit=False,
            auto_offset_reset="latest",
        )
        await consumer.start()
        try:
            for _ in range(100):
                if consumer.assignment():
                    break
                await asyncio.sleep(0.1)
            assigned = sorted(consumer.assignment(), key=lambda tp: tp.partition)
            if not assigned:
                raise KafkaError(f"no partition of {topic} was assigned (does it exist?)")
            # From one TTL ago: a new instance knows what the corpora may not show yet.
            since_ms = int((time.time() - self.overlay.ttl_s) * 1000)
            offsets = await consumer.offsets_for_times(dict.fromkeys(assigned, since_ms))
            for tp in assigned:
                found = offsets.get(tp)
                if found is None:
                    await consumer.seek_to_end(tp)
                else:
                    consumer.seek(tp, found.offset)
            while not stop.is_set():
                batches = await consumer.getmany(timeout_ms=500, max_records=1000)
                for records in batches.values():
                    for record in records:
                        self._note(record.value)
                self.overlay.expire()
        finally:
            await consumer.stop()

    def _note(self, value: bytes | None) -> None:
        if value is None:
            return
        try:
            event = EVENT_ADAPTER.validate_json(value)
        except ValidationError:
            return  # the worker dead-letters it; nothing for the queue
        if isinstance(event, LabelSubmitted | LabelSkipped | LabelRetracted):
            self.overlay.note(event)
