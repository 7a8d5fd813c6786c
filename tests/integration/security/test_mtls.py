"""Mutual TLS against a broker with ``ssl.client.auth=required``: every refusal names its cause.

One broker for the module, with a second listener (``MTLS``: TLS, a client certificate
required) beside its SASL_SSL one; the client certificates come from the test's CA
(:mod:`tests.harness.tls`). A certificate the broker accepts, with its key encrypted and the
password in a file, lets every process in; a missing, expired or foreign certificate, and an
encrypted key without its password, end the worker, the web service and ``produce`` within
60 s with one line naming the setting and the cause (with TLS 1.3 the broker's refusal is an
alert after the handshake), and no traceback or unclosed client on the way out.
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest

from rl_export.kafka.client import KafkaConnection
from rl_export.local.broker import LocalKafka, SaslSslListener
from rl_export.runtime.net import free_port
from rl_export.runtime.settings import Settings
from rl_export.stream.topics import ensure_service_topics
from tests.harness.tls import KEY_PASSWORD, TlsFiles, make_tls_files
from tests.integration.conftest import run_settings, unique
from tests.integration.workers import settings_env
from tests.records import trace_events

CERT = "RL_EXPORT_KAFKA_SSL_CERT_FILE"
NOISE = ("Traceback", "Unclosed", "Task was destroyed", "Enter PEM pass phrase")


class Mtls:
    def __init__(self, broker: LocalKafka, port: int, tls: TlsFiles, folder: Path) -> None:
        self.broker = broker
        self.port = port
        self.tls = tls
        self.password_file = folder / "key-password"
        self.password_file.write_text(KEY_PASSWORD + "\n")

    def settings(self, data_dir: Path, **extra: Any) -> Settings:
        security: dict[str, Any] = {
            "kafka_security_protocol": "SSL",
            "kafka_ssl_ca_file": self.tls.ca,
            "kafka_ssl_cert_file": self.tls.client_cert,
            "kafka_ssl_key_file": self.tls.client_key_encrypted,
            "kafka_ssl_key_password_file": self.password_file,
        }
        settings = run_settings(self.broker, unique("mtls"), data_dir, str(data_dir / "store"),
                                **(security | extra))  # fmt: skip
        return settings.model_copy(update={"kafka_bootstrap": f"127.0.0.1:{self.port}"})


@pytest.fixture(scope="module")
def mtls(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Mtls]:
    folder = tmp_path_factory.mktemp("mtls-kafka")
    tls = make_tls_files(folder / "tls")
    port = free_port()
    listener = SaslSslListener(tls.keystore, tls.ca, {"admin": "admin-secret-for-the-test"},
                               mtls_port=port)  # fmt: skip
    broker = LocalKafka(folder / "broker", free_port(), heap="384m", sasl_ssl=listener)
    broker.start()
    try:
        yield Mtls(broker, port, tls, folder)
    finally:
        broker.stop()


def run(settings: Settings, *args: str, timeout_s: float = 60) -> tuple[int, str, float]:
    """Run a command as the operator would; its exit code, stderr and how long it took."""
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "rl_export.cli", *args], env=settings_env(settings),
        capture_output=True, text=True, timeout=timeout_s, check=False, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    return done.returncode, done.stderr, time.monotonic() - started


async def test_an_accepted_certificate_with_an_encrypted_key_lets_every_client_in(
    mtls: Mtls, tmp_path: Path
) -> None:
    settings = mtls.settings(tmp_path / "var")
    assert await KafkaConnection.of(settings).check()
    counts = await ensure_service_topics(settings)
    assert set(counts.values()) == {settings.partitions}
    events = tmp_path / "events.jsonl"
    events.write_bytes(b"".join(orjson.dumps(e) + b"\n"
                                for e in trace_events(1, score=0.5, passed=True)))  # fmt: skip
    code, stderr, _ = run(settings, "produce", str(events))
    assert code == 0, stderr


REFUSALS = [
    pytest.param({"kafka_ssl_cert_file": None, "kafka_ssl_key_file": None,
                  "kafka_ssl_key_password_file": None}, CERT,
                 "the broker requires a TLS client certificate", id="no-certificate"),
    pytest.param({"kafka_ssl_cert_file": "expired_cert"}, CERT, "it expired on", id="expired"),
    pytest.param({"kafka_ssl_cert_file": "stranger_cert"}, CERT,
                 "signed by an authority the broker's trust store holds", id="other-ca"),
    pytest.param({"kafka_ssl_key_password_file": None}, "RL_EXPORT_KAFKA_SSL_KEY_PASSWORD",
                 "is encrypted", id="key-without-password"),
    pytest.param({"kafka_ssl_key_password_file": None, "kafka_ssl_key_password": "wrong"},
                 "RL_EXPORT_KAFKA_SSL_KEY_PASSWORD", "cannot decrypt", id="wrong-password"),
]  # fmt: skip


def refused_settings(mtls: Mtls, data_dir: Path, change: dict[str, Any]) -> Settings:
    values = {k: getattr(mtls.tls, v) if isinstance(v, str) and hasattr(mtls.tls, v) else v
              for k, v in change.items()}  # fmt: skip
    return mtls.settings(data_dir, **values)


def assert_one_line(stderr: str, setting: str, words: str) -> None:
    errors = [line for line in stderr.splitlines() if line.startswith("rl-export: error:")]
    assert len(errors) == 1, stderr
    assert errors[0].startswith(f"rl-export: error: {setting}: "), errors[0]
    assert words in errors[0]
    assert not any(noise in stderr for noise in NOISE), stderr


@pytest.mark.parametrize(("change", "setting", "words"), REFUSALS)
def test_a_refused_certificate_or_key_ends_the_worker_in_one_line(
    mtls: Mtls, tmp_path: Path, change: dict[str, Any], setting: str, words: str
) -> None:
    settings = refused_settings(mtls, tmp_path / "var", change)
    code, stderr, took = run(settings, "worker")
    assert code == 2
    assert took < 60
    assert_one_line(stderr, setting, words)


@pytest.mark.parametrize("case", [
    pytest.param(("web", *REFUSALS[2].values), id="web-other-ca"),
    pytest.param(("web", *REFUSALS[1].values), id="web-expired"),
    pytest.param(("produce", *REFUSALS[0].values), id="produce-no-certificate"),
    pytest.param(("web", *REFUSALS[3].values), id="web-key-without-password"),
])  # fmt: skip
def test_the_web_service_and_produce_end_too(
    mtls: Mtls, tmp_path: Path, case: tuple[str, dict[str, Any], str, str]
) -> None:
    command, change, setting, words = case
    settings = refused_settings(mtls, tmp_path / "var", change).model_copy(
        update={"web_port": free_port(), "web_metrics_port": free_port()}
    )
    events = tmp_path / "events.jsonl"
    events.write_text("{}\n")
    args = ["produce", str(events)] if command == "produce" else ["web"]
    code, stderr, took = run(settings, *args)
    assert code == 2
    assert took < 60
    assert_one_line(stderr, setting, words)
