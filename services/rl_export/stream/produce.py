"""Publish event JSON Lines files to the input topics (``rl-export produce``).

Each line is sent unchanged as the Kafka value, keyed by its ``trace_id``, to the topic of its
``event_type``. A line that cannot be routed (not JSON, no known ``event_type``, no
``trace_id``) is reported and skipped; the worker validates everything else and dead-letters
what it cannot accept.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import orjson
from aiokafka import AIOKafkaProducer

from rl_export.kafka import access
from rl_export.kafka.access import Role
from rl_export.kafka.client import KafkaConnection
from rl_export.kafka.retrying import AUTHORIZATION_FAILED
from rl_export.model.events import FAMILY_OF_TYPE, EventFamily
from rl_export.model.partitioning import kafka_partitioner
from rl_export.runtime.settings import Settings
from rl_export.stream.topics import ensure_service_topics, topic_max_bytes


@dataclass
class ProduceReport:
    """What a produce run did."""

    published: int = 0
    skipped: list[str] = field(default_factory=list)  # "file:line: reason"


def topic_for(settings: Settings, family: EventFamily) -> str:
    """Return the configured topic of an event family."""
    return {
        EventFamily.TRACES: settings.topic_traces,
        EventFamily.EVALUATIONS: settings.topic_evaluations,
        EventFamily.LABELS: settings.topic_labels,
    }[family]


def route(line: bytes) -> tuple[EventFamily, bytes] | str:
    """Return (family, key) for an event line, or the reason it cannot be routed."""
    try:
        value = orjson.loads(line)
    except orjson.JSONDecodeError as exc:
        return f"not valid JSON ({exc})"
    if not isinstance(value, dict):
        return "not a JSON object"
    family = FAMILY_OF_TYPE.get(value.get("event_type"))  # type: ignore[arg-type]
    if family is None:
        return f"unknown event_type {value.get('event_type')!r}"
    trace_id = value.get("trace_id")
    if not isinstance(trace_id, str) or not trace_id:
        return "no trace_id"
    return family, trace_id.encode()


def read_lines(paths: Iterable[Path]) -> Iterator[tuple[str, bytes]]:
    """Yield ("file:line", bytes) for every non-blank line of the files."""
    for path in paths:
        with open(path, "rb") as fh:
            for number, raw in enumerate(fh, start=1):
                line = raw.rstrip(b"\r\n")
                if line.strip():
                    yield f"{path}:{number}", line


def make_producer(settings: Settings, *, linger_ms: int = 20) -> AIOKafkaProducer:
    """Return a producer that waits for the broker's acknowledgement and never duplicates.

    ``linger_ms`` is how long a record waits for others to share its batch: 20 ms suits
    producing many (the CLI, the dev stack); a service whose request waits for its one
    record's acknowledgement wants 0 (records that come while a request is in flight still
    share the next batch).
    """
    return AIOKafkaProducer(
        **KafkaConnection.of(settings).aiokafka(),
        partitioner=kafka_partitioner(settings.partitioner),
        acks="all",
        enable_idempotence=True,
        linger_ms=linger_ms,
        max_batch_size=256 * 1024,
        max_request_size=topic_max_bytes(settings),
    )


async def produce_lines(
    settings: Settings,
    lines: Iterable[tuple[str, bytes]],
    progress: Callable[[int], object] | None = None,
) -> ProduceReport:
    """Create topics if needed, then publish every routable line; wait for all acks."""
    await ensure_service_topics(settings, role=Role.PRODUCE)
    try:
        return await _produce(settings, lines, progress)
    except AUTHORIZATION_FAILED as exc:  # the ACLs changed since the check: name what
        uses = access.event_producer(settings)
        raise access.refused(settings, Role.PRODUCE, uses, exc) or exc from None


async def _produce(
    settings: Settings,
    lines: Iterable[tuple[str, bytes]],
    progress: Callable[[int], object] | None = None,
) -> ProduceReport:
    report = ProduceReport()
    producer = make_producer(settings)
    try:
        await producer.start()
        pending = []
        for where, line in lines:
            routed = route(line)
            if isinstance(routed, str):
                report.skipped.append(f"{where}: {routed}")
                continue
            family, key = routed
            pending.append(await producer.send(topic_for(settings, family), line, key=key))
            if len(pending) >= 5000:
                for fut in pending:
                    await fut
                report.published += len(pending)
                if progress:
                    progress(len(pending))
                pending.clear()
        for fut in pending:
            await fut
        report.published += len(pending)
        if progress:
            progress(len(pending))
    finally:
        await producer.stop()
    return report
