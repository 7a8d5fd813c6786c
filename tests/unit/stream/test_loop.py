"""The join loop: batches topped up from several fetch responses while a backlog lasts; its stop."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

import pytest
from aiokafka import TopicPartition
from prometheus_client import CollectorRegistry

from rl_export.runtime.metrics import Metrics
from rl_export.runtime.settings import Settings
from rl_export.stream import loop
from rl_export.stream.loop import _BACKLOG_RECORDS, JoinWorker

A, B = TopicPartition("traces", 0), TopicPartition("labels", 0)


@dataclass
class Rec:
    offset: int
    value: bytes = b"x" * 100


def poll(tp: TopicPartition, first: int, count: int) -> dict[TopicPartition, list[Rec]]:
    return {tp: [Rec(first + i) for i in range(count)]}


class FakeConsumer:
    """Answers each getmany with the next of ``polls`` (then nothing); records the asks."""

    def __init__(self, polls: list[dict[TopicPartition, list[Rec]]]) -> None:
        self.polls = polls
        self.asked: list[tuple[int, int]] = []  # (timeout_ms, max_records)

    async def getmany(self, *, timeout_ms: int, max_records: int) -> Any:
        self.asked.append((timeout_ms, max_records))
        return self.polls.pop(0) if self.polls else {}


def worker(batch_size: int = 500, batch_bytes: int = 2 * 1024 * 1024) -> JoinWorker:
    settings = Settings(
        state_store="memory://", join_batch_size=batch_size, join_batch_bytes=batch_bytes
    )
    return JoinWorker(settings, Metrics(CollectorRegistry()))


def offsets(fetched: dict[TopicPartition, list[Rec]]) -> dict[TopicPartition, list[int]]:
    return {tp: [r.offset for r in records] for tp, records in fetched.items()}


async def test_a_backlog_fills_the_batch_from_several_responses_in_order() -> None:
    consumer = FakeConsumer([poll(A, 0, 200), poll(B, 0, 200), poll(A, 200, 200)])
    fetched = await worker(batch_size=500)._fetch(consumer)  # type: ignore[arg-type]
    assert offsets(fetched) == {A: list(range(400)), B: list(range(200))}
    # Each top-up asks for what the batch still has room for, and waits briefly.
    assert [ask[1] for ask in consumer.asked] == [500, 300, 100]
    assert all(ask[0] < 100 for ask in consumer.asked[1:])


async def test_live_traffic_is_processed_at_once() -> None:
    consumer = FakeConsumer([poll(A, 0, _BACKLOG_RECORDS - 1), poll(A, 63, 5)])
    fetched = await worker()._fetch(consumer)  # type: ignore[arg-type]
    assert offsets(fetched) == {A: list(range(_BACKLOG_RECORDS - 1))}
    assert len(consumer.asked) == 1


async def test_the_top_up_ends_when_the_backlog_does() -> None:
    consumer = FakeConsumer([poll(A, 0, 100), poll(A, 100, 10), poll(A, 110, 100)])
    fetched = await worker()._fetch(consumer)  # type: ignore[arg-type]
    assert offsets(fetched) == {A: list(range(110))}  # the small response ended it
    consumer = FakeConsumer([poll(A, 0, 100)])
    assert offsets(await worker()._fetch(consumer)) == {A: list(range(100))}  # type: ignore[arg-type]
    assert len(consumer.asked) == 2  # one empty top-up


async def test_nothing_fetched_is_an_empty_batch() -> None:
    consumer = FakeConsumer([])
    assert await worker()._fetch(consumer) == {}  # type: ignore[arg-type]
    assert len(consumer.asked) == 1


async def test_the_top_up_stops_at_its_byte_bound() -> None:
    big = 600 * 1024 // 200  # 200 records of this many bytes make 600 KiB a poll
    polls = [{A: [Rec(200 * n + i, b"x" * big) for i in range(200)]} for n in range(10)]
    consumer = FakeConsumer(polls)
    fetched = await worker(batch_size=5000)._fetch(consumer)  # type: ignore[arg-type]
    assert len(fetched[A]) == 800  # 4 polls reach 2 MiB; the 5th is never asked for
    assert len(consumer.asked) == 4


async def test_a_byte_bound_of_zero_takes_one_response() -> None:
    consumer = FakeConsumer([poll(A, 0, 200), poll(A, 200, 200)])
    fetched = await worker(batch_bytes=0)._fetch(consumer)  # type: ignore[arg-type]
    assert offsets(fetched) == {A: list(range(200))}
    assert len(consumer.asked) == 1


class ClosingConsumer:
    """A consumer whose ``stop`` lets a rebalance under way finish first, as aiokafka's
    does: its coordinator runs the listener's callbacks before it leaves the group (a
    sibling join process that stopped a moment earlier started that rebalance)."""

    def __init__(self, stop: asyncio.Event) -> None:
        self.stop_event = stop
        self.listener: Any = None

    def subscribe(self, topics: list[str], listener: Any) -> None:
        self.listener = listener

    async def start(self) -> None:
        pass

    async def getmany(self, *, timeout_ms: int, max_records: int) -> Any:
        self.stop_event.set()  # SIGTERM, while the group rebalances
        return {}

    def assignment(self) -> set[TopicPartition]:
        return set()

    async def stop(self) -> None:
        await self.listener.on_partitions_revoked(set())
        await self.listener.on_partitions_assigned(set())


async def test_a_stop_during_a_rebalance_lets_the_rebalance_finish(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The loop stops its consumer without holding the batch lock, which the rebalance's
    callbacks take: holding it, the stop waited for itself until the stop grace cut it
    (10 s, seen once in eight stops of a worker with two join processes)."""
    stop = asyncio.Event()
    join = worker()
    monkeypatch.setattr(loop, "AIOKafkaConsumer", lambda *a, **kw: ClosingConsumer(stop))

    async def nothing() -> None:
        pass

    monkeypatch.setattr(join.emitter, "start", nothing)
    monkeypatch.setattr(join.emitter, "close", nothing)
    await asyncio.wait_for(join.run(stop), timeout=5)
    assert stop.is_set()
