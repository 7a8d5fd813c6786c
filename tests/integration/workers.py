"""Publish events, and read what the workers emit, for the tests.

The worker process (:mod:`tests.harness.workers`) and the expected results
(:mod:`tests.harness.fold`) live in tests/harness/, shared with the soak.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import orjson
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer

from rl_export.corpora.layout import CorpusRef
from rl_export.corpora.reader import CorpusReader
from rl_export.corpora.store import ObjectStore
from rl_export.formats.specs import DEFAULT_CORPORA
from rl_export.model.events import FAMILY_OF_TYPE
from rl_export.model.snapshots import decode_snapshot
from rl_export.runtime.settings import Settings
from rl_export.stream.produce import topic_for
from rl_export.stream.topics import ensure_service_topics
from tests.harness.fold import comparable, expected_corpora, expected_final, plain
from tests.harness.workers import WorkerProcess, settings_env

__all__ = [  # the tests import these from here
    "TopicReader", "WorkerProcess", "comparable", "corpus_view", "expected_corpora",
    "expected_final", "latest_by_trace", "plain", "publish", "settings_env", "snapshots",
]  # fmt: skip


async def publish(
    settings: Settings, events: Iterable[dict[str, Any] | tuple[str, bytes, bytes]]
) -> int:
    """Publish events (dicts routed by type, or raw (topic, key, value) tuples)."""
    await ensure_service_topics(settings)
    producer = AIOKafkaProducer(bootstrap_servers=settings.kafka_bootstrap, linger_ms=5)
    await producer.start()
    count = 0
    try:
        futures = []
        for item in events:
            if isinstance(item, tuple):
                topic, key, value = item
            else:
                topic = topic_for(settings, FAMILY_OF_TYPE[item["event_type"]])
                key, value = item["trace_id"].encode(), orjson.dumps(item)
            futures.append(await producer.send(topic, value, key=key))
            count += 1
        for fut in futures:
            await fut
    finally:
        await producer.stop()
    return count


@dataclass
class TopicReader:
    """Reads a topic from the beginning, keeping every record in order."""

    settings: Settings
    topic: str

    async def read_until(
        self, done: Callable[[list[Any]], bool], timeout_s: float = 60.0
    ) -> list[Any]:
        consumer = AIOKafkaConsumer(
            self.topic,
            bootstrap_servers=self.settings.kafka_bootstrap,
            group_id=None,
            auto_offset_reset="earliest",
            enable_auto_commit=False,
            isolation_level="read_committed",  # the join writes in transactions
        )
        await consumer.start()
        records: list[Any] = []
        deadline = time.monotonic() + timeout_s
        try:
            while time.monotonic() < deadline:
                batch = await consumer.getmany(timeout_ms=500)
                for tp_records in batch.values():
                    records.extend(tp_records)
                if done(records):
                    break
        finally:
            await consumer.stop()
        return records


def snapshots(records: list[Any]) -> list[dict[str, Any]]:
    return [plain(decode_snapshot(r.value)) for r in records]


def latest_by_trace(items: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """The highest-revision snapshot of each trace (the sink keeps the same)."""
    out: dict[str, dict[str, Any]] = {}
    for snap in items:
        current = out.get(snap["trace_id"])
        if current is None or snap["revision"] >= current["revision"]:
            out[snap["trace_id"]] = snap
    return out


async def corpus_view(store: ObjectStore, org: str, project: str) -> dict[str, dict[str, Any]]:
    out = {}
    for spec in DEFAULT_CORPORA:
        reader = CorpusReader(store, CorpusRef(org, project, spec.name))
        out[spec.name] = {r["trace_id"]: r async for r in reader.records(latest_only=True)}
    return out
