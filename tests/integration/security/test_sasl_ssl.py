"""Every Kafka client of the project on a broker whose only listener is SASL_SSL.

One broker for the session (a CA and a broker certificate made here, SCRAM users made when
its storage is formatted): ``rl-export produce`` publishes traces, a worker joins them and
its sink writes the corpora, a label goes through the web service to the labels topic and
into the human corpus, and a librdkafka (confluent-kafka) consumer reads ``trajectories``
with the same settings. Wrong settings end a process quickly, naming the setting to fix.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer

from rl_export.corpora.layout import CorpusRef
from rl_export.corpora.reader import CorpusReader
from rl_export.corpora.store import open_store
from rl_export.kafka.client import KafkaConnection
from rl_export.local.broker import LocalKafka, SaslSslListener
from rl_export.model.errors import KafkaSecurityError
from rl_export.runtime.net import free_port
from rl_export.runtime.settings import Settings
from rl_export.stream.topics import ensure_service_topics
from tests.harness.tls import TlsFiles, make_tls_files
from tests.integration.conftest import run_settings, unique
from tests.integration.web.conftest import make_tokens
from tests.integration.webproc import WebProcess, wait_for
from tests.integration.workers import WorkerProcess, settings_env
from tests.records import trace_events

USER, PASSWORD = "rl-export", "s3cret-for-the-test"
TRACES = 4
RUBRIC = {"correctness": 5, "helpfulness": 4, "efficiency": 4, "safety": 5}


class Secured:
    def __init__(self, broker: LocalKafka, tls: TlsFiles, folder: Path) -> None:
        self.broker = broker
        self.tls = tls
        self.password_file = folder / "password"
        self.password_file.write_text(PASSWORD + "\n")
        self.wrong_file = folder / "wrong-password"
        self.wrong_file.write_text("not-the-password\n")

    def settings(self, data_dir: Path, **extra: Any) -> Settings:
        security: dict[str, Any] = {
            "kafka_security_protocol": "SASL_SSL",
            "kafka_sasl_mechanism": "SCRAM-SHA-512",
            "kafka_sasl_username": USER,
            "kafka_sasl_password_file": self.password_file,
            "kafka_ssl_ca_file": self.tls.ca,
        }
        return run_settings(self.broker, unique("sec"), data_dir, str(data_dir / "store"),
                            **(security | extra))  # fmt: skip


@pytest.fixture(scope="session")
def secured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Secured]:
    folder = tmp_path_factory.mktemp("secured-kafka")
    tls = make_tls_files(folder / "tls")
    users = {"admin": "admin-secret-for-the-test", USER: PASSWORD}
    broker = LocalKafka(folder / "broker", free_port(), heap="384m",
                        sasl_ssl=SaslSslListener(tls.keystore, tls.ca, users))  # fmt: skip
    broker.start()
    try:
        yield Secured(broker, tls, folder)
    finally:
        broker.stop()


def cli(settings: Settings, *args: str, timeout_s: float = 120,
        **env: str) -> subprocess.CompletedProcess[str]:  # fmt: skip
    return subprocess.run(
        [sys.executable, "-m", "rl_export.cli", *args], env=settings_env(settings, **env),
        capture_output=True, text=True, timeout=timeout_s, check=False,
    )  # fmt: skip


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


def test_produce_join_sink_web_label_and_librdkafka_over_sasl_ssl(
    secured: Secured, tmp_path: Path
) -> None:
    # With static membership too, as the Kubernetes manifests run the worker.
    settings = secured.settings(tmp_path / "var", join_processes=1, shard_max_age_s=1.0,
                                web_index_poll_s=0.25, web_publish_timeout_s=10.0,
                                instance_id="rl-export-worker-0")  # fmt: skip
    events = tmp_path / "events.jsonl"
    lines = [json.dumps(e) for n in range(TRACES)
             for e in trace_events(n, score=0.5 + n / 10, passed=True, minute=n)]  # fmt: skip
    events.write_text("\n".join(lines) + "\n")
    produced = cli(settings, "produce", str(events))
    assert produced.returncode == 0, produced.stderr
    assert "Traceback" not in produced.stderr

    worker = WorkerProcess(settings, "worker").start()
    try:

        def traced() -> bool:
            return len(latest(settings, "traces")) == TRACES

        assert wait_for("the produced traces in the corpus", traced, timeout_s=120)
        web = WebProcess(settings, "web").start()
        try:
            tokens, _ = asyncio.run(make_tokens(settings))
            with web.client(tokens["admin"]) as admin:
                response = admin.post("labels", json={"trace_id": "tr-001", "rubric": RUBRIC})
                assert response.status_code == 202, response.text

            def labeled() -> dict[str, Any] | None:
                return latest(settings, "human").get("tr-001")

            record = wait_for("the label in the human corpus", labeled, timeout_s=120)
            assert "ana" in record["labelers"]
            assert record["rubric"] == {k: float(v) for k, v in RUBRIC.items()}
        finally:
            web.stop()
    finally:
        worker.stop()

    # Another team's librdkafka consumer, configured from the same settings.
    consumer = Consumer(KafkaConnection.of(settings).confluent() | {
        "group.id": unique("librdkafka"), "auto.offset.reset": "earliest",
        "isolation.level": "read_committed", "enable.auto.commit": False,
    })  # fmt: skip
    consumer.subscribe([settings.topic_trajectories])
    seen: dict[str, dict[str, Any]] = {}
    wanted = {f"tr-{n:03d}" for n in range(TRACES)}

    def done() -> bool:
        return set(seen) == wanted and "ana" in seen["tr-001"]["labelers"]

    deadline = time.monotonic() + 60
    try:
        while time.monotonic() < deadline and not done():
            message = consumer.poll(0.5)
            if message is None or message.error() is not None or message.value() is None:
                continue
            snapshot = json.loads(message.value())
            seen[snapshot["trace_id"]] = snapshot
    finally:
        consumer.close()
    assert set(seen) == wanted
    assert "ana" in seen["tr-001"]["labelers"]


def test_a_wrong_password_ends_the_worker_quickly_naming_the_setting(
    secured: Secured, tmp_path: Path
) -> None:
    settings = secured.settings(tmp_path / "var", kafka_sasl_password_file=secured.wrong_file)
    # The contract: within 60 s (a retry loop would run into the timeout and fail here).
    result = cli(settings, "worker", timeout_s=60)
    assert result.returncode != 0
    assert "RL_EXPORT_KAFKA_SASL_PASSWORD_FILE" in result.stderr
    assert "SCRAM-SHA-512" in result.stderr
    assert "Traceback" not in result.stderr
    assert "not-the-password" not in result.stderr + result.stdout


def test_a_wrong_password_ends_the_web_service_naming_the_setting(
    secured: Secured, tmp_path: Path
) -> None:
    settings = secured.settings(tmp_path / "var", kafka_sasl_password_file=secured.wrong_file,
                                web_port=free_port())  # fmt: skip
    result = cli(settings, "web", timeout_s=60)  # it stops its server by itself
    assert result.returncode != 0
    assert "RL_EXPORT_KAFKA_SASL_PASSWORD_FILE" in result.stderr
    assert "Traceback" not in result.stderr
    assert "not-the-password" not in result.stderr + result.stdout


@pytest.mark.parametrize(
    ("change", "setting"),
    [
        ({"kafka_ssl_ca_file": "other_ca"}, "RL_EXPORT_KAFKA_SSL_CA_FILE"),
        ({"kafka_sasl_mechanism": "PLAIN"}, "RL_EXPORT_KAFKA_SASL_MECHANISM"),
        ({"kafka_security_protocol": "SSL", "kafka_sasl_mechanism": None,
          "kafka_sasl_username": None, "kafka_sasl_password_file": None},
         "RL_EXPORT_KAFKA_SECURITY_PROTOCOL"),
        ({"kafka_security_protocol": "PLAINTEXT", "kafka_sasl_mechanism": None,
          "kafka_sasl_username": None, "kafka_sasl_password_file": None},
         "RL_EXPORT_KAFKA_SECURITY_PROTOCOL"),
        ({"kafka_bootstrap": "localhost:{port}", "kafka_sasl_username": "nobody"},
         "RL_EXPORT_KAFKA_SASL_PASSWORD_FILE"),
    ],
)  # fmt: skip
async def test_a_refused_handshake_or_login_names_the_setting(
    secured: Secured, tmp_path: Path, change: dict[str, Any], setting: str
) -> None:
    values = dict(change)
    if values.get("kafka_ssl_ca_file") == "other_ca":
        values["kafka_ssl_ca_file"] = secured.tls.other_ca
    if "kafka_bootstrap" in values:  # the certificate names localhost too
        values["kafka_bootstrap"] = values["kafka_bootstrap"].format(port=secured.broker.port)
    settings = secured.settings(tmp_path / "var").model_copy(update=values)
    with pytest.raises(KafkaSecurityError) as refused:
        await ensure_service_topics(settings, wait_s=30)
    assert refused.value.setting == setting


async def test_the_right_settings_pass_the_check(secured: Secured, tmp_path: Path) -> None:
    settings = secured.settings(tmp_path / "var")
    assert await KafkaConnection.of(settings).check()
    counts = await ensure_service_topics(settings)
    assert set(counts.values()) == {settings.partitions}
