"""Kafka clients nobody here wrote, in and out: librdkafka producers and consumers.

AgentHub's services publish with whatever client their language has. librdkafka (and every
client built on it: confluent-kafka for Python, Go and .NET, node-rdkafka) hashes keys with
CRC32 by default, Sarama with FNV-1a, the Java-compatible clients with murmur2. The join
must take them all: events that arrive on another partition than their trace's are
forwarded there and joined, never dead-lettered. And other teams read ``trajectories``
with their own consumers: every value is one JSON object.
"""

from __future__ import annotations

import asyncio
import json
import random
import struct
import time
from typing import Any

import orjson
import pytest
from aiokafka import AIOKafkaProducer
from confluent_kafka import Consumer, KafkaError, Producer

from rl_export.corpora.store import open_store
from rl_export.local.broker import LocalKafka
from rl_export.local.synthetic import generate
from rl_export.model.events import FAMILY_OF_TYPE
from rl_export.model.partitioning import Partitioner, partition_for
from rl_export.runtime.settings import Settings
from rl_export.stream.produce import make_producer, topic_for
from rl_export.stream.topics import ensure_service_topics
from tests.integration.workers import (
    TopicReader,
    WorkerProcess,
    corpus_view,
    expected_corpora,
    publish,
)

TRACES = 40

# librdkafka's name for the partitioner whose keyed behaviour each of ours reproduces.
LIBRDKAFKA: dict[Partitioner, str] = {
    "murmur2": "murmur2_random",
    "crc32": "consistent_random",  # librdkafka's default
    "fnv1a": "fnv1a_random",  # Sarama-compatible
}


# The codec in the low three bits of a v2 record batch's attributes (KIP-98, KIP-110).
CODECS = {0: "none", 1: "gzip", 2: "snappy", 3: "lz4", 4: "zstd"}


def stored_codecs(kafka: LocalKafka, topic: str) -> set[str]:
    """The codecs of the data batches the broker stored for ``topic``, read from its log
    segments (commit markers, which are control batches, left out)."""
    codecs: set[str] = set()
    for folder in (kafka.data_dir / "logs").iterdir():
        if folder.name.rpartition("-")[0] != topic:
            continue
        for segment in folder.glob("*.log"):
            data, at = segment.read_bytes(), 0
            while at + 61 <= len(data):  # a batch's header is 61 bytes
                (length,) = struct.unpack_from(">i", data, at + 8)
                (attributes,) = struct.unpack_from(">h", data, at + 21)
                assert data[at + 16] == 2, "not a v2 record batch"
                if not attributes & 0x20:
                    codecs.add(CODECS[attributes & 0x07])
                at += 12 + length
    return codecs


def confluent_producer(settings: Settings, **config: Any) -> Producer:
    """confluent-kafka as a new user sets it up: the bootstrap address, nothing else."""
    return Producer({"bootstrap.servers": settings.kafka_bootstrap, **config})


def confluent_publish(settings: Settings, events: list[dict[str, Any]]) -> list[int]:
    """Publish with confluent-kafka's default configuration; return each event's partition."""
    producer = confluent_producer(settings)
    partitions = [-1] * len(events)
    errors: list[str] = []

    def delivered(index: int) -> Any:
        def callback(err: Any, msg: Any) -> None:  # reports come in completion order
            if err is not None:
                errors.append(str(err))
            else:
                partitions[index] = msg.partition()

        return callback

    for index, item in enumerate(events):
        topic = topic_for(settings, FAMILY_OF_TYPE[item["event_type"]])
        key = item["trace_id"].encode()
        producer.produce(topic, orjson.dumps(item), key=key, on_delivery=delivered(index))
        producer.poll(0)
    assert producer.flush(30) == 0
    assert errors == []
    return partitions


async def random_publish(settings: Settings, events: list[dict[str, Any]], seed: int) -> None:
    """A producer that keys events but picks partitions at random (ignores its keys)."""
    rng = random.Random(seed)
    producer = AIOKafkaProducer(bootstrap_servers=settings.kafka_bootstrap, linger_ms=5)
    await producer.start()
    try:
        futures = []
        for item in events:
            topic = topic_for(settings, FAMILY_OF_TYPE[item["event_type"]])
            partition = rng.randrange(settings.partitions)
            key = item["trace_id"].encode()
            sent = await producer.send(topic, orjson.dumps(item), key=key, partition=partition)
            futures.append(sent)
        for future in futures:
            await future
    finally:
        await producer.stop()


def renamed(events: list[dict[str, Any]], case: str) -> list[dict[str, Any]]:
    """The same events for another case: own trace ids, event ids and project."""
    return [
        e | {"trace_id": f"{case}-{e['trace_id']}", "event_id": f"{case}-{e['event_id']}",
             "project": f"bot-{case}"}
        for e in events
    ]  # fmt: skip


def misrouted(settings: Settings, events: list[dict[str, Any]], partitions: list[int]) -> int:
    """How many of the events arrived on another partition than the setting's hash says."""
    return sum(
        p != partition_for(e["trace_id"].encode(), settings.partitions, settings.partitioner)
        for e, p in zip(events, partitions, strict=True)
    )


async def wait_for_view(
    settings: Settings, cases: dict[str, list[dict[str, Any]]], timeout_s: float = 120.0
) -> dict[str, Any]:
    """Poll until each case's corpora equal the pure fold of its events; return the last view."""
    want = {case: expected_corpora(events) for case, events in cases.items()}
    store = open_store(settings.store_url)
    deadline = time.monotonic() + timeout_s
    got: dict[str, Any] = {}
    try:
        while time.monotonic() < deadline:
            got = {case: await corpus_view(store, "acme", f"bot-{case}") for case in cases}
            if got == want:
                break
            await asyncio.sleep(1.0)
    finally:
        await store.close()
    return got


def forwarded(worker: WorkerProcess) -> float:
    return sum(
        worker.metric("rl_export_join_forwarded_total", matches=m)
        for m in ("murmur2", "crc32", "fnv1a", "none")
    )


async def dead_letters(settings: Settings) -> list[Any]:
    reader = TopicReader(settings, settings.topic_dead_letter)
    return await reader.read_until(lambda _: False, timeout_s=3)


@pytest.mark.parametrize("ours", ["murmur2", "crc32", "fnv1a"])
async def test_each_partitioner_is_where_librdkafka_puts_the_key(
    settings: Settings, ours: Partitioner
) -> None:
    await ensure_service_topics(settings)
    keys = [f"tr-{n:05d}".encode() for n in range(120)]
    producer = confluent_producer(settings, partitioner=LIBRDKAFKA[ours])
    landed: dict[bytes, int] = {}

    def delivered(err: Any, msg: Any) -> None:
        assert err is None
        landed[msg.key()] = msg.partition()

    for key in keys:
        producer.produce(settings.topic_labels, b"{}", key=key, on_delivery=delivered)
    assert producer.flush(30) == 0
    assert landed == {k: partition_for(k, settings.partitions, ours) for k in keys}

    # Our own producers hash the same way when the setting says so.
    configured = settings.model_copy(update={"partitioner": ours})
    aio = make_producer(configured)
    await aio.start()
    try:
        for key in keys[:30]:
            meta = await (await aio.send(configured.topic_labels, b"{}", key=key))
            assert meta.partition == landed[key]
    finally:
        await aio.stop()


async def test_any_producer_reaches_the_corpora_and_any_consumer_reads_trajectories(
    settings: Settings, kafka: LocalKafka
) -> None:
    """confluent-kafka (CRC32), aiokafka (murmur2) and random partitions, one worker."""
    local = settings.model_copy(update={"shard_max_age_s": 0.5})
    base = generate(TRACES, seed=61, duplicate_rate=0.05)
    cases = {case: renamed(base, case) for case in ("confluent", "aiokafka", "random")}
    with WorkerProcess(local, "w1").start() as worker:
        landed = await asyncio.to_thread(confluent_publish, local, cases["confluent"])
        await publish(local, cases["aiokafka"])
        await random_publish(local, cases["random"], seed=62)
        got = await wait_for_view(local, cases)
        count = forwarded(worker)
    assert got == {case: expected_corpora(events) for case, events in cases.items()}
    assert await dead_letters(local) == []  # every event was valid: none is dead-lettered
    # Under murmur2, the confluent-kafka events that CRC32 put elsewhere were forwarded, and
    # random partitions were mostly wrong; every aiokafka event arrived where it belongs.
    assert misrouted(local, cases["confluent"], landed) > len(landed) / 2
    assert count >= misrouted(local, cases["confluent"], landed) + len(cases["random"]) / 2

    # Another team's librdkafka consumer reads every snapshot with a plain JSON parser. The
    # join writes in transactions, so the topic's end offsets also count commit markers:
    # read until every partition reports its end.
    consumer = Consumer(
        {"bootstrap.servers": local.kafka_bootstrap, "group.id": f"{local.app_id}-other-team",
         "auto.offset.reset": "earliest", "enable.auto.commit": False,
         "enable.partition.eof": True, "isolation.level": "read_committed"}
    )  # fmt: skip
    try:
        consumer.subscribe([local.topic_trajectories])
        values = []
        at_end: set[int] = set()
        deadline = time.monotonic() + 60
        while len(at_end) < local.partitions and time.monotonic() < deadline:
            message = await asyncio.to_thread(consumer.poll, 1.0)
            if message is None:
                continue
            if message.error() is None:
                values.append(json.loads(message.value()))
            elif message.error().code() == KafkaError._PARTITION_EOF:
                at_end.add(message.partition())
    finally:
        consumer.close()
    assert len(at_end) == local.partitions
    assert values
    live = [v for v in values if not v["deleted"]]
    assert all(isinstance(v["messages"], list) and v["messages"] for v in live)
    assert {v["trace_id"] for v in values} == {
        e["trace_id"] for events in cases.values() for e in events
        if e["event_type"] == "trace.completed"
    }  # fmt: skip
    # The join sent them compressed (RL_EXPORT_PRODUCER_COMPRESSION), and the broker kept
    # them so: librdkafka took each batch apart above, and the sink did for the corpora.
    assert stored_codecs(kafka, local.topic_trajectories) == {"snappy"}


async def test_with_crc32_configured_confluent_kafka_events_are_never_forwarded(
    settings: Settings,
) -> None:
    local = settings.model_copy(update={"shard_max_age_s": 0.5, "partitioner": "crc32"})
    events = renamed(generate(TRACES, seed=63, duplicate_rate=0.05), "confluent")
    with WorkerProcess(local, "w1").start() as worker:
        landed = await asyncio.to_thread(confluent_publish, local, events)
        got = await wait_for_view(local, {"confluent": events})
        count = forwarded(worker)
    assert misrouted(local, events, landed) == 0
    assert got == {"confluent": expected_corpora(events)}
    assert count == 0
    assert await dead_letters(local) == []
