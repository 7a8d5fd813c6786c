"""The join group's committed input offsets, read *stable* (KIP-447's ``require_stable``).

Offsets committed in a Kafka transaction (``send_offsets_to_transaction``) are *pending* at
the group coordinator until the transaction's marker reaches ``__consumer_offsets`` and the
coordinator has applied it. ``commit_transaction`` returns before that (the transaction
coordinator writes the markers afterwards), and even a new producer's fencing returns before
the group coordinator has applied them (it does so on a scheduler thread). A plain
OffsetFetch in that window answers with the offsets from *before* the transaction: a join
that seeks there processes the committed batch again, and its dead letters, which nothing
downstream deduplicates, come out twice. The fault soak found exactly that.

OffsetFetch version 7 (Kafka >= 2.5) takes ``require_stable``: while a partition has
pending offsets the coordinator answers ``UNSTABLE_OFFSET_COMMIT`` (error 88), and the
Java consumer retries until they are applied. aiokafka asks with version 3 and has no such
flag, so this module sends version 7 itself and retries the same way. Against a broker
older than 2.5 it falls back to aiokafka's unstable fetch, with a warning.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import defaultdict
from collections.abc import Iterable
from typing import Any

from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.client import ConnectionGroup
from aiokafka.errors import IncompatibleBrokerVersion, KafkaError, for_code
from aiokafka.protocol.api import Request, RequestStruct, Response
from aiokafka.protocol.types import (
    Boolean,
    CompactArray,
    CompactString,
    Int16,
    Int32,
    Int64,
    Schema,
    TaggedFields,
)

log = logging.getLogger(__name__)

UNSTABLE_OFFSET_COMMIT = 88
"""The partition has offsets in a transaction not yet applied: ask again."""

COORDINATOR_LOAD_IN_PROGRESS = 14
_COORDINATOR_MOVED = {15, 16}  # not available, not the coordinator (any more)


class OffsetFetchResponseV7(Response):  # type: ignore[misc]
    API_KEY = 9
    API_VERSION = 7
    SCHEMA = Schema(
        ("throttle_time_ms", Int32),
        (
            "topics",
            CompactArray(
                ("name", CompactString("utf-8")),
                (
                    "partitions",
                    CompactArray(
                        ("partition_index", Int32),
                        ("committed_offset", Int64),
                        ("committed_leader_epoch", Int32),
                        ("metadata", CompactString("utf-8")),
                        ("error_code", Int16),
                        ("tags", TaggedFields),
                    ),
                ),
                ("tags", TaggedFields),
            ),
        ),
        ("error_code", Int16),
        ("tags", TaggedFields),
    )


class OffsetFetchRequestV7(RequestStruct):  # type: ignore[misc]
    FLEXIBLE_VERSION = True
    API_KEY = 9
    API_VERSION = 7
    RESPONSE_TYPE = OffsetFetchResponseV7
    SCHEMA = Schema(
        ("group_id", CompactString("utf-8")),
        (
            "topics",
            CompactArray(
                ("name", CompactString("utf-8")),
                ("partition_indexes", CompactArray(Int32)),
                ("tags", TaggedFields),
            ),
        ),
        ("require_stable", Boolean),
        ("tags", TaggedFields),
    )


class StableOffsetFetch(Request[OffsetFetchRequestV7]):  # type: ignore[misc]
    """OffsetFetch with ``require_stable`` set; only version 7 carries it here."""

    API_KEY = 9

    def __init__(self, group: str, partitions: dict[str, list[int]]) -> None:
        self.group = group
        self.partitions = partitions

    def build(self, request_struct_class: type[OffsetFetchRequestV7]) -> OffsetFetchRequestV7:
        topics: list[tuple[str, list[int], dict[int, bytes]]] = [
            (topic, indexes, {}) for topic, indexes in sorted(self.partitions.items())
        ]
        return request_struct_class(self.group, topics, True, {})


class UnstableOffsetsError(KafkaError):  # type: ignore[misc]
    """The offsets stayed pending longer than we wait (an open transaction holds them)."""

    retriable = True


def parse_offsets(
    response: Any, wanted: set[TopicPartition]
) -> tuple[dict[TopicPartition, int | None], set[TopicPartition], int]:
    """An OffsetFetch v7 answer: (offsets, partitions still pending, top-level error code).

    An offset is None where the group has committed none. Raises the broker's error for any
    other per-partition error.
    """
    offsets: dict[TopicPartition, int | None] = {}
    pending: set[TopicPartition] = set()
    for topic, partitions, _tags in response.topics:
        for partition, offset, _epoch, _metadata, error_code, _ptags in partitions:
            tp = TopicPartition(topic, partition)
            if tp not in wanted:
                continue
            if error_code == UNSTABLE_OFFSET_COMMIT:
                pending.add(tp)
            elif error_code:
                raise for_code(error_code)(f"committed offset of {tp}")
            else:
                offsets[tp] = None if offset < 0 else offset
    return offsets, pending, response.error_code


async def stable_committed(
    consumer: AIOKafkaConsumer,
    group: str,
    partitions: Iterable[TopicPartition],
    timeout_s: float = 30.0,
    backoff_s: float = 0.02,
) -> dict[TopicPartition, int | None]:
    """The group's committed offsets of ``partitions``, waiting out pending transactions.

    Uses ``consumer``'s connection to its group coordinator. Raises
    :class:`UnstableOffsetsError` when some stay pending for ``timeout_s`` (a transaction
    another producer keeps open), or the broker's error.
    """
    todo = set(partitions)  # what is still to be read
    if not todo:
        return {}
    client = consumer._client
    coordinator = consumer._coordinator
    deadline = time.monotonic() + timeout_s
    found: dict[TopicPartition, int | None] = {}
    while True:
        await coordinator.ensure_coordinator_known()
        by_topic: dict[str, list[int]] = defaultdict(list)
        for tp in sorted(todo):
            by_topic[tp.topic].append(tp.partition)
        try:
            response = await client.send(
                coordinator.coordinator_id,
                StableOffsetFetch(group, dict(by_topic)),
                group=ConnectionGroup.COORDINATION,
            )
        except (IncompatibleBrokerVersion, NotImplementedError):
            log.warning("the broker predates OffsetFetch v7 (Kafka 2.5): committed offsets "
                        "are read without require_stable")  # fmt: skip
            for tp in todo:
                found[tp] = await consumer.committed(tp)
            return found
        except KafkaError as exc:  # the coordinator went away: find it again, as aiokafka does
            if not exc.retriable or time.monotonic() > deadline:
                raise
            coordinator.coordinator_dead()
            await asyncio.sleep(backoff_s)
            continue
        offsets, pending, error_code = parse_offsets(response, todo)
        if error_code in _COORDINATOR_MOVED:
            coordinator.coordinator_dead()
        elif error_code == COORDINATOR_LOAD_IN_PROGRESS:
            pass  # the broker is loading the group's offsets (it just started): ask again
        elif error_code:
            raise for_code(error_code)(f"committed offsets of group {group}")
        else:
            found.update(offsets)
            todo = pending
            if not todo:
                return found
        if time.monotonic() > deadline:
            raise UnstableOffsetsError(
                f"committed offsets of {sorted(todo)} still pending after {timeout_s:.0f}s"
            )
        await asyncio.sleep(backoff_s)
