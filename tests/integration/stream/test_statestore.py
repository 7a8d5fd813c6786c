"""Restoring the join's partition stores from the real changelog topic.

Each test writes changelog records (a ``None`` value is a delete) to chosen partitions of
``settings.topic_changelog`` and checks that :func:`restore` leaves exactly the last value
per key, with ``changelog_next`` at the end of the partition.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from aiokafka import AIOKafkaProducer

from rl_export.runtime.settings import Settings
from rl_export.stream.statestore import MemoryPartition, PartitionStore, RocksPartition, restore
from rl_export.stream.topics import ensure_service_topics

Record = tuple[int, bytes, bytes | None]  # partition, key, value (None: delete)
MakeStore = Callable[[], PartitionStore]


async def produce(settings: Settings, records: list[Record]) -> None:
    producer = AIOKafkaProducer(bootstrap_servers=settings.kafka_bootstrap)
    await producer.start()
    try:
        for partition, key, value in records:
            await producer.send(settings.topic_changelog, value, key=key, partition=partition)
        await producer.flush()
    finally:
        await producer.stop()


@pytest.fixture
async def changelog(settings: Settings) -> Settings:
    await ensure_service_topics(settings)
    return settings


@pytest.fixture(params=["memory", "rocks"])
def make_store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[MakeStore]:
    made: list[PartitionStore] = []

    def make() -> PartitionStore:
        store: PartitionStore = (
            MemoryPartition()
            if request.param == "memory"
            else RocksPartition(tmp_path / f"partition-{len(made)}")
        )
        made.append(store)
        return store

    yield make
    for store in made:
        store.close()


async def test_restore_keeps_the_last_value_per_key(changelog: Settings) -> None:
    await produce(
        changelog,
        [
            (0, b"a", b"1"),
            (0, b"b", b"1"),
            (0, b"a", b"2"),
            (0, b"b", None),
            (0, b"c", b"1"),
            (2, b"a", b"x"),
        ],
    )
    stores = {p: MemoryPartition() for p in (0, 1, 2)}
    applied = await restore(changelog.kafka_bootstrap, changelog.topic_changelog, dict(stores))
    assert applied == 6
    assert stores[0].data == {b"a": b"2", b"c": b"1"}
    assert stores[1].data == {}
    assert stores[2].data == {b"a": b"x"}
    assert [stores[p].changelog_next for p in (0, 1, 2)] == [5, 0, 1]


async def test_a_second_restore_reads_only_new_records(changelog: Settings, tmp_path: Path) -> None:
    bootstrap, topic = changelog.kafka_bootstrap, changelog.topic_changelog
    store = RocksPartition(tmp_path / "partition-1")
    try:
        await produce(changelog, [(1, b"a", b"1"), (1, b"b", b"1"), (1, b"c", b"1")])
        assert await restore(bootstrap, topic, {1: store}) == 3
        assert store.changelog_next == 3

        await produce(changelog, [(1, b"a", b"2"), (1, b"c", None)])
        assert await restore(bootstrap, topic, {1: store}) == 2
        assert sorted(store.items()) == [(b"a", b"2"), (b"b", b"1")]
        assert store.changelog_next == 5
        assert await restore(bootstrap, topic, {1: store}) == 0
    finally:
        store.close()


async def test_a_store_ahead_of_the_changelog_is_rebuilt(
    changelog: Settings, make_store: MakeStore
) -> None:
    store = make_store()
    store.put(b"stale", b"from an older topic")
    store.set_changelog_next(100)
    await produce(changelog, [(3, b"a", b"1"), (3, b"b", b"2")])
    assert await restore(changelog.kafka_bootstrap, changelog.topic_changelog, {3: store}) == 2
    assert sorted(store.items()) == [(b"a", b"1"), (b"b", b"2")]
    assert store.changelog_next == 2


async def test_a_store_with_data_but_no_position_is_rebuilt(
    changelog: Settings, make_store: MakeStore
) -> None:
    store = make_store()
    store.put(b"stale", b"never acknowledged")
    await produce(changelog, [(0, b"a", b"1"), (0, b"a", b"2"), (0, b"b", b"3")])
    assert await restore(changelog.kafka_bootstrap, changelog.topic_changelog, {0: store}) == 3
    assert sorted(store.items()) == [(b"a", b"2"), (b"b", b"3")]
    assert store.changelog_next == 3
