"""The join's Kafka emitter: changelog, snapshots and dead letters in producer batches."""

from __future__ import annotations

import asyncio
from typing import Any

from aiokafka import AIOKafkaProducer

from rl_export.common.events import EventRejection
from rl_export.common.records import HEADER_EVENT_MS, Headers
from rl_export.common.settings import Settings
from rl_export.stream.processor import InMessage, dead_letter_headers
from rl_export.stream.statestore import ChangelogTable

HEADER_FORWARDED_FROM = "rl-export-forwarded-from"
"""Header of a forwarded input event: ``<topic>/<partition>/<offset>`` where it arrived."""

# --- Kafka ---------------------------------------------------------------------------------


class KafkaEmitter:
    """:class:`Emitter` that also carries the table's changelog; everything goes at ``flush``.

    Messages are buffered during a batch and sent with one producer batch per topic
    partition (``create_batch``/``send_batch``), then ``flush`` waits for every
    acknowledgement. The worker commits the input offsets only after that, so what a batch
    sent is durable before the batch counts as done. ``positions`` holds, per changelog
    partition, the offset after the last acknowledged changelog record.
    """

    def __init__(self, settings: Settings, table: ChangelogTable) -> None:
        self.settings = settings
        self.table = table
        self._producer: AIOKafkaProducer | None = None
        self._out: dict[tuple[str, int], list[tuple[bytes | None, bytes | None, Headers]]] = {}
        self.positions: dict[int, int] = {}

    async def start(self) -> None:
        self._producer = AIOKafkaProducer(
            bootstrap_servers=self.settings.kafka_bootstrap,
            acks="all",
            enable_idempotence=True,
            max_batch_size=1024 * 1024,
            max_request_size=self.settings.max_event_bytes * 2 + 64 * 1024,
            compression_type=self.settings.producer_compression or None,
        )
        await self._producer.start()

    def _queue(self, topic: str, partition: int, key: bytes | None, value: bytes | None,
               headers: Headers) -> None:  # fmt: skip
        self._out.setdefault((topic, partition), []).append((key, value, headers))

    async def snapshot(
        self, key: bytes, value: bytes, event_ms: int | None, partition: int,
        headers: Headers,
    ) -> None:  # fmt: skip
        if event_ms is not None:
            headers = [(HEADER_EVENT_MS, str(event_ms).encode()), *headers]
        self._queue(self.settings.topic_trajectories, partition, key, value, headers)

    async def forward(self, message: InMessage, key: bytes, partition: int) -> None:
        """Send an input event on to its trace's partition, its value and headers unchanged.

        Keyed by the trace_id (a producer that sent no key gets one), with a header saying
        where it arrived. Sent in the batch's flush, so it is acknowledged before the
        offsets that covered its first copy are committed.
        """
        origin = f"{message.topic}/{message.partition}/{message.offset}".encode()
        headers = [*message.headers, (HEADER_FORWARDED_FROM, origin)]
        self._queue(message.topic, partition, key, message.value, headers)

    async def dead_letter(self, message: InMessage, rejection: EventRejection) -> None:
        self._queue(
            self.settings.topic_dead_letter, max(message.partition, 0), message.key,
            message.value, dead_letter_headers(message, rejection),
        )  # fmt: skip

    async def flush(self) -> None:
        for partition, changes in self.table.take_changes().items():
            for trace_key, state in changes.items():
                self._queue(self.settings.topic_changelog, partition, trace_key, state, [])
        out, self._out = self._out, {}
        if not out:
            return
        assert self._producer is not None, "start() the emitter first"
        sent: list[tuple[str, int, int, asyncio.Future[Any]]] = []
        for (topic, partition), messages in out.items():
            batch, count = self._producer.create_batch(), 0
            for key, value, headers in messages:
                while batch.append(key=key, value=value, timestamp=None, headers=headers) is None:
                    if count == 0:
                        raise ValueError(f"a message for {topic} is larger than a batch")
                    sent.append(
                        (topic, partition, count, await self._send(batch, topic, partition))
                    )
                    batch, count = self._producer.create_batch(), 0
                count += 1
            if count:
                sent.append((topic, partition, count, await self._send(batch, topic, partition)))
        changelog = self.settings.topic_changelog
        for topic, partition, count, future in sent:
            metadata = await future
            if topic == changelog:
                end = metadata.offset + count
                self.positions[partition] = max(self.positions.get(partition, 0), end)

    async def _send(self, batch: Any, topic: str, partition: int) -> asyncio.Future[Any]:
        assert self._producer is not None
        future: asyncio.Future[Any] = await self._producer.send_batch(
            batch, topic, partition=partition
        )
        return future

    async def close(self) -> None:
        if self._producer is not None:
            await self._producer.stop()
            self._producer = None
