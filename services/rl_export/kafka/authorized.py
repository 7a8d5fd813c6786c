"""Which ACLs this process lacks, asked of the broker before its clients need them (KIP-430).

The topic check (:mod:`rl_export.stream.topics`) gives :func:`missing` the grants of its
process's role (:func:`rl_export.kafka.access.grants`) and refuses to start, in one line,
listing every grant the broker says the principal lacks:

1. topics: a Metadata request (version 8) asking for each topic's *authorized operations*,
   the bits of the operations this principal may do on it (Read, Write, Describe, ...; those
   an ACL implies included). A topic it may not describe answers TOPIC_AUTHORIZATION_FAILED.
   DescribeConfigs is learnt from the configuration request the topic check makes anyway.
2. groups: the group's coordinator (FindCoordinator needs Describe on the group), then
   DescribeGroups (version 3) asking for the group's authorized operations.
3. transactional ids: the coordinator of the first one (FindCoordinator needs Describe on
   it, which only its Write gives here); the producer's start checks Write itself.

Not checked here, and named by the client a refusal reaches instead
(:func:`rl_export.kafka.access.refused`): topics that do not exist yet, brokers that do not
answer authorized operations (before Kafka 2.3), and the cluster.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterable, Sequence
from typing import Any

from aiokafka import errors as kafka_errors
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.protocol.admin import DescribeGroupsResponse_v3
from aiokafka.protocol.api import Request, RequestStruct, Response
from aiokafka.protocol.types import Array, Boolean, Int16, Int32, Schema, String

from rl_export.kafka.access import Grant, Kind, Op

TOPIC_AUTHORIZATION_FAILED = kafka_errors.TopicAuthorizationFailedError.errno
GROUP_AUTHORIZATION_FAILED = kafka_errors.GroupAuthorizationFailedError.errno
_NOT_GIVEN = -(2**31)  # authorized operations the broker did not say
_COORDINATOR_WAIT_S = 15.0  # a new cluster makes its offsets and transaction topics first
# The coordinator is still being made or moved: ask again.
_COORDINATOR_RETRY = (
    kafka_errors.CoordinatorNotAvailableError,
    kafka_errors.CoordinatorLoadInProgressError,
    kafka_errors.NotCoordinatorError,
)


class MetadataResponseV8(Response):  # type: ignore[misc]  # aiokafka is untyped
    API_KEY = 3
    API_VERSION = 8
    SCHEMA = Schema(
        ("throttle_time_ms", Int32),
        ("brokers", Array(("node_id", Int32), ("host", String("utf-8")), ("port", Int32),
                          ("rack", String("utf-8")))),
        ("cluster_id", String("utf-8")),
        ("controller_id", Int32),
        ("topics", Array(
            ("error_code", Int16),
            ("name", String("utf-8")),
            ("is_internal", Boolean),
            ("partitions", Array(
                ("error_code", Int16), ("partition_index", Int32), ("leader_id", Int32),
                ("leader_epoch", Int32), ("replica_nodes", Array(Int32)),
                ("isr_nodes", Array(Int32)), ("offline_replicas", Array(Int32)),
            )),
            ("topic_authorized_operations", Int32),
        )),
        ("cluster_authorized_operations", Int32),
    )  # fmt: skip


class MetadataRequestV8(RequestStruct):  # type: ignore[misc]
    API_KEY = 3
    API_VERSION = 8
    RESPONSE_TYPE = MetadataResponseV8
    SCHEMA = Schema(
        ("topics", Array(String("utf-8"))),
        ("allow_auto_topic_creation", Boolean),
        ("include_cluster_authorized_operations", Boolean),
        ("include_topic_authorized_operations", Boolean),
    )


class AuthorizedMetadata(Request[MetadataRequestV8]):  # type: ignore[misc]
    """Metadata of some topics with what this principal may do on each (never creates one)."""

    API_KEY = 3

    def __init__(self, topics: Sequence[str]) -> None:
        self.topics = list(topics)

    def build(self, request_struct_class: type[MetadataRequestV8]) -> MetadataRequestV8:
        return request_struct_class(self.topics, False, False, True)


class DescribeGroupsRequestV3(RequestStruct):  # type: ignore[misc]
    """aiokafka's own version 3 decodes its answer as version 2, without the operations."""

    API_KEY = 15
    API_VERSION = 3
    RESPONSE_TYPE = DescribeGroupsResponse_v3
    SCHEMA = Schema(("groups", Array(String("utf-8"))), ("include_authorized_operations", Boolean))


class AuthorizedGroups(Request[DescribeGroupsRequestV3]):  # type: ignore[misc]
    """DescribeGroups with what this principal may do on each group."""

    API_KEY = 15

    def __init__(self, groups: Sequence[str]) -> None:
        self.groups = list(groups)

    def build(self, request_struct_class: type[DescribeGroupsRequestV3]) -> DescribeGroupsRequestV3:
        return request_struct_class(self.groups, True)


def _codes(bits: int) -> set[int] | None:
    """The operation codes set in an authorized-operations field; None when not given."""
    if bits == _NOT_GIVEN or bits < 0:
        return None
    return {code for code in range(32) if bits & (1 << code)}


async def topic_operations(
    admin: AIOKafkaAdminClient, topics: Iterable[str]
) -> dict[str, set[int] | None]:
    """What the principal may do on each topic: operation codes, or None where it may not
    even describe it. Topics the broker does not know, or whose operations it does not say,
    are left out; so is everything when the broker is older than Metadata version 8."""
    try:  # the admin client's own way to any broker (no public call takes a request)
        response = await admin._send_request(AuthorizedMetadata(sorted(set(topics))))
    except (NotImplementedError, kafka_errors.IncompatibleBrokerVersion):
        return {}
    found: dict[str, set[int] | None] = {}
    for error_code, name, _internal, _partitions, bits in response.topics:
        if error_code == TOPIC_AUTHORIZATION_FAILED:
            found[name] = None
        elif error_code == 0 and (codes := _codes(bits)) is not None:
            found[name] = codes
    return found


async def _coordinator(admin: AIOKafkaAdminClient, key: str, kind: int, timeout_s: float) -> int:
    """The coordinator of a group (``kind`` 0) or transactional id (1), asked again while it
    is being made; raises the broker's error (an authorization failure among them)."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            node: int = await admin.find_coordinator(key, kind)
            return node
        except _COORDINATOR_RETRY:
            if time.monotonic() >= deadline:
                raise
            await asyncio.sleep(0.25)


async def group_operations(
    admin: AIOKafkaAdminClient, group: str, timeout_s: float = _COORDINATOR_WAIT_S
) -> set[int] | None:
    """What the principal may do on a consumer group (it need not exist yet): operation
    codes, None where it may not describe it, and the empty set when the broker does not say.
    """
    try:
        node = await _coordinator(admin, group, 0, timeout_s)
    except kafka_errors.GroupAuthorizationFailedError:
        return None
    try:
        response: Any = await admin._send_request(AuthorizedGroups([group]), node)
    except (NotImplementedError, kafka_errors.IncompatibleBrokerVersion):
        return set()  # a broker before Kafka 2.3
    for error_code, name, *_rest, bits in response.groups:
        if name != group:
            continue
        if error_code == GROUP_AUTHORIZATION_FAILED:
            return None
        return _codes(bits) or set()
    return set()


async def transactional_ids_describable(
    admin: AIOKafkaAdminClient, prefix: str, timeout_s: float = _COORDINATOR_WAIT_S
) -> bool:
    """Whether the principal may describe the transactional ids starting with ``prefix``
    (asked of the first, ``<prefix>0``)."""
    try:
        await _coordinator(admin, f"{prefix}0", 1, timeout_s)
    except kafka_errors.TransactionalIdAuthorizationFailed:
        return False
    return True


async def missing(
    admin: AIOKafkaAdminClient, wanted: Sequence[Grant], configs_refused: set[str]
) -> list[Grant]:
    """The grants of ``wanted`` the broker says this principal lacks (see the module).

    ``configs_refused``: the topics whose configuration the broker would not describe.
    Create is not asked (the topic check names a refused creation); nor is the cluster.
    """
    topics = {g.resource.name for g in wanted if g.resource.kind is Kind.TOPIC}
    allowed = await topic_operations(admin, topics) if topics else {}
    groups = {g.resource.name for g in wanted if g.resource.kind is Kind.GROUP}
    group_ops = {name: await group_operations(admin, name) for name in sorted(groups)}
    prefixes = {g.resource.name for g in wanted if g.resource.kind is Kind.TRANSACTIONAL_ID}
    describable = {p: await transactional_ids_describable(admin, p) for p in sorted(prefixes)}
    lacking = []
    for grant in wanted:
        name, op = grant.resource.name, grant.operation
        if grant.resource.kind is Kind.TOPIC and op is Op.DESCRIBE_CONFIGS:
            denied = name in configs_refused
        elif grant.resource.kind is Kind.TOPIC and op is not Op.CREATE and name in allowed:
            codes = allowed[name]
            denied = codes is None or op.code not in codes
        elif grant.resource.kind is Kind.GROUP:
            codes = group_ops[name]
            denied = codes is None or (bool(codes) and op.code not in codes)
        elif grant.resource.kind is Kind.TRANSACTIONAL_ID:
            denied = not describable[name]
        else:
            denied = False
        if denied:
            lacking.append(grant)
    return lacking
