"""No record stops a join partition: an event the dead-letter topic will not take whole goes
there as a reference, and the events behind it are joined.

The join's own emitter and processor and the retry loop of :mod:`rl_export.stream.loop` run
against a producer that commits what a broker would: a batch larger than its topic's
``max.message.bytes`` is refused (MESSAGE_TOO_LARGE), the transaction aborted, nothing of it
kept. The integration test does the same against Kafka
(tests/integration/stream/test_poison_pills.py).
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import orjson
import pytest
from aiokafka.errors import (
    MessageSizeTooLargeError,
    OutOfOrderSequenceNumber,
    TopicAuthorizationFailedError,
)
from hypothesis import HealthCheck, given
from hypothesis import settings as hypothesis_settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry

from rl_export.model.errors import KafkaAccessError
from rl_export.model.events import EventFamily
from rl_export.runtime.metrics import Metrics
from rl_export.runtime.settings import Settings
from rl_export.stream.deadletters import HEADER_REFERENCE, REFERENCE_HEAD_BYTES
from rl_export.stream.emitter import KafkaEmitter
from rl_export.stream.loop import _process_until_done
from rl_export.stream.processor import InMessage, JoinProcessor
from rl_export.stream.statestore import ChangelogTable
from tests.records import trace_events

Record = tuple[str, bytes | None, bytes | None, dict[str, bytes]]


class Broker:
    """What a broker commits per topic, refusing batches over a topic's ``max.message.bytes``
    (counted as the batch's key and value bytes) and what its ACLs do not allow."""

    def __init__(self, limits: dict[str, int], denied: frozenset[str] = frozenset()) -> None:
        self.limits = limits
        self.denied = denied
        self.committed: list[Record] = []
        self.aborted = 0


class Batch:
    """aiokafka's batch builder: full at ``cap`` bytes, but never refuses its first record."""

    def __init__(self, cap: int) -> None:
        self.cap = cap
        self.records: list[tuple[bytes | None, bytes | None, dict[str, bytes]]] = []
        self.size = 0

    def append(self, *, key: bytes | None, value: bytes | None, timestamp: Any,
               headers: list[tuple[str, bytes]]) -> object | None:  # fmt: skip
        size = len(key or b"") + len(value or b"")
        if self.records and self.size + size > self.cap:
            return None
        self.records.append((key, value, dict(headers)))
        self.size += size
        return object()


class TransactionalProducer:
    """A transactional producer as aiokafka's behaves: once a batch is refused, it has
    counted that batch's sequence numbers, and the broker refuses every later batch as out
    of order (a new producer of the same transactional id starts afresh)."""

    def __init__(self, broker: Broker, cap: int) -> None:
        self.broker = broker
        self.cap = cap
        self.pending: list[Record] = []
        self.out_of_order = False
        self.stopped = False

    async def stop(self) -> None:
        self.stopped = True

    async def begin_transaction(self) -> None:
        self.pending = []

    def create_batch(self) -> Batch:
        return Batch(self.cap)

    async def send_batch(self, batch: Batch, topic: str, partition: int) -> asyncio.Future[Any]:
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        if topic in self.broker.denied:  # aiokafka asks for the topic's metadata first
            raise TopicAuthorizationFailedError(topic)
        if self.out_of_order:
            future.set_exception(OutOfOrderSequenceNumber())
        elif batch.size > self.broker.limits.get(topic, 1 << 40):
            future.set_exception(MessageSizeTooLargeError())
            self.out_of_order = True
        else:
            self.pending += [(topic, k, v, h) for k, v, h in batch.records]
            future.set_result(type("Metadata", (), {"offset": 0})())
        return future

    async def send_offsets_to_transaction(self, offsets: Any, group: str) -> None:
        return None

    async def commit_transaction(self) -> None:
        self.broker.committed += self.pending

    async def abort_transaction(self) -> None:
        self.broker.aborted += 1
        self.pending = []


class Join:
    """A join of one partition over the fake broker."""

    def __init__(self, tmp: Path, broker: Broker, cap: int) -> None:
        self.settings = Settings(partitions=1, max_event_bytes=1024, state_store="memory://",
                                 data_dir=tmp)  # fmt: skip
        self.registry = CollectorRegistry()
        metrics = Metrics(self.registry)
        table = ChangelogTable("memory://", tmp)
        table.open(0)
        self.emitter = KafkaEmitter(self.settings, table, metrics)
        self.producers = [TransactionalProducer(broker, cap)]
        self.emitter._tasks[0] = self.producers[0]  # type: ignore[assignment]

        async def open_tasks(partitions: list[int]) -> None:  # a new epoch of the same id
            for partition in partitions:
                self.producers.append(TransactionalProducer(broker, cap))
                self.emitter._tasks[partition] = self.producers[-1]  # type: ignore[assignment]

        self.emitter.open_tasks = open_tasks  # type: ignore[method-assign]
        families = {self.settings.topic_traces: EventFamily.TRACES,
                    self.settings.topic_evaluations: EventFamily.EVALUATIONS,
                    self.settings.topic_labels: EventFamily.LABELS}  # fmt: skip
        self.processor = JoinProcessor(self.settings, table, self.emitter, metrics, families)
        self.attempts = 0
        process = self.processor.process

        async def counted(messages: list[InMessage], now: float | None = None) -> Any:
            self.attempts += 1
            return await process(messages, now)

        self.processor.process = counted  # type: ignore[method-assign]

    def messages(self, values: list[bytes]) -> list[InMessage]:
        topic = self.settings.topic_traces
        return [InMessage(topic, 0, 100 + n, b"tr-000", v) for n, v in enumerate(values)]

    async def run(self, values: list[bytes]) -> set[int]:
        return await _process_until_done(self.processor, self.messages(values), asyncio.Event())

    def metric(self, name: str, **labels: str) -> float:
        return self.registry.get_sample_value(name, labels) or 0.0


def valid_trace() -> bytes:
    return orjson.dumps(trace_events(0, score=0.9, passed=True)[0])


async def test_an_event_too_large_for_the_dead_letter_topic_goes_as_a_reference(
    tmp_path: Path,
) -> None:
    broker = Broker({Settings().topic_dead_letter: 4096})
    join = Join(tmp_path, broker, cap=2048)
    poison = b"{" + b"x" * 5000  # not JSON, and larger than the dead-letter topic takes
    assert await join.run([poison, valid_trace()]) == set()
    assert join.attempts == 2  # refused once, then its reference went
    assert [p.stopped for p in join.producers] == [True, False]  # renewed after the refusal
    dead = [r for r in broker.committed if r[0] == join.settings.topic_dead_letter]
    assert len(dead) == 1
    _, key, value, headers = dead[0]
    assert value == poison[:REFERENCE_HEAD_BYTES]
    assert key == b"tr-000"
    assert headers[HEADER_REFERENCE] == str(len(poison)).encode()
    assert headers["rl-export-reason"] == b"oversized"
    assert headers["rl-export-source-offset"] == b"100"
    assert b"MessageSizeTooLargeError" in headers["rl-export-detail"]
    snapshots = [r for r in broker.committed if r[0] == join.settings.topic_trajectories]
    assert [orjson.loads(v or b"")["trace_id"] for _, _, v, _ in snapshots] == ["tr-000"]
    assert join.metric("rl_export_dead_letter_references_total", reason="oversized") == 1
    assert join.metric("rl_export_dead_letters_total", reason="oversized") == 2  # both tries
    assert join.emitter.too_large == {}  # forgotten once committed


@hypothesis_settings(
    max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    sizes=st.lists(st.integers(2, 12_000), min_size=1, max_size=6),
    limit=st.integers(1500, 8000),
)
def test_every_rejected_event_goes_whole_or_as_a_reference(
    tmp_path: Path, sizes: list[int], limit: int
) -> None:
    """Batches are capped below the topic's limit, as the join's producer is below what the
    topic check asks of the dead-letter topic: only a record alone in its batch can be too
    large, and it goes whole exactly when it fits."""
    broker = Broker({Settings().topic_dead_letter: limit})
    join = Join(tmp_path, broker, cap=limit // 2)
    poisons = [b"[" * (n // 2) + b"x" * (n - n // 2) for n in sizes]  # not events
    assert asyncio.run(join.run([*poisons, valid_trace()])) == set()
    # One more try per dead letter too large (after one, the rest of its partition's
    # batches are refused out of order, unknown), and no back-off between them.
    assert join.attempts <= 1 + sum(len(p) + len(b"tr-000") > limit for p in poisons)
    dead = [r for r in broker.committed if r[0] == join.settings.topic_dead_letter]
    assert [int(h["rl-export-source-offset"]) for *_, h in dead] == list(
        range(100, 100 + len(sizes))
    )
    for poison, (_, _, value, headers) in zip(poisons, dead, strict=True):
        if len(poison) + len(b"tr-000") <= limit:
            assert value == poison
            assert HEADER_REFERENCE not in headers
        else:
            assert value == poison[:REFERENCE_HEAD_BYTES]
            assert headers[HEADER_REFERENCE] == str(len(poison)).encode()
    assert any(r[0] == join.settings.topic_trajectories for r in broker.committed)


async def test_a_dead_letter_the_acls_refuse_ends_the_join_naming_it(tmp_path: Path) -> None:
    settings = Settings()
    broker = Broker({}, denied=frozenset({settings.topic_dead_letter}))
    join = Join(tmp_path, broker, cap=2048)
    with pytest.raises(KafkaAccessError) as refused:
        await join.run([b"not json", valid_trace()])
    assert f"Write topic '{settings.topic_dead_letter}' (the join's producers)" in str(
        refused.value
    )
    assert join.attempts == 1  # no retry: it could never go through
    assert broker.committed == []
    assert broker.aborted == 1
