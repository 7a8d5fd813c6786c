"""Stable committed offsets against the real broker (KIP-447's ``require_stable``).

Offsets sent in a transaction are pending at the group coordinator for a moment after
``commit_transaction`` returns; a plain OffsetFetch then answers with the offsets from
before it, and a join that seeks there processes a committed batch again.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewTopic

from rl_export.local.broker import LocalKafka
from rl_export.stream.offsets import UnstableOffsetsError, stable_committed
from tests.integration.conftest import unique

pytestmark = pytest.mark.integration


@contextlib.asynccontextmanager
async def clients(
    kafka: LocalKafka,
) -> AsyncIterator[tuple[TopicPartition, str, AIOKafkaProducer, AIOKafkaConsumer]]:
    """A new one-partition topic and group, a transactional producer and a group consumer."""
    topic, group = unique("offsets"), unique("group")
    admin = AIOKafkaAdminClient(bootstrap_servers=kafka.bootstrap)
    await admin.start()
    try:
        await admin.create_topics([NewTopic(topic, 1, 1)])
    finally:
        await admin.close()
    producer = AIOKafkaProducer(bootstrap_servers=kafka.bootstrap, transactional_id=unique("tx"))
    consumer = AIOKafkaConsumer(bootstrap_servers=kafka.bootstrap, group_id=group)
    await producer.start()
    await consumer.start()
    try:
        yield TopicPartition(topic, 0), group, producer, consumer
    finally:
        await consumer.stop()
        await producer.stop()


async def test_offsets_read_stable_right_after_each_commit_are_the_committed_ones(
    kafka: LocalKafka,
) -> None:
    async with clients(kafka) as (tp, group, producer, consumer):
        assert await stable_committed(consumer, group, [tp]) == {tp: None}
        for offset in range(1, 31):
            async with producer.transaction():
                await producer.send_offsets_to_transaction({tp: offset}, group)
            assert await stable_committed(consumer, group, [tp]) == {tp: offset}


async def test_offsets_of_an_open_transaction_are_not_read_until_it_commits(
    kafka: LocalKafka,
) -> None:
    async with clients(kafka) as (tp, group, producer, consumer):
        async with producer.transaction():
            await producer.send_offsets_to_transaction({tp: 5}, group)
        await producer.begin_transaction()
        await producer.send_offsets_to_transaction({tp: 9}, group)
        assert await consumer.committed(tp) == 5  # the plain fetch answers from before
        with pytest.raises(UnstableOffsetsError):
            await stable_committed(consumer, group, [tp], timeout_s=1.0)
        await producer.commit_transaction()
        assert await stable_committed(consumer, group, [tp]) == {tp: 9}
