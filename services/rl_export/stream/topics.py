"""Create the service's topics and check that they are co-partitioned and take its records.

Each process checks the topics its own clients use (:func:`rl_export.kafka.access.role_topics`),
at start, in this order (:func:`ensure_service_topics`):

1. what the broker's ACLs let this principal do on them, on its groups and transactional
   ids: every grant it lacks is named in one line (:mod:`rl_export.kafka.authorized`);
2. missing topics are created (``RL_EXPORT_CREATE_TOPICS``, the default) or, on a managed
   cluster (Strimzi ``KafkaTopic``s, MSK, Confluent Cloud), reported: nothing is created;
3. every topic's partition count must be the configured one: the join relies on one trace's
   events meeting in one partition (and on one consistent partitioner,
   :mod:`rl_export.model.partitioning`);
4. every topic's ``max.message.bytes`` must take what the project writes there (the limit
   it is created with, :func:`topic_specs`): a topic that takes less would refuse a record
   the join must write, and stop its partition;
5. on a managed cluster, the changelog must be compacted.

A process refuses to start listing every mismatch (:class:`TopicMismatchError`). A worker
started before its broker waits for it (``RL_EXPORT_KAFKA_WAIT_S``); the command line's
one-off commands do not.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType
from aiokafka.errors import (
    ClusterAuthorizationFailedError,
    KafkaConnectionError,
    KafkaError,
    TopicAlreadyExistsError,
    TopicAuthorizationFailedError,
)

from rl_export.kafka import access, authorized
from rl_export.kafka.access import Grant, Role
from rl_export.kafka.client import KafkaConnection, connection_of, quiet_aiokafka
from rl_export.model.errors import (
    BrokerUnavailableError,
    ConfigError,
    KafkaSecurityError,
    PartitionMismatchError,
    RlExportError,
    TopicMismatchError,
)
from rl_export.runtime.settings import Settings, env_name

CONNECT_TIMEOUT_S = 10.0
_WAIT_RETRY_S = 1.0
_HEADERS_ROOM = 64 * 1024
MAX_MESSAGE_BYTES = "max.message.bytes"
CHECKED_CONFIGS = ("cleanup.policy", MAX_MESSAGE_BYTES)
Configs = dict[str, dict[str, str]]
"""Per topic, the configuration entries we check (``CHECKED_CONFIGS``)."""

log = logging.getLogger(__name__)
# Topic and cluster authorization failed: the principal may not create topics.
_NOT_ALLOWED = (TopicAuthorizationFailedError.errno, ClusterAuthorizationFailedError.errno)


def topic_max_bytes(settings: Settings) -> int:
    """``max.message.bytes`` of the topics we create (the dead-letter topic aside).

    Twice the event size limit: the broker never refuses an event the worker would accept,
    nor a snapshot of it; larger events reach the worker, which dead-letters them.
    """
    return settings.max_event_bytes * 2 + _HEADERS_ROOM


def dead_letter_max_bytes(settings: Settings) -> int:
    """``max.message.bytes`` of the dead-letter topic.

    A dead letter is an input record's key and value, which together fit in
    :func:`topic_max_bytes` (an event of any size the input topics accept), plus our
    headers: a reason, at most 4 KiB of detail, the source topic (at most 249 characters),
    partition and offset. 64 KiB more than an input record holds them all.
    """
    return topic_max_bytes(settings) + _HEADERS_ROOM


@dataclass(frozen=True)
class TopicSpec:
    """A topic we create, with its partition count and topic-level configuration."""

    name: str
    partitions: int
    configs: dict[str, str]


DAY_MS = 24 * 3600 * 1000


def topic_specs(settings: Settings, role: Role | None = None) -> list[TopicSpec]:
    """Return the specs of every topic the service needs (or a role's clients use)."""

    def configs(name: str) -> dict[str, str]:
        if name == settings.topic_dead_letter:
            return {MAX_MESSAGE_BYTES: str(dead_letter_max_bytes(settings))}
        limit = {MAX_MESSAGE_BYTES: str(topic_max_bytes(settings))}
        if name in (settings.topic_changelog, settings.topic_commits):  # commits: a feed
            return limit | {"cleanup.policy": "compact"}
        if name == settings.topic_claims:  # news of claims: the store keeps the claims
            return limit | {"retention.ms": str(2 * DAY_MS)}
        return limit

    names = settings.all_topics if role is None else access.role_topics(settings, role)
    return [TopicSpec(name, settings.partitions, configs(name)) for name in names]


async def _admin(target: KafkaConnection | str, timeout_s: float) -> AIOKafkaAdminClient:
    kafka = connection_of(target)
    bootstrap = kafka.bootstrap
    admin = AIOKafkaAdminClient(**kafka.aiokafka(), request_timeout_ms=int(timeout_s * 1000))
    try:
        with quiet_aiokafka():
            await asyncio.wait_for(admin.start(), timeout_s)
    except (KafkaConnectionError, KafkaError, OSError, TimeoutError) as exc:
        await admin.close()
        await kafka.check(timeout_s)  # raises KafkaSecurityError when TLS or SASL failed
        why = f"no answer within {timeout_s:.0f}s" if isinstance(exc, TimeoutError) else str(exc)
        raise BrokerUnavailableError(
            f"{env_name('kafka_bootstrap')}={bootstrap}: no Kafka broker answered ({why})"
        ) from None
    return admin


async def partition_counts(
    bootstrap: KafkaConnection | str, topics: Sequence[str], timeout_s: float = CONNECT_TIMEOUT_S
) -> dict[str, int]:
    """Return the partition count of each named topic that exists."""
    admin = await _admin(bootstrap, timeout_s)
    try:
        return await _counts(admin, topics)
    finally:
        await admin.close()


async def _counts(admin: AIOKafkaAdminClient, topics: Sequence[str]) -> dict[str, int]:
    existing = set(await admin.list_topics())
    wanted = [t for t in topics if t in existing]
    if not wanted:
        return {}
    described = await admin.describe_topics(wanted)
    return {d["topic"]: len(d["partitions"]) for d in described if not d.get("error_code")}


def check_partition_counts(counts: dict[str, int], expected: int) -> None:
    """Raise PartitionMismatchError when any topic has a partition count other than expected."""
    wrong = {t: n for t, n in sorted(counts.items()) if n != expected}
    if wrong:
        listing = ", ".join(f"{t} has {n}" for t, n in wrong.items())
        raise PartitionMismatchError(
            env_name("partitions"),
            f"expected {expected} partitions on every topic, but {listing}; "
            "set it to match the existing topics or recreate them",
        )


async def ensure_topics(
    bootstrap: KafkaConnection | str,
    specs: Sequence[TopicSpec],
    *,
    replication_factor: int = 1,
    timeout_s: float = CONNECT_TIMEOUT_S,
    wait_s: float = 0.0,
    create: bool = True,
    grants: Sequence[Grant] = (),
    refuse: Callable[[list[Grant]], KafkaSecurityError] | None = None,
) -> dict[str, int]:
    """Steps 1-5 of the module; return the partition counts.

    ``grants`` are what the process needs (step 1); ``refuse`` makes the error naming those
    it lacks. With ``create`` false nothing is created: the topics are verified.

    A broker that does not answer, or goes away during the check, is asked again for
    ``wait_s`` (saying so every 10 s); then its :class:`BrokerUnavailableError` is raised.
    """
    deadline = time.monotonic() + wait_s
    said = float("-inf")  # when we last said we are waiting
    while True:
        try:
            return await _ensure_once(bootstrap, specs, replication_factor, timeout_s,
                                      create=create, grants=grants, refuse=refuse)  # fmt: skip
        except BrokerUnavailableError as exc:
            left = deadline - time.monotonic()
            if left <= 0:
                raise
            if time.monotonic() - said >= 10:
                log.warning("%s; waiting for it (%.0fs more at most)", exc, left)
                said = time.monotonic()
            await asyncio.sleep(min(_WAIT_RETRY_S, left))


async def _ensure_once(
    bootstrap: KafkaConnection | str,
    specs: Sequence[TopicSpec],
    replication_factor: int,
    timeout_s: float,
    *,
    create: bool = True,
    grants: Sequence[Grant] = (),
    refuse: Callable[[list[Grant]], KafkaSecurityError] | None = None,
) -> dict[str, int]:
    admin = await _admin(bootstrap, timeout_s)
    try:
        names = [s.name for s in specs]
        configs, refused = await _topic_configs(admin, names)
        if grants and refuse is not None:  # step 1
            lacking = await authorized.missing(admin, grants, refused)
            if lacking:
                raise refuse(lacking)
        if not create:
            return await verify(admin, specs, configs)
        counts = await _ensure(admin, specs, replication_factor)
        made = [name for name in names if name not in configs and name not in refused]
        if made:  # created now: their configuration is ours, read it all the same
            configs |= (await _topic_configs(admin, made))[0]
        problems = _too_small(specs, configs)
        if problems:
            raise TopicMismatchError(
                env_name("max_event_bytes"),
                f"{'; '.join(problems)}: raise the topics' max.message.bytes (kafka-configs "
                "--alter --add-config max.message.bytes=N) or lower this setting",
            )
        return counts
    except (KafkaError, OSError) as exc:
        raise BrokerUnavailableError(
            f"{env_name('kafka_bootstrap')}={connection_of(bootstrap).bootstrap}: the broker "
            "went away while the topics "
            f"were checked ({type(exc).__name__}: {exc})"
        ) from None
    finally:
        await admin.close()


async def _ensure(
    admin: AIOKafkaAdminClient, specs: Sequence[TopicSpec], replication_factor: int
) -> dict[str, int]:
    existing = set(await admin.list_topics())
    missing = [s for s in specs if s.name not in existing]
    if missing:
        response = await admin.create_topics(
            [
                NewTopic(s.name, s.partitions, replication_factor, topic_configs=s.configs)
                for s in missing
            ]
        )
        for name, code, *rest in response.topic_errors:
            # Another worker may have created it between our list and create: fine.
            if code in _NOT_ALLOWED:
                raise ConfigError(
                    env_name("create_topics"),
                    f"the broker does not allow us to create {name}: make the topics "
                    "beforehand (see the Kubernetes guide) and set this to false",
                )
            if code not in (0, TopicAlreadyExistsError.errno):
                detail = rest[0] if rest and rest[0] else f"error code {code}"
                raise RlExportError(f"could not create topic {name}: {detail}")
    for _ in range(50):  # creation is asynchronous: wait until metadata shows them all
        counts = await _counts(admin, [s.name for s in specs])
        if len(counts) == len(specs):
            break
        await asyncio.sleep(0.1)
    expected = {s.partitions for s in specs}
    check_partition_counts(counts, expected.pop() if len(expected) == 1 else -1)
    return counts


async def verify(
    admin: AIOKafkaAdminClient, specs: Sequence[TopicSpec], configs: Configs | None = None
) -> dict[str, int]:
    """Check topics we may not create; raise :class:`TopicMismatchError` listing every
    mismatch (missing, another partition count, a changelog that is not compacted, a
    ``max.message.bytes`` smaller than what we write there). ``configs``: the topics'
    configurations, when already read."""
    counts = await _counts(admin, [s.name for s in specs])
    if configs is None:
        configs = (await _topic_configs(admin, list(counts)))[0]
    problems = [f"{s.name} is missing" for s in specs if s.name not in counts]
    problems += [f"{s.name} has {counts[s.name]} partitions, not {s.partitions}"
                 for s in specs if s.name in counts and counts[s.name] != s.partitions]  # fmt: skip
    compacted = [s.name for s in specs if "compact" in s.configs.get("cleanup.policy", "")]
    policies = {name: configs.get(name, {}).get("cleanup.policy") for name in compacted}
    problems += [f"{name} has cleanup.policy={policies.get(name) or 'unknown'}, not compact"
                 for name in compacted if name in counts
                 and "compact" not in (policies.get(name) or "")]  # fmt: skip
    problems += _too_small([s for s in specs if s.name in counts], configs)
    if problems:
        raise TopicMismatchError(
            env_name("create_topics"),
            "false, so the topics must be made beforehand (see the Kubernetes guide's "
            f"KafkaTopics), but {'; '.join(problems)}",
        )
    return counts


def _too_small(specs: Sequence[TopicSpec], configs: Configs) -> list[str]:
    """Step 4: the topics whose ``max.message.bytes`` is below what we write there."""
    problems = []
    for spec in specs:
        needed = spec.configs.get(MAX_MESSAGE_BYTES)
        found = configs.get(spec.name, {}).get(MAX_MESSAGE_BYTES)
        if needed is None or found is None or not found.isdigit():
            continue
        if int(found) < int(needed):
            problems.append(f"{spec.name} has {MAX_MESSAGE_BYTES}={found}, below the {needed} "
                            "rl-export writes there")  # fmt: skip
    return problems


async def _topic_configs(
    admin: AIOKafkaAdminClient, topics: Sequence[str]
) -> tuple[Configs, set[str]]:
    """The configuration we check of each topic, and the topics whose configuration the
    broker would not describe to us (no DescribeConfigs). Missing topics are in neither."""
    if not topics:
        return {}, set()
    wanted = [ConfigResource(ConfigResourceType.TOPIC, t, dict.fromkeys(CHECKED_CONFIGS))
              for t in topics]  # fmt: skip
    found: Configs = {}
    refused: set[str] = set()
    for response in await admin.describe_configs(wanted):
        for error_code, _message, _type, name, entries, *_ in response.resources:
            if error_code == TopicAuthorizationFailedError.errno:
                refused.add(name)
            elif not error_code:
                found[name] = {entry[0]: entry[1] for entry in entries if entry[1] is not None}
    return found, refused


async def ensure_service_topics(
    settings: Settings, wait_s: float = 0.0, role: Role | None = None
) -> dict[str, int]:
    """Check what this principal may do (a ``role``'s grants), then create and check the
    role's topics as configured (every topic when no role is given, without step 1); wait
    ``wait_s`` for a broker that does not answer yet."""
    grants = [] if role is None else access.grants(settings, role)

    def refuse(lacking: list[Grant]) -> KafkaSecurityError:
        assert role is not None
        return access.access_error(settings, role, lacking)

    return await ensure_topics(
        KafkaConnection.of(settings),
        topic_specs(settings, role),
        replication_factor=settings.replication_factor,
        wait_s=wait_s,
        create=settings.create_topics,
        grants=grants,
        refuse=refuse,
    )
