"""Publishing label events: acks=all, and the API's 202 only once the broker acknowledged.

The same producer spreads the news of claims to the other web instances (:meth:`broadcast`).

One idempotent producer per web process (``make_producer``: the configured partitioner, so a
label meets its trace's other events in one partition). It is started when the instance has
checked its topics (:meth:`Publisher.warm`), else on first use, and again after a failure;
an event the broker does not acknowledge within ``web_publish_timeout_s`` is
:class:`~rl_export.web.errors.Unavailable` (503), and the caller retries: a label is never
acknowledged without being on the broker. A retry after a timeout may publish the label
twice (the first send can still land); the join keeps the latest of a labeler's labels, so
the second only replaces the first with the same rubric.

A label the broker's ACLs refuse is a 503 too, and the instance stops being ready
(:attr:`Publisher.refused`, named with the operation and the topic) until a check passes
again; news of a claim they refuse ends the instance (``on_refused``), as any other ACL it
lacks does.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable

from aiokafka import AIOKafkaProducer
from aiokafka.errors import KafkaError

from rl_export.kafka import access
from rl_export.kafka.access import Role
from rl_export.kafka.retrying import AUTHORIZATION_FAILED
from rl_export.labeling.claims import SlotEntry
from rl_export.model.errors import ConfigError, KafkaAccessError, RlExportError
from rl_export.runtime.metrics import WebMetrics
from rl_export.runtime.settings import Settings
from rl_export.stream.produce import make_producer
from rl_export.stream.topics import ensure_service_topics
from rl_export.web.errors import Unavailable
from rl_export.web.labels import LabelEvent, encode

log = logging.getLogger(__name__)


class Publisher:
    """Sends label events to the labels topic and waits for the acknowledgement."""

    def __init__(
        self, settings: Settings, metrics: WebMetrics,
        on_refused: Callable[[KafkaAccessError], object] = lambda exc: None,
    ) -> None:  # fmt: skip
        self.settings = settings
        self.metrics = metrics
        self.on_refused = on_refused
        self.refused: KafkaAccessError | None = None  # the labels topic's Write, refused
        self._producer: AIOKafkaProducer | None = None
        self._lock = asyncio.Lock()

    async def _ready(self, *, check_topics: bool = True) -> AIOKafkaProducer:
        async with self._lock:
            if self._producer is None:
                if check_topics:  # creates or checks the topics
                    await ensure_service_topics(self.settings, role=Role.WEB)
                # No linger: each label's 202 and each claim's answer wait for their one
                # record's acknowledgement (20 ms of lingering was two thirds of a claim's
                # time, measured by make bench-web with a broker).
                producer = make_producer(self.settings, linger_ms=0)
                try:
                    await producer.start()
                except BaseException:
                    await producer.stop()
                    raise
                self._producer = producer
            return self._producer

    async def warm(self) -> None:
        """Start the producer before the first label needs it (its connection and producer
        id: the first label on a new instance took 150-250 ms more); a broker that does not
        answer now is left to the first label, which tries again. Called once the instance
        has checked its topics, so they are not checked again here."""
        try:
            await asyncio.wait_for(
                self._ready(check_topics=False), self.settings.web_publish_timeout_s
            )
        except ConfigError:  # a refused login or TLS handshake: the caller ends the instance
            raise
        except (TimeoutError, KafkaError, RlExportError, OSError) as exc:
            # _ready stopped what it started; a producer a label started meanwhile stays.
            log.info("web: the label producer did not start yet (%s)", type(exc).__name__)

    async def _send(self, topic: str, value: bytes, key: bytes, within_s: float) -> None:
        async with asyncio.timeout(within_s):
            producer = await self._ready()
            sent = await producer.send(topic, value, key=key)
            await sent

    async def publish(self, event: LabelEvent) -> None:
        """Publish and wait for the broker's acknowledgement; Unavailable when it does not."""
        timeout = self.settings.web_publish_timeout_s
        try:
            await self._send(
                self.settings.topic_labels, encode(event), event.trace_id.encode(), timeout
            )
        except (TimeoutError, KafkaError, RlExportError, OSError) as exc:
            self.metrics.publish_failures.inc()
            await self._reset()
            if isinstance(exc, (*AUTHORIZATION_FAILED, KafkaAccessError)):
                self.refused = self._named(exc, self.settings.topic_labels)
                log.error("web: %s; not ready until a check passes", self.refused)
            why = f"no acknowledgement within {timeout:g} s" if isinstance(exc, TimeoutError) else (
                f"{type(exc).__name__}: {exc}")  # fmt: skip
            raise Unavailable(
                f"Kafka at {self.settings.kafka_bootstrap} did not acknowledge the "
                f"{event.event_type} event ({why}): it may not be recorded, retry (a repeated "
                "label replaces the earlier one)"
            ) from None
        self.metrics.published.labels(event.event_type).inc()

    async def broadcast(self, entry: SlotEntry) -> None:
        """Tell the other instances of a claim entry this one wrote (best effort: the store
        holds the claim, and an instance that misses the news only loses a race to it)."""
        try:
            await self._send(
                self.settings.topic_claims, entry.encode(), entry.trace_id.encode(),
                min(self.settings.web_publish_timeout_s, 2.0),
            )  # fmt: skip
        except (TimeoutError, KafkaError, RlExportError, OSError) as exc:
            log.warning("claims topic: the news of a claim was not sent (%s)", type(exc).__name__)
            await self._reset()
            if isinstance(exc, (*AUTHORIZATION_FAILED, KafkaAccessError)):
                self.on_refused(self._named(exc, self.settings.topic_claims))

    def _named(self, exc: Exception, topic: str) -> KafkaAccessError:
        """The refusal as the error naming the operation and the topic."""
        if isinstance(exc, KafkaAccessError):
            return exc
        uses = access.label_publisher(self.settings)
        named = access.refused(self.settings, Role.WEB, uses, exc, [topic])
        assert named is not None  # an authorization failure always is
        return named

    async def _reset(self) -> None:
        producer, self._producer = self._producer, None
        if producer is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(producer.stop(), 5)

    async def close(self) -> None:
        await self._reset()
