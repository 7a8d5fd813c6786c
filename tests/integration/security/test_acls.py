"""Each process with exactly the ACLs `rl-export acls` prints, under KRaft's StandardAuthorizer.

One broker for the module: SASL_SSL with SCRAM users (``admin``, a super user, and one user
per process), ``allow.everyone.if.no.acl.found=false``, topics made beforehand by the admin
(``RL_EXPORT_CREATE_TOPICS=false``, as on a managed cluster). The ACLs are granted by running
the kafka-acls commands `rl-export acls` prints, with Kafka's own ``AclCommand``.

1. What those commands grant is exactly the derived set, for each process.
2. That set is enough: ``produce`` publishes traces, a worker joins them (dead-lettering an
   invalid event and forwarding one that arrived on another partition) and its sink writes
   the corpora, and the web service publishes a label and a claim and follows both topics.
3. Each entry is needed: with any one of them removed, the process it belongs to stops within
   60 s with one line naming the operation and the resource (the web service, missing only
   Write on the labels topic, is not ready instead).
"""

from __future__ import annotations

import asyncio
import gc
import json
import os
import stat
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from confluent_kafka.admin import (
    AclBinding,
    AclBindingFilter,
    AclOperation,
    AclPermissionType,
    AdminClient,
    ResourcePatternType,
    ResourceType,
)

from rl_export.corpora.layout import CorpusRef
from rl_export.corpora.reader import CorpusReader
from rl_export.corpora.store import open_store
from rl_export.kafka import access
from rl_export.kafka.access import Grant, Kind, Role
from rl_export.kafka.client import KafkaConnection
from rl_export.local.broker import LocalKafka, SaslSslListener, kafka_libs
from rl_export.model.partitioning import partition_function
from rl_export.runtime.net import free_port
from rl_export.runtime.settings import Settings
from rl_export.stream.topics import ensure_service_topics
from tests.harness.tls import TlsFiles, make_tls_files
from tests.integration.conftest import run_settings, unique
from tests.integration.web.conftest import make_tokens
from tests.integration.webproc import WebProcess, wait_for
from tests.integration.workers import WorkerProcess, settings_env
from tests.records import trace_events

ADMIN = ("admin", "admin-secret-for-the-test")
PASSWORDS = {role: f"{role}-secret-for-the-test" for role in Role}
NOISE = ("Traceback", "Unclosed", "Task was destroyed")
RUBRIC = {"correctness": 5, "helpfulness": 4, "efficiency": 4, "safety": 5}
# The grants' places per role, for the tests' ids: the same with every run's names.
TEMPLATE = Settings(create_topics=False)


class Cluster:
    """The broker, the run's names, and an admin that can change ACLs."""

    def __init__(self, broker: LocalKafka, tls: TlsFiles, folder: Path) -> None:
        self.broker = broker
        self.tls = tls
        self.folder = folder
        self.run = unique("acl")
        for role, password in PASSWORDS.items():
            (folder / f"{role}.password").write_text(password + "\n")
        self.admin = AdminClient(KafkaConnection.of(self.settings(None)).confluent())

    def settings(self, role: Role | None, **extra: Any) -> Settings:
        user, password_file = ADMIN[0], None
        if role is not None:
            user, password_file = str(role), self.folder / f"{role}.password"
        security: dict[str, Any] = {
            "kafka_security_protocol": "SASL_SSL", "kafka_sasl_mechanism": "SCRAM-SHA-512",
            "kafka_sasl_username": user, "kafka_ssl_ca_file": self.tls.ca,
            "create_topics": False, "join_processes": 1,
            "shard_max_age_s": 1.0, "web_index_poll_s": 0.25,
        }  # fmt: skip
        if password_file is None:
            security["kafka_sasl_password"] = ADMIN[1]
        else:
            security["kafka_sasl_password_file"] = password_file
        data = self.folder / "var"
        made = run_settings(self.broker, self.run, data, str(data / "store"), **security)
        return made.model_copy(update={"partitions": 2, **extra})

    def bindings(self, role: Role, grants: list[Grant]) -> list[AclBinding]:
        return [binding(f"User:{role}", grant) for grant in grants]

    def acls_of(self, role: Role) -> set[tuple[Any, ...]]:
        found = self.admin.describe_acls(AclBindingFilter(
            ResourceType.ANY, None, ResourcePatternType.ANY, f"User:{role}", None,
            AclOperation.ANY, AclPermissionType.ANY)).result(30)  # fmt: skip
        return {key(b) for b in found}

    def change(self, role: Role, grant: Grant, *, add: bool) -> None:
        """Add or remove one ACL and wait until the broker's authorizer has it."""
        made = binding(f"User:{role}", grant)
        if add:
            for future in self.admin.create_acls([made]).values():
                future.result(30)
        else:
            for future in self.admin.delete_acls([as_filter(made)]).values():
                future.result(30)
        wait_for(f"the ACL {grant} of {role} {'added' if add else 'removed'}",
                 lambda: (key(made) in self.acls_of(role)) == add, timeout_s=30)  # fmt: skip


_KINDS = {Kind.TOPIC: ResourceType.TOPIC, Kind.GROUP: ResourceType.GROUP,
          Kind.TRANSACTIONAL_ID: ResourceType.TRANSACTIONAL_ID}  # fmt: skip


def binding(principal: str, grant: Grant) -> AclBinding:
    pattern = ResourcePatternType.PREFIXED if grant.resource.prefixed else (
        ResourcePatternType.LITERAL)  # fmt: skip
    operation = AclOperation[grant.operation.value.replace("Configs", "_Configs").upper()]
    return AclBinding(_KINDS[grant.resource.kind], grant.resource.name, pattern, principal, "*",
                      operation, AclPermissionType.ALLOW)  # fmt: skip


def as_filter(made: AclBinding) -> AclBindingFilter:
    return AclBindingFilter(made.restype, made.name, made.resource_pattern_type, made.principal,
                            made.host, made.operation, made.permission_type)  # fmt: skip


def key(made: AclBinding) -> tuple[Any, ...]:
    return (made.restype, made.name, made.resource_pattern_type, made.principal, made.operation,
            made.permission_type)  # fmt: skip


def kafka_acls_tool(folder: Path) -> Path:
    """``kafka-acls.sh``: Kafka's AclCommand from the broker's jars, as the printed commands
    call it; an admin's client properties beside it."""
    bin_dir = folder / "bin"
    bin_dir.mkdir()
    tool = bin_dir / "kafka-acls.sh"
    tool.write_text(f'#!/bin/sh\nexec java -Xshare:auto -XX:TieredStopAtLevel=1 -cp '
                    f'"{kafka_libs()}/*" kafka.admin.AclCommand "$@"\n')  # fmt: skip
    tool.chmod(tool.stat().st_mode | stat.S_IXUSR)
    return bin_dir


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    folder = tmp_path_factory.mktemp("acl-kafka")
    tls = make_tls_files(folder / "tls")
    users = {ADMIN[0]: ADMIN[1], **{str(role): p for role, p in PASSWORDS.items()}}
    listener = SaslSslListener(tls.keystore, tls.ca, users, authorizer=True)
    broker = LocalKafka(folder / "broker", free_port(), heap="384m", sasl_ssl=listener)
    broker.start()
    try:
        made = Cluster(broker, tls, folder)
        asyncio.run(ensure_service_topics(made.settings(None, create_topics=True)))
        admin_config = folder / "admin.properties"
        admin_config.write_text(
            "security.protocol=SASL_SSL\nsasl.mechanism=SCRAM-SHA-512\n"
            "sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule "
            f'required username="{ADMIN[0]}" password="{ADMIN[1]}";\n'
            f"ssl.truststore.type=PEM\nssl.truststore.location={tls.ca}\n"
        )  # fmt: skip
        bin_dir = kafka_acls_tool(folder)
        for role in Role:  # grant each user exactly what `rl-export acls` prints
            printed = cli(made.settings(role), "acls", "--principal", str(role), "--role",
                          str(role), "--format", "kafka-acls")  # fmt: skip
            assert printed.returncode == 0, printed.stderr
            env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}",
                   "BOOTSTRAP": broker.bootstrap, "ADMIN_CONFIG": str(admin_config)}  # fmt: skip
            ran = subprocess.run(["sh", "-e"], input=printed.stdout, env=env, text=True,
                                 capture_output=True, timeout=600, check=False)  # fmt: skip
            assert ran.returncode == 0, ran.stderr[-2000:]
        yield made
        del made.admin  # librdkafka's client ends with its last reference, before the broker
        gc.collect()
    finally:
        broker.stop()


def cli(settings: Settings, *args: str, timeout_s: float = 90) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "rl_export.cli", *args], env=settings_env(settings),
        capture_output=True, text=True, timeout=timeout_s, check=False, stdin=subprocess.DEVNULL,
    )  # fmt: skip


def test_the_printed_commands_grant_exactly_the_derived_acls(cluster: Cluster) -> None:
    for role in Role:
        wanted = access.grants(cluster.settings(role), role)
        assert cluster.acls_of(role) == {key(b) for b in cluster.bindings(role, wanted)}, role


def latest(settings: Settings, corpus: str) -> dict[str, dict[str, Any]]:
    async def read() -> dict[str, dict[str, Any]]:
        store = open_store(settings.store_url)
        try:
            reader = CorpusReader(store, CorpusRef("acme", "bot", corpus))
            return {r["trace_id"]: r async for r in reader.records(latest_only=True)}
        finally:
            await store.close()

    try:
        return asyncio.run(read())
    except Exception:  # not written yet
        return {}


async def read_topic(settings: Settings, topic: str, count: int) -> list[Any]:
    """Read ``count`` committed records of a topic as the admin (no group)."""
    consumer = AIOKafkaConsumer(
        topic, **KafkaConnection.of(settings).aiokafka(), group_id=None,
        auto_offset_reset="earliest", isolation_level="read_committed",
    )  # fmt: skip
    await consumer.start()
    found: list[Any] = []
    try:
        deadline = time.monotonic() + 60
        while len(found) < count and time.monotonic() < deadline:
            for records in (await consumer.getmany(timeout_ms=500)).values():
                found += records
    finally:
        await consumer.stop()
    return found


async def misroute(settings: Settings, event: dict[str, Any]) -> None:
    """Send an event to another partition than its trace's, as the admin."""
    home = partition_function(settings.partitioner)(event["trace_id"].encode(), 2)
    producer = AIOKafkaProducer(**KafkaConnection.of(settings).aiokafka())
    await producer.start()
    try:
        key = event["trace_id"].encode()
        await producer.send_and_wait(settings.topic_traces, orjson.dumps(event), key=key,
                                     partition=1 - home)  # fmt: skip
    finally:
        await producer.stop()


def test_the_acls_are_enough_for_every_process(cluster: Cluster, tmp_path: Path) -> None:
    admin = cluster.settings(None)
    events = tmp_path / "events.jsonl"
    good = [e for n in range(3) for e in trace_events(n, score=0.8, passed=True, minute=n)]
    invalid = dict(trace_events(9, score=0.5, passed=True)[1])  # an evaluation of a score 1.5
    invalid["results"] = [{**invalid["results"][0], "score": 1.5}]
    events.write_text("\n".join(json.dumps(e) for e in [*good, invalid]) + "\n")
    produced = cli(cluster.settings(Role.PRODUCE), "produce", str(events))
    assert produced.returncode == 0, produced.stderr
    asyncio.run(misroute(admin, trace_events(5, score=0.5, passed=True, minute=5)[0]))

    worker = WorkerProcess(cluster.settings(Role.WORKER), "worker").start(timeout_s=120)
    try:
        wanted = {"tr-000", "tr-001", "tr-002", "tr-005"}
        wait_for("the traces in the corpus", lambda: wanted <= set(latest(admin, "traces")),
                 timeout_s=120)  # fmt: skip
        dead = asyncio.run(read_topic(admin, admin.topic_dead_letter, 1))
        assert [dict(r.headers)["rl-export-reason"] for r in dead] == [b"invalid"]
        web = WebProcess(cluster.settings(Role.WEB), "web").start(timeout_s=120)
        try:
            tokens, _ = asyncio.run(make_tokens(admin))
            with web.client(tokens["queue"]) as api:
                claimed = wait_for("a claim", lambda: api.post("queue/claim", json={}).json()
                                   .get("items"), timeout_s=60)  # fmt: skip
                trace_id = claimed[0]["trace_id"]
                answer = api.post("labels", json={"trace_id": trace_id, "rubric": RUBRIC})
                assert answer.status_code == 202, answer.text
            wait_for("the label in the human corpus",
                     lambda: "flo" in latest(admin, "human").get(trace_id, {}).get("labelers", []),
                     timeout_s=120)  # fmt: skip
            assert asyncio.run(read_topic(admin, admin.topic_claims, 1))
            assert web.ready()
        finally:
            web.stop()
        assert worker.ready()
    finally:
        worker.stop()
    for log in (worker.log_path, web.log_path):  # no refusal, not even one retried
        assert "ACLs do not let" not in log.read_text(errors="replace"), log


def every_grant() -> list[Any]:
    return [pytest.param(role, n, id=f"{role}-{grant.operation}-{grant.resource.kind}-{n}")
            for role in Role for n, grant in enumerate(access.grants(TEMPLATE, role))]  # fmt: skip


@pytest.mark.parametrize(("role", "place"), every_grant())
def test_without_any_one_acl_the_process_names_it(
    cluster: Cluster, tmp_path: Path, role: Role, place: int
) -> None:
    settings = cluster.settings(role, web_port=free_port(), web_metrics_port=free_port(),
                                data_dir=tmp_path / "var")  # fmt: skip
    grant = access.grants(settings, role)[place]
    named = f"{grant.operation} {grant.resource}"
    cluster.change(role, grant, add=False)
    try:
        if role is Role.WEB and grant.operation.value == "Write" and (
                grant.resource.name == settings.topic_labels):  # fmt: skip
            web = WebProcess(settings, "web")
            web._spawn([sys.executable, "-m", "rl_export.cli", "web"], env=web.env)
            try:
                answer = wait_for("/readyz naming labels", lambda: not_ready(web), timeout_s=60)
                assert answer == {"ready": False, "labels": "not allowed"}
                wait_for("the line in the log", lambda: named in web.log_path.read_text())
            finally:
                web.stop()
            return
        args = {Role.WORKER: ["worker"], Role.WEB: ["web"],
                Role.PRODUCE: ["produce", str(events_file(tmp_path))]}[role]  # fmt: skip
        started = time.monotonic()
        done = cli(settings, *args, timeout_s=60)
        assert time.monotonic() - started < 60
        assert done.returncode == 2, done.stderr
        errors = [line for line in done.stderr.splitlines() if line.startswith("rl-export: error:")]
        assert len(errors) == 1, done.stderr
        assert named in errors[0], errors[0]
        assert f"User:{role}" in errors[0]
        assert not any(noise in done.stderr for noise in NOISE), done.stderr
    finally:
        cluster.change(role, grant, add=True)


def not_ready(web: WebProcess) -> dict[str, Any] | None:
    try:
        answer = httpx.get(web.base + "/readyz", timeout=2)
    except httpx.HTTPError:
        return None
    body: dict[str, Any] = answer.json()
    return body if answer.status_code == 503 and "labels" in body else None


def events_file(folder: Path) -> Path:
    path = folder / "events.jsonl"
    path.write_text(json.dumps(trace_events(7, score=0.5, passed=True)[0]) + "\n")
    return path


def test_an_acl_removed_while_the_worker_runs_ends_it_naming_the_acl(cluster: Cluster) -> None:
    """The join (in a join process) is refused a dead letter's Write: the worker ends with
    the join process's line, instead of retrying the batch for ever."""
    settings = cluster.settings(Role.WORKER)
    dead_letters = Grant(access.Resource(Kind.TOPIC, settings.topic_dead_letter),
                         access.Op.WRITE)  # fmt: skip
    assert dead_letters in access.grants(settings, Role.WORKER)
    worker = WorkerProcess(settings, "worker-refused").start(timeout_s=120)
    cluster.change(Role.WORKER, dead_letters, add=False)
    try:
        invalid = trace_events(8, score=0.5, passed=True)[1]
        invalid["results"] = [{**invalid["results"][0], "score": 7}]
        asyncio.run(send_as_admin(cluster.settings(None), settings.topic_evaluations, invalid))
        assert worker.proc is not None
        code = worker.proc.wait(60)
        assert code == 2
        log = worker.log_path.read_text(errors="replace")
        errors = [line for line in log.splitlines() if line.startswith("rl-export: error:")]
        assert len(errors) == 1, log[-3000:]
        assert f"Write topic '{settings.topic_dead_letter}' (the join's producers)" in errors[0]
        assert not any(noise in log for noise in NOISE), log[-3000:]
    finally:
        worker.stop()
        cluster.change(Role.WORKER, dead_letters, add=True)


async def send_as_admin(settings: Settings, topic: str, event: dict[str, Any]) -> None:
    producer = AIOKafkaProducer(**KafkaConnection.of(settings).aiokafka())
    await producer.start()
    try:
        await producer.send_and_wait(topic, orjson.dumps(event), key=event["trace_id"].encode())
    finally:
        await producer.stop()
