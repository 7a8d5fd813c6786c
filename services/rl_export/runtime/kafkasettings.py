"""The Kafka connection settings checked together: combinations that cannot connect refused
before any client is built (each message starts with the environment variable)."""

from __future__ import annotations

from typing import Any


def env_name(field: str) -> str:
    """The environment variable that sets ``field`` (settings.env_name, without the import)."""
    return f"RL_EXPORT_{field.upper()}"


def check_kafka_security(settings: Any) -> None:
    """Refuse combinations that cannot connect; each message starts with the variable."""
    protocol, mechanism = settings.kafka_security_protocol, settings.kafka_sasl_mechanism
    sasl = protocol.startswith("SASL_")
    password = env_name("kafka_sasl_password")
    problems = [
        (sasl and mechanism is None, "kafka_sasl_mechanism",
         f"needed with {env_name('kafka_security_protocol')}={protocol}"),
        (not sasl and mechanism is not None, "kafka_sasl_mechanism",
         f"needs {env_name('kafka_security_protocol')}=SASL_SSL or SASL_PLAINTEXT"),
        (settings.kafka_sasl_password is not None
         and settings.kafka_sasl_password_file is not None,
         "kafka_sasl_password_file", f"set it or {password}, not both"),
        (sasl and mechanism != "AWS_MSK_IAM" and settings.kafka_sasl_password is None
         and settings.kafka_sasl_password_file is None,
         "kafka_sasl_password_file", f"(or {password}) needed with "
         f"{env_name('kafka_sasl_mechanism')}={mechanism}"),
        (mechanism == "AWS_MSK_IAM" and protocol != "SASL_SSL", "kafka_security_protocol",
         f"must be SASL_SSL with {env_name('kafka_sasl_mechanism')}=AWS_MSK_IAM"),
        (mechanism == "AWS_MSK_IAM" and settings.kafka_msk_region is None, "kafka_msk_region",
         f"needed with {env_name('kafka_sasl_mechanism')}=AWS_MSK_IAM"),
        (sasl and mechanism not in ("OAUTHBEARER", "AWS_MSK_IAM")
         and not settings.kafka_sasl_username,
         "kafka_sasl_username", f"needed with {env_name('kafka_sasl_mechanism')}={mechanism}"),
        ((settings.kafka_ssl_cert_file is None) != (settings.kafka_ssl_key_file is None),
         "kafka_ssl_cert_file", f"mutual TLS needs it and {env_name('kafka_ssl_key_file')}"),
        (settings.kafka_ssl_key_password is not None
         and settings.kafka_ssl_key_password_file is not None, "kafka_ssl_key_password_file",
         f"set it or {env_name('kafka_ssl_key_password')}, not both"),
    ]  # fmt: skip
    for wrong, field, detail in problems:
        if wrong:
            raise ValueError(f"{env_name(field)}: {detail}")
