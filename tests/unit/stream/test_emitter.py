"""The join's emitter, exactly once: what a failed transaction means for its partition."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from aiokafka.errors import KafkaConnectionError

from rl_export.runtime.settings import Settings
from rl_export.stream.emitter import KafkaEmitter, TaskLostError
from rl_export.stream.statestore import ChangelogTable


class FakeBatch:
    def append(self, **record: Any) -> object:
        return object()


class FakeProducer:
    """Enough of AIOKafkaProducer's transactional calls; ``fail`` names the one that fails."""

    def __init__(self, fail: str) -> None:
        self.fail = fail
        self.calls: list[str] = []

    async def _call(self, name: str) -> None:
        self.calls.append(name)
        if name == self.fail:
            raise KafkaConnectionError(f"{name}: the broker went away")

    async def begin_transaction(self) -> None:
        await self._call("begin")

    def create_batch(self) -> FakeBatch:
        return FakeBatch()

    async def send_batch(self, batch: FakeBatch, topic: str, partition: int) -> asyncio.Future[Any]:
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        if self.fail == "send":
            future.set_exception(KafkaConnectionError("send: the broker went away"))
        else:
            future.set_result(type("Meta", (), {"offset": 0})())
        return future

    async def send_offsets_to_transaction(self, offsets: Any, group: str) -> None:
        await self._call("offsets")

    async def commit_transaction(self) -> None:
        await self._call("commit")

    async def abort_transaction(self) -> None:
        await self._call("abort")


def emitter_with(producer: FakeProducer) -> KafkaEmitter:
    settings = Settings(state_store="memory://")
    emitter = KafkaEmitter(settings, ChangelogTable("memory://", settings.data_dir))
    emitter._tasks[0] = producer  # type: ignore[assignment]
    return emitter


OUTBOX = {("trajectories", 0): [(b"k", b"v", [])]}


async def test_a_commit_whose_outcome_is_unknown_lets_the_partition_go() -> None:
    """It may have committed: processing the batch again could commit it twice."""
    producer = FakeProducer(fail="commit")
    with pytest.raises(TaskLostError):
        await emitter_with(producer)._commit(0, OUTBOX, {})  # type: ignore[arg-type]
    assert "abort" not in producer.calls


async def test_a_send_that_fails_before_the_commit_is_aborted_and_retried() -> None:
    """Nothing committed: the batch is rolled back and may be processed again."""
    producer = FakeProducer(fail="send")
    with pytest.raises(KafkaConnectionError):
        await emitter_with(producer)._commit(0, OUTBOX, {})  # type: ignore[arg-type]
    assert producer.calls[-1] == "abort"
    assert "commit" not in producer.calls
