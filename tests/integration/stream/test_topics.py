"""Produce to and consume from the real local Kafka broker; topic creation and checks."""

from __future__ import annotations

import asyncio
from collections import defaultdict
from pathlib import Path

import orjson
import pytest
from aiokafka import AIOKafkaConsumer

from rl_export.local.synthetic import generate
from rl_export.model.codec import dumps_lines
from rl_export.model.errors import (
    BrokerUnavailableError,
    PartitionMismatchError,
    TopicMismatchError,
)
from rl_export.runtime.net import free_port
from rl_export.runtime.settings import Settings
from rl_export.stream.produce import produce_lines, read_lines
from rl_export.stream.topics import (
    TopicSpec,
    ensure_service_topics,
    ensure_topics,
    partition_counts,
    topic_specs,
)
from tests.harness.faults import CuttableProxy


async def consume_all(settings: Settings, topics: list[str], expected: int) -> list[object]:
    consumer = AIOKafkaConsumer(
        *topics,
        bootstrap_servers=settings.kafka_bootstrap,
        group_id=f"{settings.app_id}-reader",
        auto_offset_reset="earliest",
        enable_auto_commit=False,
    )
    await consumer.start()
    records: list[object] = []
    try:
        for _ in range(60):
            batch = await consumer.getmany(timeout_ms=500)
            for tp_records in batch.values():
                records.extend(tp_records)
            if len(records) >= expected:
                break
    finally:
        await consumer.stop()
    return records


async def test_topics_are_created_with_the_configured_partitions(settings: Settings) -> None:
    counts = await ensure_service_topics(settings)
    assert counts == dict.fromkeys(settings.all_topics, 4)
    # Idempotent: a second worker starting finds them and agrees.
    assert await ensure_service_topics(settings) == counts


async def test_differing_partition_counts_are_refused(settings: Settings) -> None:
    await ensure_topics(settings.kafka_bootstrap, [TopicSpec(settings.topic_labels, 2, {})])
    with pytest.raises(PartitionMismatchError) as info:
        await ensure_service_topics(settings)
    message = str(info.value)
    assert message.startswith("RL_EXPORT_PARTITIONS:")
    assert f"{settings.topic_labels} has 2" in message


async def test_managed_topics_are_only_verified_and_every_mismatch_is_listed(
    settings: Settings,
) -> None:
    managed = settings.model_copy(update={"create_topics": False})
    with pytest.raises(TopicMismatchError) as info:
        await ensure_service_topics(managed)
    message = str(info.value)
    assert message.startswith("RL_EXPORT_CREATE_TOPICS:")
    for topic in settings.all_topics:
        assert f"{topic} is missing" in message
    assert await partition_counts(settings.kafka_bootstrap, settings.all_topics) == {}

    # Made by someone else: one with another partition count, the changelog not compacted.
    others = [s for s in topic_specs(settings) if s.name != settings.topic_changelog]
    made = [TopicSpec(s.name, 2 if s.name == settings.topic_labels else s.partitions, {})
            for s in others]  # fmt: skip
    made.append(TopicSpec(settings.topic_changelog, settings.partitions, {}))
    for spec in made:  # one at a time: ensure_topics would refuse the mix of counts
        await ensure_topics(settings.kafka_bootstrap, [spec])
    with pytest.raises(TopicMismatchError) as info:
        await ensure_service_topics(managed)
    message = str(info.value)
    assert f"{settings.topic_labels} has 2 partitions, not 4" in message
    assert f"{settings.topic_changelog} has cleanup.policy=delete, not compact" in message
    assert "missing" not in message


async def test_managed_topics_made_right_pass(settings: Settings) -> None:
    await ensure_service_topics(settings)  # made as the service would make them
    managed = settings.model_copy(update={"create_topics": False})
    assert await ensure_service_topics(managed) == dict.fromkeys(settings.all_topics, 4)


async def test_produced_events_round_trip_and_meet_in_one_partition(
    settings: Settings, tmp_path: Path
) -> None:
    events = generate(30, seed=11, duplicate_rate=0)
    path = tmp_path / "events.jsonl"
    path.write_bytes(dumps_lines(events) + b"not json\n")
    report = await produce_lines(settings, read_lines([path]))
    assert report.published == len(events)
    assert len(report.skipped) == 1
    assert report.skipped[0].startswith(f"{path}:{len(events) + 1}: not valid JSON")

    records = await consume_all(settings, list(settings.input_topics), len(events))
    assert len(records) == len(events)
    partitions: dict[str, set[int]] = defaultdict(set)
    seen = []
    for record in records:
        value = orjson.loads(record.value)  # type: ignore[attr-defined]
        assert record.key == value["trace_id"].encode()  # type: ignore[attr-defined]
        partitions[value["trace_id"]].add(record.partition)  # type: ignore[attr-defined]
        seen.append(value)
    # Same key, same partition count, default partitioner: a trace's events share a partition.
    assert all(len(p) == 1 for p in partitions.values())
    assert sorted(seen, key=lambda e: e["event_id"]) == sorted(events, key=lambda e: e["event_id"])


async def test_an_unreachable_broker_is_reported_by_setting() -> None:
    with pytest.raises(BrokerUnavailableError, match=r"RL_EXPORT_KAFKA_BOOTSTRAP=127\.0\.0\.1:"):
        await partition_counts(f"127.0.0.1:{free_port()}", ["x"], timeout_s=3)


async def test_a_broker_that_answers_late_is_waited_for_when_asked(settings: Settings) -> None:
    """A worker started before its broker (``RL_EXPORT_KAFKA_WAIT_S``) waits; the command
    line's one-off commands (no wait) fail at once, with the setting's name."""
    host, port = settings.kafka_bootstrap.rsplit(":", 1)
    proxy = await CuttableProxy(host, int(port)).start()
    late = f"127.0.0.1:{proxy.port}"
    spec = [TopicSpec(settings.topic_traces, 2, {})]
    try:
        proxy.cut()  # every connection is reset, as by a broker not listening yet
        with pytest.raises(BrokerUnavailableError, match="RL_EXPORT_KAFKA_BOOTSTRAP"):
            await ensure_topics(late, spec, timeout_s=3)
        waiting = asyncio.create_task(ensure_topics(late, spec, timeout_s=3, wait_s=60))
        await asyncio.sleep(2.5)
        assert not waiting.done()
        refused = proxy.refused
        assert refused >= 2  # asked again while waiting
        proxy.restore()
        assert await asyncio.wait_for(waiting, 30) == {settings.topic_traces: 2}
    finally:
        await proxy.stop()


async def test_a_topic_that_takes_less_than_we_write_is_refused_in_both_modes(
    settings: Settings,
) -> None:
    """max.message.bytes is compared on every topic, created here or made by someone else:
    a dead-letter topic of 1 MiB would refuse a dead letter the join must write."""
    small = str(1024 * 1024)
    await ensure_topics(settings.kafka_bootstrap,
                        [TopicSpec(settings.topic_dead_letter, settings.partitions,
                                   {"max.message.bytes": small})])  # fmt: skip
    wanted = next(s for s in topic_specs(settings) if s.name == settings.topic_dead_letter)
    line = (f"{settings.topic_dead_letter} has max.message.bytes={small}, below the "
            f"{wanted.configs['max.message.bytes']} rl-export writes there")  # fmt: skip
    with pytest.raises(TopicMismatchError) as created:
        await ensure_service_topics(settings)
    assert created.value.setting == "RL_EXPORT_MAX_EVENT_BYTES"
    assert line in str(created.value)
    managed = settings.model_copy(update={"create_topics": False})
    with pytest.raises(TopicMismatchError) as verified:
        await ensure_service_topics(managed)
    assert verified.value.setting == "RL_EXPORT_CREATE_TOPICS"
    assert line in str(verified.value)
    # A smaller event limit asks less of it: the same topic is then enough.
    smaller = settings.model_copy(update={"max_event_bytes": 256 * 1024})
    assert await ensure_service_topics(smaller)
