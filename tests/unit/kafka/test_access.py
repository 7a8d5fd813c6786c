"""What each process does on Kafka, and the ACLs derived from it: enough for every client,
nothing a client does not need, written out as kafka-acls commands and a Strimzi KafkaUser
that read back to the same set, and refusals named from the same list.

Settings are generated (topic names, app id, sink group, processing guarantee, whether topics
are created): the rules must hold for names nobody listed. The integration tests prove the
set against a broker's StandardAuthorizer (tests/integration/security/test_acls.py).
"""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Any

import pytest
import yaml
from aiokafka import errors as kafka_errors
from hypothesis import given
from hypothesis import settings as hypothesis_settings
from hypothesis import strategies as st

from rl_export.cli import main
from rl_export.kafka import access, acls
from rl_export.kafka.access import Grant, Kind, Op, Resource, Role
from rl_export.model.errors import KafkaAccessError
from rl_export.runtime.settings import Settings

GUIDE = Path(__file__).resolve().parents[3] / "docs" / "guides" / "configuration.md"
NAME = st.from_regex(r"[A-Za-z0-9][A-Za-z0-9._-]{0,30}", fullmatch=True)
TOPIC_FIELDS = ("topic_traces", "topic_evaluations", "topic_labels", "topic_trajectories",
                "topic_dead_letter", "topic_claims")  # fmt: skip


@st.composite
def any_settings(draw: st.DrawFn) -> Settings:
    names = draw(st.lists(NAME, min_size=8, max_size=8, unique=True))
    app_id = names[6]
    values: dict[str, Any] = dict(zip(TOPIC_FIELDS, names, strict=False))
    if f"{app_id}-trace-state-changelog" in values.values():
        app_id += "x"  # the changelog's name must not be another topic's
    return Settings(
        **values, app_id=app_id, sink_group=draw(st.sampled_from([names[7], app_id + "-sink"])),
        processing_guarantee=draw(st.sampled_from(["exactly_once", "at_least_once"])),
        create_topics=draw(st.booleans()),
    )  # fmt: skip


def covered(need: Grant, grants: set[Grant]) -> bool:
    """Whether ``grants`` allow ``need`` (Read and Write imply Describe, as in Kafka)."""
    if need in grants:
        return True
    return need.operation is Op.DESCRIBE and any(
        Grant(need.resource, op) in grants for op in (Op.READ, Op.WRITE)
    )


@hypothesis_settings(max_examples=150)
@given(any_settings(), st.sampled_from(list(Role)))
def test_the_grants_are_enough_for_every_client_and_none_is_spare(
    settings: Settings, role: Role
) -> None:
    grants = access.grants(settings, role)
    assert len(set(grants)) == len(grants)
    needs = [need for client in access.clients(settings, role) for need in client.grants()]
    assert all(covered(need, set(grants)) for need in needs)
    for grant in grants:  # remove any one: some client lacks something
        rest = set(grants) - {grant}
        assert not all(covered(need, rest) for need in needs), grant
        assert access.needed_by(settings, role, grant)
    assert {g.operation for g in grants} <= {Op.READ, Op.WRITE, Op.DESCRIBE_CONFIGS, Op.CREATE}
    assert any(g.operation is Op.CREATE for g in grants) == settings.create_topics


@hypothesis_settings(max_examples=100)
@given(any_settings())
def test_each_process_touches_only_its_own_topics(settings: Settings) -> None:
    inputs = set(settings.input_topics)
    worker = {*inputs, settings.topic_trajectories, settings.topic_dead_letter,
              settings.topic_changelog, settings.topic_commits}  # fmt: skip
    assert set(access.role_topics(settings, Role.WORKER)) == worker
    web = {settings.topic_labels, settings.topic_claims, settings.topic_trajectories}
    assert set(access.role_topics(settings, Role.WEB)) == web
    assert set(access.role_topics(settings, Role.PRODUCE)) == inputs
    for role in Role:  # every topic the process uses is checked at its start
        check = access.topic_check(settings, role)
        assert check.checks == access.role_topics(settings, role)
        topics = {g.resource.name for g in access.grants(settings, role)
                  if g.resource.kind is Kind.TOPIC}  # fmt: skip
        assert topics == set(access.role_topics(settings, role))
    web = access.grants(settings, Role.WEB)
    assert not any(g.resource.kind is Kind.GROUP for g in web)  # it reads without a group


@hypothesis_settings(max_examples=100)
@given(any_settings(), st.integers(0, 1023))
def test_the_join_names_its_transactional_ids_within_its_grant(
    settings: Settings, partition: int
) -> None:
    prefixes = [g.resource for g in access.grants(settings, Role.WORKER)
                if g.resource.kind is Kind.TRANSACTIONAL_ID]  # fmt: skip
    if settings.processing_guarantee == "at_least_once":
        assert prefixes == []
        return
    assert [p.prefixed for p in prefixes] == [True]
    assert access.transactional_id(settings, partition).startswith(prefixes[0].name)
    consumer, producer = access.join_consumer(settings), access.join_producer(settings)
    assert consumer.group == producer.group == settings.app_id  # offsets in the transactions


def refusal_of(grant: Grant) -> BaseException:
    """The error aiokafka raises when the broker refuses what ``grant`` allows."""
    if grant.resource.kind is Kind.TOPIC:
        return kafka_errors.TopicAuthorizationFailedError({grant.resource.name})
    if grant.resource.kind is Kind.GROUP:
        return kafka_errors.GroupAuthorizationFailedError()
    return kafka_errors.TransactionalIdAuthorizationFailed()


@hypothesis_settings(max_examples=100)
@given(any_settings(), st.sampled_from(list(Role)))
def test_a_refusal_names_the_operation_and_the_resource(settings: Settings, role: Role) -> None:
    for client in access.clients(settings, role):
        for grant in client.grants():
            if grant.operation not in (Op.READ, Op.WRITE) and grant.resource.kind is Kind.TOPIC:
                continue  # the topic check names what it lacks itself (authorized.missing)
            refused = access.refused(settings, role, client, refusal_of(grant))
            assert isinstance(refused, KafkaAccessError)
            assert grant in refused.grants
            assert f"{grant.operation} {grant.resource}" in str(refused)
            assert client.what in str(refused)
            assert f"--role {role}" in str(refused)
    client = access.clients(settings, role)[0]
    assert access.refused(settings, role, client, kafka_errors.KafkaConnectionError()) is None


def test_a_refusal_names_the_principal_and_where_it_comes_from() -> None:
    settings = Settings(kafka_security_protocol="SASL_SSL", kafka_sasl_mechanism="SCRAM-SHA-512",
                        kafka_sasl_username="rl-export-web", kafka_sasl_password="p")  # fmt: skip
    refused = access.access_error(settings, Role.WEB, [
        Grant(Resource(Kind.TOPIC, settings.topic_labels), Op.WRITE)])  # fmt: skip
    assert refused.setting == "RL_EXPORT_KAFKA_SASL_USERNAME"
    assert str(refused).startswith(
        "RL_EXPORT_KAFKA_SASL_USERNAME: the broker's ACLs do not let User:rl-export-web Write "
        "topic 'labels.submitted' (the label publisher)"
    )
    assert "\n" not in str(refused)
    cluster = access.refused(settings, Role.WEB, access.label_publisher(settings),
                             kafka_errors.ClusterAuthorizationFailedError())  # fmt: skip
    assert cluster is not None
    assert "IdempotentWrite the cluster (the label publisher: Kafka before 3.0)" in str(cluster)


# --- written out ---------------------------------------------------------------------------


def read_kafka_acls(text: str, principal: str) -> set[Grant]:
    """The grants a kafka-acls script adds (what kafka-acls itself would make of it)."""
    kinds = {"--topic": Kind.TOPIC, "--group": Kind.GROUP,
             "--transactional-id": Kind.TRANSACTIONAL_ID}  # fmt: skip
    found: set[Grant] = set()
    for line in text.splitlines():
        if line.startswith("#") or not line.strip():
            continue
        words = shlex.split(line)
        assert words[0] == "kafka-acls.sh"
        assert "--add" in words
        assert words[words.index("--allow-principal") + 1] == principal
        kind, name = next((kinds[w], words[i + 1]) for i, w in enumerate(words) if w in kinds)
        prefixed = "--resource-pattern-type" in words and (
            words[words.index("--resource-pattern-type") + 1] == "prefixed")  # fmt: skip
        resource = Resource(kind, name, prefixed)
        found |= {Grant(resource, Op(words[i + 1]))
                  for i, w in enumerate(words) if w == "--operation"}  # fmt: skip
    return found


def read_strimzi(text: str) -> tuple[dict[str, Any], set[Grant]]:
    user = yaml.safe_load(text)
    grants = set()
    for acl in user["spec"]["authorization"]["acls"]:
        found = acl["resource"]
        resource = Resource(Kind(found["type"]), str(found["name"]),
                            found["patternType"] == "prefix")  # fmt: skip
        grants |= {Grant(resource, Op(op)) for op in acl["operations"]}
    return user, grants


@hypothesis_settings(max_examples=60)
@given(any_settings(), st.sampled_from(list(Role)), st.sampled_from(["app-1", "User:CN=app"]))
def test_the_written_acls_read_back_to_the_grants(
    settings: Settings, role: Role, principal: str
) -> None:
    grants = set(access.grants(settings, role))
    script = acls.kafka_acls(settings, role, principal)
    assert read_kafka_acls(script, acls.principal_of(principal)) == grants
    user, written = read_strimzi(acls.strimzi_user(settings, role, principal, cluster="events"))
    assert written == grants
    assert user["kind"] == "KafkaUser"
    assert user["metadata"]["labels"]["strimzi.io/cluster"] == "events"
    assert user["spec"]["authorization"]["type"] == "simple"


def test_names_yaml_would_read_otherwise_are_quoted() -> None:
    settings = Settings(sink_group="sink: #1", app_id="true", topic_claims="1e5")
    _, written = read_strimzi(acls.strimzi_user(settings, Role.WORKER, "u", cluster="c"))
    assert Resource(Kind.GROUP, "sink: #1") in {g.resource for g in written}
    assert Resource(Kind.GROUP, "true") in {g.resource for g in written}
    _, written = read_strimzi(acls.strimzi_user(settings, Role.WEB, "u", cluster="c"))
    assert Resource(Kind.TOPIC, "1e5") in {g.resource for g in written}


def test_the_command_prints_both_and_each_alone(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["acls", "--principal", "rl-export-web", "--role", "web"]) == 0
    both = capsys.readouterr().out
    assert "kafka-acls.sh" in both
    assert "kind: KafkaUser" in both
    assert main(["acls", "--principal", "p", "--role", "produce", "--format", "strimzi",
                 "--cluster", "events"]) == 0  # fmt: skip
    only = capsys.readouterr().out
    assert "kafka-acls.sh" not in only
    assert yaml.safe_load(only.removeprefix("---\n"))["metadata"]["name"] == "p"
    assert main(["acls", "--principal", "", "--role", "web"]) == 2
    assert "--principal" in capsys.readouterr().err


def test_the_guide_lists_the_generated_acls() -> None:
    """docs/guides/configuration.md shows what `rl-export acls` derives for a managed
    cluster with the app id rl-export-prod and the other names at their defaults."""
    settings = Settings(app_id="rl-export-prod", create_topics=False)
    assert acls.acls_table(settings) in GUIDE.read_text(encoding="utf-8")
