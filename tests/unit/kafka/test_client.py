"""The one place Kafka clients get their connection from: settings checks, the options given
to aiokafka and librdkafka, secrets read from files, and which failures name which setting.
(The integration tests run every client against a SASL_SSL broker.)"""

from __future__ import annotations

import asyncio
import logging
import ssl
from pathlib import Path

import pytest
from aiokafka import errors as kafka_errors
from aiokafka.abc import AbstractTokenProvider

from rl_export.kafka.client import KafkaConnection, check_app_id, watch_refusals
from rl_export.model.errors import ConfigError
from rl_export.runtime.net import free_port
from rl_export.runtime.settings import load_settings
from tests.harness.tls import make_tls_files

SCRAM = {
    "kafka_security_protocol": "SASL_SSL",
    "kafka_sasl_mechanism": "SCRAM-SHA-512",
    "kafka_sasl_username": "app",
}


def test_plaintext_is_the_default_and_gives_only_the_bootstrap() -> None:
    kafka = KafkaConnection.of(load_settings(kafka_bootstrap="k1:9092,k2:9092"))
    assert kafka.aiokafka() == {"bootstrap_servers": "k1:9092,k2:9092",
                                "security_protocol": "PLAINTEXT"}  # fmt: skip
    assert kafka.confluent() == {"bootstrap.servers": "k1:9092,k2:9092",
                                 "security.protocol": "plaintext"}  # fmt: skip
    assert kafka.hosts() == [("k1", 9092), ("k2", 9092)]


@pytest.mark.parametrize(
    ("values", "variable"),
    [
        ({"kafka_security_protocol": "SASL_SSL"}, "RL_EXPORT_KAFKA_SASL_MECHANISM"),
        ({"kafka_sasl_mechanism": "PLAIN"}, "RL_EXPORT_KAFKA_SASL_MECHANISM"),
        ({**SCRAM}, "RL_EXPORT_KAFKA_SASL_PASSWORD_FILE"),
        ({**SCRAM, "kafka_sasl_password": "p", "kafka_sasl_password_file": "/run/p"},
         "RL_EXPORT_KAFKA_SASL_PASSWORD_FILE"),
        ({**SCRAM, "kafka_sasl_username": None, "kafka_sasl_password": "p"},
         "RL_EXPORT_KAFKA_SASL_USERNAME"),
        ({"kafka_security_protocol": "SSL", "kafka_ssl_cert_file": "/run/c.pem"},
         "RL_EXPORT_KAFKA_SSL_CERT_FILE"),
        ({"kafka_security_protocol": "TLS"}, "RL_EXPORT_KAFKA_SECURITY_PROTOCOL"),
        ({**SCRAM, "kafka_sasl_mechanism": "GSSAPI"}, "RL_EXPORT_KAFKA_SASL_MECHANISM"),
    ],
)  # fmt: skip
def test_settings_that_cannot_connect_are_refused_naming_the_variable(
    values: dict[str, object], variable: str
) -> None:
    with pytest.raises(ConfigError) as refused:
        load_settings(**values)
    assert refused.value.setting == variable


def test_an_oauthbearer_token_needs_no_username() -> None:
    settings = load_settings(
        kafka_security_protocol="SASL_SSL", kafka_sasl_mechanism="OAUTHBEARER",
        kafka_sasl_password="t",
    )  # fmt: skip
    assert settings.kafka_sasl_username is None


def test_the_password_never_shows_in_a_repr() -> None:
    settings = load_settings(**SCRAM, kafka_sasl_password="hunter2-secret")
    assert "hunter2-secret" not in repr(settings)
    assert "hunter2-secret" not in repr(KafkaConnection.of(settings))


def test_the_password_file_is_read_for_every_client(tmp_path: Path) -> None:
    secret = tmp_path / "password"
    secret.write_text("first\n")
    kafka = KafkaConnection.of(load_settings(**SCRAM, kafka_sasl_password_file=secret))
    assert kafka.aiokafka()["sasl_plain_password"] == "first"
    secret.write_text("rotated\n")  # a mounted secret, updated in place
    options = kafka.aiokafka()
    assert options["sasl_plain_password"] == "rotated"
    assert options["sasl_plain_username"] == "app"
    assert options["sasl_mechanism"] == "SCRAM-SHA-512"
    assert kafka.confluent()["sasl.password"] == "rotated"


def test_an_unreadable_password_file_names_its_variable(tmp_path: Path) -> None:
    kafka = KafkaConnection.of(
        load_settings(**SCRAM, kafka_sasl_password_file=tmp_path / "missing")
    )
    with pytest.raises(ConfigError) as refused:
        kafka.aiokafka()
    assert refused.value.setting == "RL_EXPORT_KAFKA_SASL_PASSWORD_FILE"


def test_an_oauthbearer_token_is_read_again_for_every_connection(tmp_path: Path) -> None:
    token_file = tmp_path / "token"
    token_file.write_text("token-1")
    kafka = KafkaConnection.of(load_settings(
        kafka_security_protocol="SASL_SSL", kafka_sasl_mechanism="OAUTHBEARER",
        kafka_sasl_password_file=token_file))  # fmt: skip
    provider = kafka.aiokafka()["sasl_oauth_token_provider"]
    assert isinstance(provider, AbstractTokenProvider)
    assert asyncio.run(provider.token()) == "token-1"
    token_file.write_text("token-2")
    assert asyncio.run(provider.token()) == "token-2"
    token, expires = kafka.confluent()["oauth_cb"]("")
    assert token == "token-2"
    assert expires > 0


def test_tls_verifies_the_certificate_and_the_hostname(tmp_path: Path) -> None:
    tls = make_tls_files(tmp_path)
    kafka = KafkaConnection("k:9093", "SSL", ssl_ca_file=tls.ca)
    context = kafka.aiokafka()["ssl_context"]
    assert isinstance(context, ssl.SSLContext)
    assert context.check_hostname
    assert context.verify_mode == ssl.CERT_REQUIRED
    config = kafka.confluent()
    assert config["ssl.endpoint.identification.algorithm"] == "https"
    assert config["ssl.ca.location"] == str(tls.ca)


def test_mutual_tls_loads_the_client_certificate(tmp_path: Path) -> None:
    tls = make_tls_files(tmp_path)  # the broker's key store serves as a client's key and cert
    kafka = KafkaConnection("k:9093", "SSL", ssl_ca_file=tls.ca, ssl_cert_file=tls.keystore,
                            ssl_key_file=tls.keystore)  # fmt: skip
    assert isinstance(kafka.aiokafka()["ssl_context"], ssl.SSLContext)
    assert kafka.confluent()["ssl.key.location"] == str(tls.keystore)
    broken = KafkaConnection("k:9093", "SSL", ssl_cert_file=tls.ca, ssl_key_file=tls.ca)
    with pytest.raises(ConfigError) as refused:
        broken.aiokafka()
    assert refused.value.setting == "RL_EXPORT_KAFKA_SSL_CERT_FILE"


def test_a_ca_file_that_is_no_certificate_names_its_variable(tmp_path: Path) -> None:
    junk = tmp_path / "ca.pem"
    junk.write_text("not a certificate")
    with pytest.raises(ConfigError) as refused:
        KafkaConnection("k:9093", "SSL", ssl_ca_file=junk).aiokafka()
    assert refused.value.setting == "RL_EXPORT_KAFKA_SSL_CA_FILE"


@pytest.mark.parametrize(
    ("error", "variable"),
    [
        (kafka_errors.SaslAuthenticationFailed("invalid credentials"),
         "RL_EXPORT_KAFKA_SASL_PASSWORD"),
        (kafka_errors.UnsupportedSaslMechanismError(), "RL_EXPORT_KAFKA_SASL_MECHANISM"),
        (ssl.SSLError(1, "[SSL: WRONG_VERSION_NUMBER] wrong version number"),
         "RL_EXPORT_KAFKA_SECURITY_PROTOCOL"),
    ],
)  # fmt: skip
def test_refusals_name_the_setting_to_fix(error: BaseException, variable: str) -> None:
    kafka = KafkaConnection("k:9093", "SASL_SSL", "SCRAM-SHA-256", "app", "secret")
    refused = kafka.refusal(error)
    assert refused is not None
    assert refused.setting == variable
    assert "secret" not in str(refused)


def test_an_unreachable_broker_is_no_refusal() -> None:
    kafka = KafkaConnection(f"127.0.0.1:{free_port()}")
    # A TLS broker going away mid-handshake: wait for it, it is no wrong setting.
    assert kafka.refusal(ssl.SSLEOFError(8, "EOF occurred in violation of protocol")) is None
    assert kafka.refusal(kafka_errors.KafkaConnectionError("no route")) is None
    assert kafka.refusal(ConnectionRefusedError()) is None
    assert asyncio.run(kafka.check(timeout_s=2)) is False


def test_a_refused_reconnection_in_aiokafka_logs_is_reported_once() -> None:
    kafka = KafkaConnection("k:9093", "SASL_SSL", "SCRAM-SHA-512", "app", "old")
    seen: list[str] = []
    client_log = logging.getLogger("aiokafka.conn")
    with watch_refusals(kafka, lambda exc: seen.append(exc.setting)):
        # How aiokafka logs a failed connection to a node (the error among the arguments).
        client_log.error("Unable connect to node with id %s: %s", 1, OSError("reset"))
        assert seen == []
        for _ in range(2):
            failed = kafka_errors.SaslAuthenticationFailed("invalid credentials")
            client_log.error("Unable connect to node with id %s: %s", 1, failed)
    client_log.error("after: %s", kafka_errors.SaslAuthenticationFailed("x"))
    assert seen == ["RL_EXPORT_KAFKA_SASL_PASSWORD"]


@pytest.mark.parametrize(
    ("bootstrap", "app_id", "refused"),
    [
        ("127.0.0.1:9092", "rl-export", False),
        ("localhost:9092,[::1]:9093", "rl-export", False),
        ("kafka-1.internal:9092", "rl-export", True),
        ("127.0.0.1:9092,10.0.0.7:9092", "rl-export", True),
        ("kafka-1.internal:9092", "rl-export-prod", False),
    ],
)
def test_a_worker_off_this_machine_refuses_the_default_app_id(
    bootstrap: str, app_id: str, refused: bool
) -> None:
    settings = load_settings(kafka_bootstrap=bootstrap, app_id=app_id)
    if not refused:
        check_app_id(settings)
        return
    with pytest.raises(ConfigError) as error:
        check_app_id(settings)
    assert error.value.setting == "RL_EXPORT_APP_ID"
