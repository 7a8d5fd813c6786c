"""What a topic holds and how far a consumer group got: read-committed reads for checks.

The join writes in Kafka transactions, so a partition's end offset also counts commit
markers (and aborted records): "caught up" cannot be ``committed == end``. It means that a
read-committed consumer starting at the group's offset finds nothing left to read.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterable, Sequence
from typing import Any

from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.errors import KafkaError


def _consumer(bootstrap: str) -> AIOKafkaConsumer:
    return AIOKafkaConsumer(
        bootstrap_servers=bootstrap,
        enable_auto_commit=False,
        isolation_level="read_committed",
        max_partition_fetch_bytes=8 * 1024 * 1024,
    )


async def partitions(bootstrap: str, topics: Iterable[str]) -> list[TopicPartition]:
    """Every partition of the topics that exist."""
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        existing = set(await admin.list_topics())
        wanted = [t for t in topics if t in existing]
        described = await admin.describe_topics(wanted) if wanted else []
    finally:
        await admin.close()
    return sorted(
        TopicPartition(d["topic"], p["partition"]) for d in described for p in d["partitions"]
    )


async def _beginnings(bootstrap: str, tps: list[TopicPartition]) -> dict[TopicPartition, int]:
    if not tps:
        return {}
    consumer = _consumer(bootstrap)
    await consumer.start()
    try:
        return dict(await consumer.beginning_offsets(tps))
    finally:
        await consumer.stop()


async def read_from(
    bootstrap: str, starts: dict[TopicPartition, int], timeout_s: float = 120.0
) -> list[Any]:
    """Every committed record from ``starts`` (per partition) to the stable end, in order."""
    records: list[Any] = []
    tps = list(starts)
    if not tps:
        return records
    consumer = _consumer(bootstrap)
    await consumer.start()
    try:
        consumer.assign(tps)
        ends = await consumer.end_offsets(tps)  # read committed: the last stable offsets
        todo = {tp for tp in tps if starts[tp] < ends[tp]}
        for tp in tps:
            consumer.seek(tp, starts[tp])
        deadline = time.monotonic() + timeout_s
        while todo:
            if time.monotonic() > deadline:
                raise TimeoutError(f"reading {sorted(todo)} took more than {timeout_s:.0f}s")
            fetched = await consumer.getmany(*todo, timeout_ms=500, max_records=10_000)
            for tp, batch in fetched.items():
                records.extend(r for r in batch if r.offset < ends[tp])
            for tp in list(todo):  # markers move the position without returning records
                if await consumer.position(tp) >= ends[tp]:
                    todo.discard(tp)
    finally:
        await consumer.stop()
    return records


async def read_topics(bootstrap: str, topics: Sequence[str], timeout_s: float = 120.0) -> list[Any]:
    """Every committed record of ``topics``, from the beginning to the stable end."""
    begins = await _beginnings(bootstrap, await partitions(bootstrap, topics))
    return await read_from(bootstrap, begins, timeout_s)


async def committed_offsets(bootstrap: str, group: str) -> dict[TopicPartition, int]:
    """The group's committed offsets (partitions without one are left out)."""
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        offsets = await admin.list_consumer_group_offsets(group)
    finally:
        await admin.close()
    return {tp: o.offset for tp, o in offsets.items() if o.offset >= 0}


async def unread(bootstrap: str, group: str, topics: Sequence[str]) -> list[Any]:
    """Committed records of ``topics`` the group has not committed past (its lag, as records)."""
    try:
        committed = await committed_offsets(bootstrap, group)
    except KafkaError:  # no such group yet
        committed = {}
    begins = await _beginnings(bootstrap, await partitions(bootstrap, topics))
    return await read_from(bootstrap, {tp: committed.get(tp, b) for tp, b in begins.items()})


async def wait_caught_up(
    bootstrap: str, group: str, topics: Sequence[str], timeout_s: float, poll_s: float = 1.0
) -> int:
    """Wait until the group has nothing left to read on ``topics``; return what is left then."""
    deadline = time.monotonic() + timeout_s
    while True:
        left = len(await unread(bootstrap, group, topics))
        if left == 0 or time.monotonic() > deadline:
            return left
        await asyncio.sleep(poll_s)
