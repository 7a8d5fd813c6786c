"""What each process does on Kafka: the one list its clients, its topic check and its ACLs
come from.

Kafka Streams lists every topic it touches in its configuration, so that its ACLs can be
derived (STYLE.md); here the list is :func:`clients`: every Kafka client of a process
(:class:`Role`), with the topics it reads and writes, the consumer group it joins and its
transactional ids.

1. The processes build their clients from it: the join subscribes to its consumer's topics in
   its group and names its producers with its transactional-id prefix
   (:func:`transactional_id`), the sink joins its group, the web service follows its tails'
   topics, and each process creates or checks the topics its own clients use
   (:func:`role_topics`).
2. :func:`grants` turns a role's clients into the least set of ACLs that lets them work:
   Read and Write imply Describe, so Describe is asked for only where neither is; the topic
   check reads every topic's configuration (DescribeConfigs), and creates missing topics only
   with ``RL_EXPORT_CREATE_TOPICS`` (Create). ``rl-export acls`` prints them
   (:mod:`rl_export.kafka.acls`), the topic check asks the broker which of them it lacks
   (:mod:`rl_export.kafka.authorized`), and a request refused later is named from the same
   list (:func:`refused`).

Kafka before 3.0 also wants IdempotentWrite on the cluster for an idempotent producer without
a transactional id (the web service's, ``produce``'s, the join's at least once); from 3.0
Write on the topic is enough (KIP-679), so it is not in the list, only named when refused.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from aiokafka import errors as kafka_errors

from rl_export.kafka.client import KafkaConnection
from rl_export.model.errors import KafkaAccessError
from rl_export.runtime.settings import Settings


class Role(enum.StrEnum):
    """A process of the project, as one principal runs it."""

    WORKER = "worker"
    WEB = "web"
    PRODUCE = "produce"


class Op(enum.StrEnum):
    """An ACL operation, named as kafka-acls and Strimzi name it."""

    READ = "Read"
    WRITE = "Write"
    CREATE = "Create"
    DESCRIBE = "Describe"
    DESCRIBE_CONFIGS = "DescribeConfigs"
    IDEMPOTENT_WRITE = "IdempotentWrite"

    @property
    def code(self) -> int:
        """Kafka's number of the operation: its bit in an answer's authorized operations."""
        return _CODES[self]


_CODES = {Op.READ: 3, Op.WRITE: 4, Op.CREATE: 5, Op.DESCRIBE: 8, Op.DESCRIBE_CONFIGS: 10,
          Op.IDEMPOTENT_WRITE: 12}  # fmt: skip
_IMPLY_DESCRIBE = (Op.READ, Op.WRITE)


class Kind(enum.StrEnum):
    """A resource type, as Strimzi names it (kafka-acls: ``--topic``, ``--group``, ...)."""

    TOPIC = "topic"
    GROUP = "group"
    TRANSACTIONAL_ID = "transactionalId"
    CLUSTER = "cluster"


@dataclass(frozen=True)
class Resource:
    """What an ACL is on: a topic, a group, transactional ids (a prefix) or the cluster."""

    kind: Kind
    name: str = ""
    prefixed: bool = False

    def __str__(self) -> str:
        if self.kind is Kind.CLUSTER:
            return "the cluster"
        if self.prefixed:
            return f"{self.kind} {self.name!r}* (prefixed)"
        return f"{self.kind} {self.name!r}"


@dataclass(frozen=True)
class Grant:
    """One ACL entry: an operation allowed on a resource."""

    resource: Resource
    operation: Op

    def __str__(self) -> str:
        return f"{self.operation} {self.resource}"


@dataclass(frozen=True)
class Client:
    """One Kafka client of a process and everything it touches."""

    what: str  # "the join's consumer": how a refusal names it
    reads: tuple[str, ...] = ()  # topics it fetches from
    writes: tuple[str, ...] = ()  # topics it produces to
    group: str | None = None  # the consumer group it joins, or commits offsets of
    transactional_prefix: str | None = None  # transactional.id = prefix + partition
    checks: tuple[str, ...] = ()  # topics whose partitions and configuration it reads
    creates: tuple[str, ...] = ()  # topics it creates when they are missing

    def grants(self) -> list[Grant]:
        """What it needs, Describe left in (:func:`grants` drops what Read or Write imply)."""
        wanted = [Grant(_topic(t), Op.READ) for t in self.reads]
        wanted += [Grant(_topic(t), Op.WRITE) for t in self.writes]
        for topic in self.checks:
            wanted += [Grant(_topic(topic), Op.DESCRIBE), Grant(_topic(topic), Op.DESCRIBE_CONFIGS)]
        wanted += [Grant(_topic(t), Op.CREATE) for t in self.creates]
        if self.group is not None:
            wanted.append(Grant(Resource(Kind.GROUP, self.group), Op.READ))
        if self.transactional_prefix is not None:
            prefix = Resource(Kind.TRANSACTIONAL_ID, self.transactional_prefix, prefixed=True)
            wanted.append(Grant(prefix, Op.WRITE))
        return wanted


def _topic(name: str) -> Resource:
    return Resource(Kind.TOPIC, name)


def join_consumer(settings: Settings) -> Client:
    """The join's consumer: the three input topics, in the join's group (the app id)."""
    return Client("the join's consumer", reads=settings.input_topics, group=settings.app_id)


def join_producer(settings: Settings) -> Client:
    """The join's producers: forwards to the input topics, snapshots, dead letters and the
    table's changelog; exactly once, one transactional producer per partition, whose
    transactions commit the join group's input offsets too."""
    exactly_once = settings.processing_guarantee == "exactly_once"
    return Client(
        "the join's producers",
        writes=(*settings.input_topics, settings.topic_trajectories, settings.topic_dead_letter,
                settings.topic_changelog),
        group=settings.app_id if exactly_once else None,
        transactional_prefix=f"{settings.app_id}-" if exactly_once else None,
    )  # fmt: skip


def table_restore(settings: Settings) -> Client:
    """The join table's restore: reads the changelog, with no group."""
    return Client("the join table's restore", reads=(settings.topic_changelog,))


def sink_consumer(settings: Settings) -> Client:
    """The sink's consumer: ``trajectories``, in the sink's group."""
    return Client(
        "the sink's consumer", reads=(settings.topic_trajectories,), group=settings.sink_group
    )


def commits_feed(settings: Settings) -> Client:
    """The change feed's producer: the sink and compaction announce each corpus commit."""
    return Client("the change feed's producer", writes=(settings.topic_commits,))


def label_publisher(settings: Settings) -> Client:
    """The web service's producer: label events, and the news of claims."""
    return Client("the label publisher", writes=(settings.topic_labels, settings.topic_claims))


def labels_tail(settings: Settings) -> Client:
    """The web service's follower of the labels topic (no group: it reads every partition)."""
    return Client("the labels tail", reads=(settings.topic_labels,))


def claims_tail(settings: Settings) -> Client:
    """The web service's follower of the claims topic (no group)."""
    return Client("the claims tail", reads=(settings.topic_claims,))


def trajectories_tail(settings: Settings) -> Client:
    """The web service's follower of the trajectories topic (no group): new traces for the
    index before the corpora commit them."""
    return Client("the trajectories tail", reads=(settings.topic_trajectories,))


def event_producer(settings: Settings) -> Client:
    """``produce``: events to the three input topics."""
    return Client("the event producer", writes=settings.input_topics)


_ROLE_CLIENTS = {
    Role.WORKER: (join_consumer, join_producer, table_restore, sink_consumer, commits_feed),
    Role.WEB: (label_publisher, labels_tail, claims_tail, trajectories_tail),
    Role.PRODUCE: (event_producer,),
}


def role_topics(settings: Settings, role: Role) -> tuple[str, ...]:
    """The topics a role's clients read or write, in the order of ``all_topics``."""
    used = {t for make in _ROLE_CLIENTS[role] for c in [make(settings)] for t in c.reads + c.writes}
    return tuple(t for t in settings.all_topics if t in used)


def topic_check(settings: Settings, role: Role) -> Client:
    """The topic check a role's process runs at start: its topics' partitions and
    configuration, and, with ``RL_EXPORT_CREATE_TOPICS``, the missing ones created."""
    topics = role_topics(settings, role)
    return Client("the topic check", checks=topics,
                  creates=topics if settings.create_topics else ())  # fmt: skip


def clients(settings: Settings, role: Role) -> tuple[Client, ...]:
    """Every Kafka client of a role's process, its topic check last."""
    return (*(make(settings) for make in _ROLE_CLIENTS[role]), topic_check(settings, role))


def transactional_id(settings: Settings, partition: int) -> str:
    """The transactional id of the join's producer of one partition."""
    prefix = join_producer(settings).transactional_prefix
    assert prefix is not None, "transactional ids are for exactly once"
    return f"{prefix}{partition}"


def grants(settings: Settings, role: Role) -> list[Grant]:
    """The least ACLs a role's process needs with these settings, in a stable order: topics
    (in the order of ``all_topics``), groups, transactional ids; per resource, operations in
    the order of :class:`Op`."""
    wanted = {g for c in clients(settings, role) for g in c.grants()}
    wanted = {g for g in wanted if not (g.operation is Op.DESCRIBE and any(
        Grant(g.resource, op) in wanted for op in _IMPLY_DESCRIBE))}  # fmt: skip
    topics = {name: n for n, name in enumerate(settings.all_topics)}
    ops = list(Op)
    kinds = list(Kind)

    def order(g: Grant) -> tuple[int, int, str, int]:
        where = topics.get(g.resource.name, len(topics)) if g.resource.kind is Kind.TOPIC else 0
        return kinds.index(g.resource.kind), where, g.resource.name, ops.index(g.operation)

    return sorted(wanted, key=order)


def by_resource(wanted: Iterable[Grant]) -> dict[Resource, list[Op]]:
    """Grants grouped per resource, in their order (one kafka-acls command, one Strimzi ACL)."""
    grouped: dict[Resource, list[Op]] = {}
    for grant in wanted:
        grouped.setdefault(grant.resource, []).append(grant.operation)
    return grouped


def needed_by(settings: Settings, role: Role, grant: Grant) -> list[str]:
    """Which clients of the role need ``grant`` (Describe: those a Read or Write serves)."""
    found = []
    for client in clients(settings, role):
        mine = client.grants()
        if grant in mine or (grant.operation is Op.DESCRIBE and any(
                Grant(grant.resource, op) in mine for op in _IMPLY_DESCRIBE)):  # fmt: skip
            found.append(client.what)
    return found


def access_error(
    settings: Settings, role: Role, missing: Sequence[Grant], *, client: Client | None = None
) -> KafkaAccessError:
    """One line naming every grant the principal lacks, who needs it, and how to see them all."""
    setting, who = KafkaConnection.of(settings).principal()

    def needers(grant: Grant) -> str:
        if grant.resource.kind is Kind.CLUSTER:  # only ever asked for by a broker before 3.0
            return f"{client.what if client else 'an idempotent producer'}: Kafka before 3.0"
        return ", ".join(needed_by(settings, role, grant)) or "this process"

    listing = "; ".join(f"{grant} ({needers(grant)})" for grant in missing)
    return KafkaAccessError(
        setting,
        f"the broker's ACLs do not let {who} {listing}. `rl-export acls --role {role} "
        f"--principal {who}` prints every ACL the {role} needs",
        tuple(missing),
    )


def refused(
    settings: Settings, role: Role, client: Client, exc: BaseException,
    topics: Sequence[str] = (),
) -> KafkaAccessError | None:  # fmt: skip
    """The error naming what a refused request of ``client`` lacked; None when ``exc`` is not
    an authorization failure. ``topics``: the ones the request was about, where known."""
    mine = client.grants()
    if isinstance(exc, kafka_errors.TopicAuthorizationFailedError):
        named = (set(topics) | _topics_in(exc)) & set(client.reads + client.writes)
        missing = [g for g in mine if g.resource.kind is Kind.TOPIC and g.operation in (
            Op.READ, Op.WRITE) and (not named or g.resource.name in named)]  # fmt: skip
    elif isinstance(exc, kafka_errors.GroupAuthorizationFailedError):
        missing = [g for g in mine if g.resource.kind is Kind.GROUP]
    elif isinstance(exc, kafka_errors.TransactionalIdAuthorizationFailed):
        missing = [g for g in mine if g.resource.kind is Kind.TRANSACTIONAL_ID]
    elif isinstance(exc, kafka_errors.ClusterAuthorizationFailedError):
        creates = [g for g in mine if g.operation is Op.CREATE]
        missing = creates or [Grant(Resource(Kind.CLUSTER), Op.IDEMPOTENT_WRITE)]
    else:
        return None
    return access_error(settings, role, missing or mine, client=client)


def _topics_in(exc: BaseException) -> set[str]:
    """The topic names an aiokafka authorization error carries (the consumer gives a set)."""
    found: set[str] = set()
    for arg in exc.args:
        if isinstance(arg, str):
            found.add(arg)
        elif isinstance(arg, set | frozenset | list | tuple):
            found |= {a for a in arg if isinstance(a, str)}
    return found
