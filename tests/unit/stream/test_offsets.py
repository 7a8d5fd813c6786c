"""Stable committed offsets: OffsetFetch v7's bytes, its answers, and the retries."""

from __future__ import annotations

from typing import Any

import pytest
from aiokafka import TopicPartition
from aiokafka.errors import GroupAuthorizationFailedError, KafkaConnectionError

from rl_export.stream.offsets import (
    UNSTABLE_OFFSET_COMMIT,
    OffsetFetchRequestV7,
    OffsetFetchResponseV7,
    StableOffsetFetch,
    UnstableOffsetsError,
    parse_offsets,
    stable_committed,
)

IN0, IN1, OTHER = TopicPartition("in", 0), TopicPartition("in", 1), TopicPartition("other", 0)


def test_the_request_is_offset_fetch_v7_with_require_stable() -> None:
    request = StableOffsetFetch("g", {"t": [0, 1]}).build(OffsetFetchRequestV7)
    assert request.build_request_header(7, "c").encode()[:4] == b"\x00\x09\x00\x07"  # key, v7
    # Compact strings and arrays carry length + 1; every struct ends in its tagged fields.
    assert request.encode() == (
        b"\x02g"  # group_id
        b"\x02"  # one topic
        b"\x02t"
        b"\x03"
        b"\x00\x00\x00\x00"
        b"\x00\x00\x00\x01"
        b"\x00"  # t: [0, 1], tags
        b"\x01"  # require_stable = true
        b"\x00"  # tags
    )


def answer(partitions: list[tuple[str, int, int, int]], error_code: int = 0) -> Any:
    """An OffsetFetch v7 response, through its bytes: (topic, partition, offset, error)."""
    by_topic: dict[str, list[Any]] = {}
    for topic, partition, offset, error in partitions:
        by_topic.setdefault(topic, []).append((partition, offset, -1, "", error, {}))
    topics = [(topic, parts, {}) for topic, parts in by_topic.items()]
    return OffsetFetchResponseV7.decode(OffsetFetchResponseV7(0, topics, error_code, {}).encode())


def test_an_answer_gives_offsets_none_where_nothing_is_committed_and_the_pending() -> None:
    response = answer([("in", 0, 42, 0), ("in", 1, -1, 0), ("other", 0, 7, UNSTABLE_OFFSET_COMMIT)])
    offsets, pending, error = parse_offsets(response, {IN0, IN1, OTHER})
    assert offsets == {IN0: 42, IN1: None}
    assert pending == {OTHER}
    assert error == 0


def test_an_answer_raises_the_brokers_error_of_a_partition() -> None:
    with pytest.raises(GroupAuthorizationFailedError):
        parse_offsets(answer([("in", 0, -1, 30)]), {IN0})


class FakeCoordinator:
    coordinator_id = 1

    def __init__(self) -> None:
        self.dead = 0

    async def ensure_coordinator_known(self) -> None:
        pass

    def coordinator_dead(self) -> None:
        self.dead += 1


class FakeClient:
    """Answers each send with the next of ``answers`` (an exception is raised)."""

    def __init__(self, answers: list[Any]) -> None:
        self.answers = answers
        self.asked: list[dict[str, list[int]]] = []

    async def send(self, node_id: int, request: StableOffsetFetch, **_: Any) -> Any:
        self.asked.append(request.partitions)
        reply = self.answers.pop(0)
        if isinstance(reply, BaseException):
            raise reply
        return reply


class FakeConsumer:
    def __init__(self, answers: list[Any]) -> None:
        self._client = FakeClient(answers)
        self._coordinator = FakeCoordinator()


async def test_pending_offsets_are_asked_again_until_they_are_applied() -> None:
    consumer = FakeConsumer([
        answer([("in", 0, 10, 0), ("in", 1, 5, UNSTABLE_OFFSET_COMMIT)]),
        answer([("in", 1, 5, UNSTABLE_OFFSET_COMMIT)]),
        answer([("in", 1, 9, 0)]),
    ])  # fmt: skip
    got = await stable_committed(consumer, "g", [IN0, IN1], backoff_s=0)  # type: ignore[arg-type]
    assert got == {IN0: 10, IN1: 9}
    # Only what was still pending is asked again.
    assert consumer._client.asked == [{"in": [0, 1]}, {"in": [1]}, {"in": [1]}]


async def test_a_moved_coordinator_or_a_lost_connection_is_found_again() -> None:
    consumer = FakeConsumer([
        answer([], error_code=16),  # not the coordinator
        KafkaConnectionError(),
        answer([], error_code=14),  # still loading the offsets
        answer([("in", 0, 3, 0)]),
    ])  # fmt: skip
    got = await stable_committed(consumer, "g", [IN0], backoff_s=0)  # type: ignore[arg-type]
    assert got == {IN0: 3}
    assert consumer._coordinator.dead == 2


async def test_offsets_pending_past_the_timeout_raise() -> None:
    pending = answer([("in", 0, 1, UNSTABLE_OFFSET_COMMIT)])
    consumer = FakeConsumer([pending] * 1000)
    with pytest.raises(UnstableOffsetsError, match="still pending"):
        await stable_committed(consumer, "g", [IN0], timeout_s=0.05, backoff_s=0.01)  # type: ignore[arg-type]


async def test_no_partitions_asks_nothing() -> None:
    consumer = FakeConsumer([])
    assert await stable_committed(consumer, "g", []) == {}  # type: ignore[arg-type]
