"""AWS_MSK_IAM: the settings it needs, and the signer's token as both clients take it.

The signer (``aws-msk-iam-sasl-signer-python``) is mocked at its boundary,
``MSKAuthTokenProvider.generate_auth_token``: no AWS credentials, no network.
"""

from __future__ import annotations

import asyncio
import sys
import time

import pytest
from aiokafka import errors as kafka_errors
from aiokafka.abc import AbstractTokenProvider
from aws_msk_iam_sasl_signer import MSKAuthTokenProvider

from rl_export.kafka.client import KafkaConnection
from rl_export.model.errors import ConfigError
from rl_export.runtime.settings import load_settings

MSK = {
    "kafka_bootstrap": "b-1.prod.kafka.eu-west-1.amazonaws.com:9098",
    "kafka_security_protocol": "SASL_SSL",
    "kafka_sasl_mechanism": "AWS_MSK_IAM",
    "kafka_msk_region": "eu-west-1",
}


class FakeSigner:
    """Stands for the signer: counts its calls, hands out tokens that live ``lifetime_s``."""

    def __init__(self, lifetime_s: float) -> None:
        self.lifetime_s = lifetime_s
        self.regions: list[str] = []

    def __call__(self, region: str) -> tuple[str, int]:
        self.regions.append(region)
        expiry_ms = int((time.time() + self.lifetime_s) * 1000)
        return f"token-{len(self.regions)}", expiry_ms


@pytest.fixture
def signer(monkeypatch: pytest.MonkeyPatch) -> FakeSigner:
    fake = FakeSigner(lifetime_s=900)  # the signer's own default: 15 minutes
    monkeypatch.setattr(MSKAuthTokenProvider, "generate_auth_token", fake)
    return fake


@pytest.mark.parametrize(
    ("values", "variable"),
    [
        ({**MSK, "kafka_msk_region": None}, "RL_EXPORT_KAFKA_MSK_REGION"),
        ({**MSK, "kafka_msk_region": "Europe"}, "RL_EXPORT_KAFKA_MSK_REGION"),
        ({**MSK, "kafka_security_protocol": "SASL_PLAINTEXT"},
         "RL_EXPORT_KAFKA_SECURITY_PROTOCOL"),
        ({**MSK, "kafka_security_protocol": "SSL"}, "RL_EXPORT_KAFKA_SASL_MECHANISM"),
    ],
)  # fmt: skip
def test_msk_iam_settings_that_cannot_connect_name_the_variable(
    values: dict[str, object], variable: str
) -> None:
    with pytest.raises(ConfigError) as refused:
        load_settings(**values)
    assert refused.value.setting == variable


def test_msk_iam_needs_no_username_and_no_password() -> None:
    settings = load_settings(**MSK)
    assert settings.kafka_sasl_username is None
    assert settings.kafka_sasl_password is None


def test_aiokafka_gets_oauthbearer_with_the_signed_token(signer: FakeSigner) -> None:
    options = KafkaConnection.of(load_settings(**MSK)).aiokafka()
    assert options["security_protocol"] == "SASL_SSL"
    assert options["sasl_mechanism"] == "OAUTHBEARER"
    assert "sasl_plain_password" not in options
    provider = options["sasl_oauth_token_provider"]
    assert isinstance(provider, AbstractTokenProvider)
    assert asyncio.run(provider.token()) == "token-1"
    assert signer.regions == ["eu-west-1"]


def test_confluent_gets_the_token_and_its_expiry(signer: FakeSigner) -> None:
    config = KafkaConnection.of(load_settings(**MSK)).confluent()
    assert config["sasl.mechanism"] == "OAUTHBEARER"
    assert config["security.protocol"] == "sasl_ssl"
    token, expires = config["oauth_cb"]("")
    assert token == "token-1"
    assert expires == pytest.approx(time.time() + 900, abs=60)


def test_a_token_is_reused_until_a_minute_before_it_expires(
    signer: FakeSigner,
) -> None:
    provider = KafkaConnection.of(load_settings(**MSK)).aiokafka()["sasl_oauth_token_provider"]
    assert [asyncio.run(provider.token()) for _ in range(3)] == ["token-1"] * 3
    signer.lifetime_s = 30  # the next token expires within the minute: signed again each time
    provider = KafkaConnection.of(load_settings(**MSK)).aiokafka()["sasl_oauth_token_provider"]
    assert [asyncio.run(provider.token()) for _ in range(2)] == ["token-2", "token-3"]


def test_without_the_msk_extra_the_error_names_the_setting(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sys.modules, "aws_msk_iam_sasl_signer", None)  # import fails
    with pytest.raises(ConfigError) as refused:
        KafkaConnection.of(load_settings(**MSK)).aiokafka()
    assert refused.value.setting == "RL_EXPORT_KAFKA_SASL_MECHANISM"
    assert "rl-export[msk]" in str(refused.value)


def test_a_refused_msk_login_names_the_mechanism_and_the_region() -> None:
    kafka = KafkaConnection.of(load_settings(**MSK))
    refused = kafka.refusal(kafka_errors.SaslAuthenticationFailed())
    assert refused is not None
    assert refused.setting == "RL_EXPORT_KAFKA_SASL_MECHANISM"
    assert "kafka-cluster:Connect" in str(refused)
    assert "eu-west-1" in str(refused)
