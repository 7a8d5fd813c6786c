"""How every Kafka client of the project connects: one place for bootstrap, TLS and SASL.

The join, the sink, the web service's label publisher and claims, ``produce``, ``dev``, the
command line's consumers and the topic check all build their clients from a
:class:`KafkaConnection` (``KafkaConnection.of(settings)``), so the settings of the
configuration guide (``RL_EXPORT_KAFKA_SECURITY_PROTOCOL``, ``..._SASL_*``, ``..._SSL_*``)
apply everywhere alike:

1. TLS (``SSL``, ``SASL_SSL``) verifies the broker's certificate against
   ``RL_EXPORT_KAFKA_SSL_CA_FILE`` (or the system's authorities) and always its hostname;
   a client certificate and key make it mutual TLS. An encrypted key is opened with
   ``RL_EXPORT_KAFKA_SSL_KEY_PASSWORD`` (or its file), and never with a prompt: without
   one, OpenSSL would ask the terminal (or print the question and fail without one).
2. SASL PLAIN and SCRAM send the username and the password; the password file (a mounted
   secret) is read again each time a client is built, so a client made after a rotation
   uses the new secret. OAUTHBEARER sends the password (file) as the token, read again for
   every new connection: mount a token that something else refreshes (a projected service
   account token, a sidecar). ``AWS_MSK_IAM`` is OAUTHBEARER with a token that the
   maintained signer (``aws-msk-iam-sasl-signer-python``, the ``msk`` extra) signs from the
   process's AWS credentials (IRSA, an instance profile, the environment) for
   ``RL_EXPORT_KAFKA_MSK_REGION``; a token is used until a minute before it expires.
3. A client that cannot start asks :meth:`KafkaConnection.check` why: a refused TLS
   handshake or SASL authentication raises :class:`KafkaSecurityError` naming the setting to
   fix, which ends the process (retrying cannot help); a broker that is only unreachable
   does not, and the caller waits for it as before. With TLS 1.3 a broker that refuses our
   client certificate does so after the handshake, in an alert that arrives with the first
   answer we read: aiokafka reports a closed connection, caused by the alert (read there),
   or the hang-up alone; then the broker is asked again, and its alert read
   (:meth:`KafkaConnection._tls_alert`).
4. A running client reconnects inside aiokafka, which only logs a refused connection:
   :func:`watch_refusals` reads those logs and ends the worker or web process too.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import logging
import ssl
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from aiokafka import errors as kafka_errors
from aiokafka.conn import create_conn
from aiokafka.protocol.metadata import MetadataRequest

from rl_export.kafka.tokens import FileToken, MskAiokafkaToken, MskIamToken
from rl_export.model.errors import ConfigError, KafkaSecurityError
from rl_export.runtime.settings import Settings, env_name

CHECK_TIMEOUT_S = 10.0
# The settings beside the bootstrap that say how to connect (unset: plaintext).
SECURITY_SETTINGS = (
    "kafka_security_protocol", "kafka_sasl_mechanism", "kafka_sasl_username",
    "kafka_sasl_password", "kafka_sasl_password_file", "kafka_ssl_ca_file",
    "kafka_ssl_cert_file", "kafka_ssl_key_file", "kafka_ssl_key_password",
    "kafka_ssl_key_password_file", "kafka_msk_region",
)  # fmt: skip
# librdkafka asks for a new token at 80 % of its lifetime: a minute makes it re-read the file.
_OAUTH_LIFETIME_S = 60.0

# TLS alerts of a broker that wants a (valid) client certificate.
_CLIENT_CERT_ALERTS = (
    "CERTIFICATE_REQUIRED",
    "BAD_CERTIFICATE",
    "CERTIFICATE_UNKNOWN",
    "CERTIFICATE_EXPIRED",
    "CERTIFICATE_REVOKED",
    "UNSUPPORTED_CERTIFICATE",
    "UNKNOWN_CA",
    "ACCESS_DENIED",
)
# An ApiVersions request (version 0, correlation id 1, no client id): what a Kafka client
# sends first, so the broker's alert, if it refused our certificate, comes back to it.
_API_VERSIONS = b"\x00\x00\x00\x0a\x00\x12\x00\x00\x00\x00\x00\x01\xff\xff"
# TLS errors of a peer that does not speak TLS at all.
_NOT_TLS = ("WRONG_VERSION_NUMBER", "RECORD_LAYER_FAILURE", "UNKNOWN_PROTOCOL", "HTTP_REQUEST",
            "PACKET_LENGTH_TOO_LONG")  # fmt: skip
# aiokafka's errors that mean "the broker refused who we are", not "the broker is away".
_SASL_REFUSED = (
    kafka_errors.SaslAuthenticationFailed,
    kafka_errors.AuthenticationFailedError,
    kafka_errors.IllegalSaslStateError,
)


@dataclass(frozen=True)
class KafkaConnection:
    """Where the brokers are and how to reach them securely (a value object)."""

    bootstrap: str
    security_protocol: str = "PLAINTEXT"
    sasl_mechanism: str | None = None
    sasl_username: str | None = None
    sasl_password: str | None = None
    sasl_password_file: Path | None = None
    ssl_ca_file: Path | None = None
    ssl_cert_file: Path | None = None
    ssl_key_file: Path | None = None
    ssl_key_password: str | None = None
    ssl_key_password_file: Path | None = None
    msk_region: str | None = None

    @classmethod
    def of(cls, settings: Settings) -> KafkaConnection:
        """The connection the settings describe."""
        return cls(
            bootstrap=settings.kafka_bootstrap,
            security_protocol=settings.kafka_security_protocol,
            sasl_mechanism=settings.kafka_sasl_mechanism,
            sasl_username=settings.kafka_sasl_username,
            sasl_password=settings.kafka_sasl_password,
            sasl_password_file=settings.kafka_sasl_password_file,
            ssl_ca_file=settings.kafka_ssl_ca_file,
            ssl_cert_file=settings.kafka_ssl_cert_file,
            ssl_key_file=settings.kafka_ssl_key_file,
            ssl_key_password=settings.kafka_ssl_key_password,
            ssl_key_password_file=settings.kafka_ssl_key_password_file,
            msk_region=settings.kafka_msk_region,
        )

    def __repr__(self) -> str:  # never the password
        return (f"KafkaConnection({self.bootstrap!r}, {self.security_protocol}"
                f"{', ' + self.sasl_mechanism if self.sasl_mechanism else ''})")  # fmt: skip

    @property
    def uses_tls(self) -> bool:
        return self.security_protocol in ("SSL", "SASL_SSL")

    @property
    def uses_sasl(self) -> bool:
        return self.security_protocol.startswith("SASL_")

    @property
    def uses_msk_iam(self) -> bool:
        return self.uses_sasl and self.sasl_mechanism == "AWS_MSK_IAM"

    def _msk_signer(self) -> MskIamToken:
        if self.msk_region is None:
            raise ConfigError(env_name("kafka_msk_region"), "needed with AWS_MSK_IAM")
        return MskIamToken(self.msk_region)

    @property
    def password_setting(self) -> str:
        """The variable the password (or token) comes from."""
        if self.sasl_password_file is not None:
            return env_name("kafka_sasl_password_file")
        return env_name("kafka_sasl_password")

    def password(self) -> str:
        """The SASL password or OAUTHBEARER token, from the file when one is set (read now)."""
        if self.sasl_password_file is None:
            return self.sasl_password or ""
        return _read_secret(self.sasl_password_file, "kafka_sasl_password_file")

    def key_password(self) -> str | None:
        """The client key's password, from the file when one is set (read now); None: none."""
        if self.ssl_key_password_file is not None:
            return _read_secret(self.ssl_key_password_file, "kafka_ssl_key_password_file")
        return self.ssl_key_password

    def principal(self) -> tuple[str, str]:
        """Who the broker's ACLs see: the setting it comes from, and how to write it."""
        if self.uses_msk_iam:
            return env_name("kafka_msk_region"), "this process's AWS role"
        if self.uses_sasl and self.sasl_mechanism == "OAUTHBEARER":
            return self.password_setting, "the token's subject"
        if self.uses_sasl:
            return env_name("kafka_sasl_username"), f"User:{self.sasl_username}"
        if self.ssl_cert_file is not None:
            return env_name("kafka_ssl_cert_file"), "User:<the client certificate's subject>"
        return env_name("kafka_security_protocol"), "User:ANONYMOUS"

    def ssl_context(self) -> ssl.SSLContext:
        """A TLS context that verifies the broker's certificate and hostname (files read now)."""
        try:
            cafile = None if self.ssl_ca_file is None else str(self.ssl_ca_file)
            context = ssl.create_default_context(cafile=cafile)
        except (OSError, ssl.SSLError) as exc:
            raise ConfigError(
                env_name("kafka_ssl_ca_file"),
                f"cannot load certificate authorities from {self.ssl_ca_file} ({_reason(exc)})",
            ) from None
        context.check_hostname = True  # the default, and never turned off
        context.verify_mode = ssl.CERT_REQUIRED
        if self.ssl_cert_file is not None and self.ssl_key_file is not None:
            self._load_client_certificate(context)
        return context

    def _load_client_certificate(self, context: ssl.SSLContext) -> None:
        """Load the client certificate and key; never let OpenSSL prompt for a password.

        Without a password argument OpenSSL asks the terminal for an encrypted key's (and
        prints the question even when there is none): the callable given instead raises.
        """
        given = self.key_password()
        setting = (env_name("kafka_ssl_key_password_file") if self.ssl_key_password_file
                   else env_name("kafka_ssl_key_password"))  # fmt: skip

        def no_password() -> str:
            raise ConfigError(
                setting, f"the key {self.ssl_key_file} is encrypted: set this to its password "
                f"(or {env_name('kafka_ssl_key_password_file')} to a file holding it)",
            )  # fmt: skip

        try:
            context.load_cert_chain(str(self.ssl_cert_file), str(self.ssl_key_file),
                                    password=no_password if given is None else given)  # fmt: skip
        except ssl.SSLError as exc:
            if given is not None and _decrypt_failed(exc):
                raise ConfigError(
                    setting, f"cannot decrypt the key {self.ssl_key_file} with this password"
                ) from None
            raise ConfigError(
                env_name("kafka_ssl_cert_file"),
                f"cannot load the client certificate {self.ssl_cert_file} with the key "
                f"{self.ssl_key_file} ({_reason(exc)})",
            ) from None
        except OSError as exc:
            raise ConfigError(
                env_name("kafka_ssl_cert_file"),
                f"cannot load the client certificate {self.ssl_cert_file} with the key "
                f"{self.ssl_key_file} ({_reason(exc)})",
            ) from None

    def aiokafka(self) -> dict[str, Any]:
        """Keyword arguments for any aiokafka client (consumer, producer, admin)."""
        options: dict[str, Any] = {
            "bootstrap_servers": self.bootstrap,
            "security_protocol": self.security_protocol,
        }
        if self.uses_tls:
            options["ssl_context"] = self.ssl_context()
        if self.uses_msk_iam:
            options["sasl_mechanism"] = "OAUTHBEARER"
            options["sasl_oauth_token_provider"] = MskAiokafkaToken(self._msk_signer())
        elif self.uses_sasl:
            options["sasl_mechanism"] = self.sasl_mechanism
            if self.sasl_mechanism == "OAUTHBEARER":
                options["sasl_oauth_token_provider"] = FileToken(self.password)
            else:
                options["sasl_plain_username"] = self.sasl_username
                options["sasl_plain_password"] = self.password()
        return options

    def confluent(self) -> dict[str, Any]:
        """The same connection as a librdkafka (confluent-kafka) configuration."""
        config: dict[str, Any] = {
            "bootstrap.servers": self.bootstrap,
            "security.protocol": self.security_protocol.lower(),
        }
        if self.uses_tls:
            config["ssl.endpoint.identification.algorithm"] = "https"
            if self.ssl_ca_file is not None:
                config["ssl.ca.location"] = str(self.ssl_ca_file)
            if self.ssl_cert_file is not None and self.ssl_key_file is not None:
                config["ssl.certificate.location"] = str(self.ssl_cert_file)
                config["ssl.key.location"] = str(self.ssl_key_file)
                if (key_password := self.key_password()) is not None:
                    config["ssl.key.password"] = key_password
        if self.uses_msk_iam:
            config["sasl.mechanism"] = "OAUTHBEARER"
            config["oauth_cb"] = self._msk_signer().oauth_cb
        elif self.uses_sasl:
            config["sasl.mechanism"] = self.sasl_mechanism
            if self.sasl_mechanism == "OAUTHBEARER":
                read = self.password

                def token(_config: str) -> tuple[str, float]:
                    return read(), time.time() + _OAUTH_LIFETIME_S

                config["oauth_cb"] = token
            else:
                config["sasl.username"] = self.sasl_username
                config["sasl.password"] = self.password()
        return config

    def hosts(self) -> list[tuple[str, int]]:
        """The bootstrap servers as (host, port)."""
        pairs = []
        for server in self.bootstrap.split(","):
            host, _, port = server.strip().rpartition(":")
            pairs.append((host.strip("[]"), int(port)))
        return pairs

    @property
    def on_this_machine(self) -> bool:
        """Whether every bootstrap server is a loopback address (development, tests)."""
        for host, _ in self.hosts():
            if host == "localhost":
                continue
            try:
                if not ipaddress.ip_address(host).is_loopback:
                    return False
            except ValueError:  # a host name
                return False
        return True

    async def check(self, timeout_s: float = CHECK_TIMEOUT_S) -> bool:
        """Connect to one bootstrap server as the clients do; True when one let us in.

        Raise :class:`KafkaSecurityError` (naming the setting to fix) when a broker refuses
        the TLS handshake or the SASL authentication; return False when none answered.
        """
        options = self.aiokafka()
        options.pop("bootstrap_servers")
        for host, port in self.hosts():
            answered = False  # the broker spoke Kafka with us (it gave its API versions)
            try:
                with quiet_aiokafka():
                    conn = await asyncio.wait_for(
                        create_conn(host, port, request_timeout_ms=int(timeout_s * 1000),
                                    **options),
                        timeout_s,
                    )  # fmt: skip
                    answered = True
                    try:  # a SASL listener lets a client without SASL ask only for versions
                        await asyncio.wait_for(conn.send(MetadataRequest([])), timeout_s)
                    finally:
                        conn.close()
            except (OSError, kafka_errors.KafkaError, TimeoutError) as exc:
                refused = self.refusal(exc)
                if refused is None and _hung_up(exc) and self.uses_tls and not answered:
                    refused = await self._tls_alert(host, port, timeout_s)
                if refused is None and _hung_up(exc):
                    refused = await self._wrong_protocol(host, port, answered, timeout_s)
                if refused is not None:
                    raise refused from None
                continue
            return True
        return False

    async def _tls_alert(self, host: str, port: int, timeout_s: float) -> KafkaSecurityError | None:
        """Why a TLS broker hung up before it answered, when it refused our certificate.

        With TLS 1.3 the client's handshake is over before the broker has checked the
        client's certificate; a broker that refuses it sends its alert then, and hangs up.
        aiokafka reports only the hang-up: here the same handshake is made, a request sent
        and the answer read, which raises the alert (``SSLV3_ALERT_CERTIFICATE_UNKNOWN``...).
        """
        writer = None
        try:
            reader, writer = await asyncio.wait_for(
                asyncio.open_connection(host, port, ssl=self.ssl_context()), timeout_s
            )
            writer.write(_API_VERSIONS)
            await writer.drain()
            await asyncio.wait_for(reader.read(4), timeout_s)
        except (OSError, TimeoutError) as exc:  # ssl.SSLError is an OSError
            return self.refusal(exc)
        finally:
            if writer is not None:
                writer.close()
                with contextlib.suppress(OSError, TimeoutError):
                    await asyncio.wait_for(writer.wait_closed(), 1.0)
        return None

    async def _wrong_protocol(
        self, host: str, port: int, answered: bool, timeout_s: float
    ) -> KafkaSecurityError | None:
        """Why a broker hung up on us, when it is the security protocol; None otherwise.

        One that answered our versions request and hung up when asked for metadata wants
        SASL; one that hung up at once, and completes a TLS handshake, wants TLS. A proxy
        before a broker that is away hangs up too, but does neither.
        """
        if answered and not self.uses_sasl:
            wants = "SASL (SASL_SSL or SASL_PLAINTEXT)"
        elif not answered and not self.uses_tls and await _speaks_tls(host, port, timeout_s):
            wants = "TLS (SSL or SASL_SSL)"
        else:
            return None
        return KafkaSecurityError(
            env_name("kafka_security_protocol"),
            f"the broker at {host}:{port} hung up on a {self.security_protocol} client: it "
            f"wants {wants}",
        )

    def refusal(self, exc: BaseException) -> KafkaSecurityError | None:
        """The security error ``exc`` stands for, naming the setting; None when it is none."""
        if isinstance(exc, kafka_errors.KafkaConnectionError) and isinstance(
            exc.__cause__, ssl.SSLError
        ):  # aiokafka's "connection closed", caused by the broker's TLS alert
            return self.refusal(exc.__cause__)
        if isinstance(exc, ssl.SSLCertVerificationError):
            if "hostname" in (exc.verify_message or "").lower() or "IP address" in str(exc):
                return KafkaSecurityError(
                    env_name("kafka_bootstrap"),
                    f"the broker's TLS certificate does not name {self.bootstrap} "
                    f"({exc.verify_message}); hostname verification is always on",
                )
            return KafkaSecurityError(
                env_name("kafka_ssl_ca_file"),
                f"the broker's TLS certificate was not accepted ({exc.verify_message}): is "
                "it signed by one of these authorities?",
            )
        if isinstance(exc, ssl.SSLError):
            reason = _reason(exc)
            if any(word in reason.upper() for word in _CLIENT_CERT_ALERTS):
                return self._certificate_refused(reason)
            if any(word in reason.upper() for word in _NOT_TLS):
                return KafkaSecurityError(
                    env_name("kafka_security_protocol"),
                    f"the TLS handshake with the broker failed ({reason}): does it speak "
                    f"{self.security_protocol}?",
                )
            return None  # a connection cut during the handshake: a broker going away
        if isinstance(exc, kafka_errors.UnsupportedSaslMechanismError):
            return KafkaSecurityError(
                env_name("kafka_sasl_mechanism"), f"the broker does not offer {self.sasl_mechanism}"
            )
        if isinstance(exc, _SASL_REFUSED) and self.uses_msk_iam:
            return KafkaSecurityError(
                env_name("kafka_sasl_mechanism"),
                f"the broker refused AWS_MSK_IAM authentication ({type(exc).__name__}): do "
                "this process's AWS credentials allow kafka-cluster:Connect on the cluster, "
                f"in {env_name('kafka_msk_region')}={self.msk_region}?",
            )
        if isinstance(exc, _SASL_REFUSED):
            user = env_name("kafka_sasl_username")
            who = "a token" if self.sasl_mechanism == "OAUTHBEARER" else (
                f"user {self.sasl_username!r} (check {user} too)")  # fmt: skip
            return KafkaSecurityError(
                self.password_setting,
                f"the broker refused {self.sasl_mechanism} authentication as {who}: "
                f"{type(exc).__name__}",
            )
        return None

    def _certificate_refused(self, alert: str) -> KafkaSecurityError:
        """The broker's TLS alert about our client certificate, as the setting to fix."""
        cert, key = env_name("kafka_ssl_cert_file"), env_name("kafka_ssl_key_file")
        if self.ssl_cert_file is None:
            return KafkaSecurityError(
                cert, f"the broker requires a TLS client certificate (mutual TLS) and none is "
                f"set ({alert}): set it and {key}",
            )  # fmt: skip
        expired = _expired_on(self.ssl_cert_file)
        why = (f"it expired on {expired}" if expired else
               "is it signed by an authority the broker's trust store holds?")  # fmt: skip
        return KafkaSecurityError(
            cert, f"the broker refused our TLS client certificate {self.ssl_cert_file} "
            f"({alert}): {why}",
        )  # fmt: skip


class _RefusalWatch(logging.Handler):
    def __init__(self, kafka: KafkaConnection, on_refusal: Callable[[KafkaSecurityError], object]):
        super().__init__(logging.ERROR)
        self.kafka = kafka
        self.on_refusal = on_refusal
        self.fired = False

    def emit(self, record: logging.LogRecord) -> None:
        # aiokafka logs a failed (re)connection with the error among the arguments.
        args = record.args if isinstance(record.args, tuple) else ()
        for arg in args:
            refused = self.kafka.refusal(arg) if isinstance(arg, BaseException) else None
            if refused is not None and not self.fired:
                self.fired = True
                self.on_refusal(refused)


@contextlib.contextmanager
def watch_refusals(
    kafka: KafkaConnection, on_refusal: Callable[[KafkaSecurityError], object]
) -> Iterator[None]:
    """Call ``on_refusal`` once when a client's (re)connection is refused by TLS or SASL.

    A password rotated away under a running process, or a certificate that expired, shows
    only in aiokafka's logs while it retries; the caller stops the process instead.
    """
    watch = _RefusalWatch(kafka, on_refusal)
    client_log = logging.getLogger("aiokafka")
    client_log.addHandler(watch)
    try:
        yield
    finally:
        client_log.removeHandler(watch)


def check_app_id(settings: Settings) -> None:
    """Refuse the default ``RL_EXPORT_APP_ID`` for a worker of a cluster off this machine.

    The app id names the join's group, its changelog and its transactional ids: two
    environments sharing one would fence each other's producers and split each other's
    partitions. Local development (a broker on loopback, as ``dev`` runs it) may keep it.
    """
    default = Settings.model_fields["app_id"].default
    if settings.app_id == default and not KafkaConnection.of(settings).on_this_machine:
        raise ConfigError(
            env_name("app_id"),
            f"the default {default!r} is for local development only; give each environment "
            "its own (for example rl-export-prod), so that two never share transactional "
            "ids, consumer groups or the changelog",
        )


def connection_of(target: KafkaConnection | str) -> KafkaConnection:
    """A connection from a connection or a bare (plaintext) bootstrap string."""
    return target if isinstance(target, KafkaConnection) else KafkaConnection(target)


def _hung_up(exc: BaseException) -> bool:
    """Whether ``exc`` is a connection closed by the other side (not refused, not silent)."""
    if isinstance(exc, TimeoutError | ConnectionRefusedError):
        return False
    return isinstance(exc, kafka_errors.KafkaConnectionError | ConnectionError | EOFError)


async def _speaks_tls(host: str, port: int, timeout_s: float) -> bool:
    """Whether a TLS handshake with ``host:port`` completes (nothing verified, nothing sent)."""
    probe = ssl.create_default_context()
    probe.check_hostname = False  # only asking whether it speaks TLS at all
    probe.verify_mode = ssl.CERT_NONE
    try:
        _, writer = await asyncio.wait_for(
            asyncio.open_connection(host, port, ssl=probe), timeout_s
        )
    except (OSError, TimeoutError):
        return False
    writer.close()
    return True


def _read_secret(path: Path, field: str) -> str:
    """A secret from a file (a mounted secret), stripped; ConfigError naming ``field``."""
    try:
        return path.read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError) as exc:
        why = exc.strerror if isinstance(exc, OSError) else "not UTF-8 text"
        raise ConfigError(env_name(field), f"cannot read {path} ({why})") from None


def _decrypt_failed(exc: ssl.SSLError) -> bool:
    """Whether loading a key failed because the password does not open it."""
    text = f"{getattr(exc, 'reason', '')} {exc}".upper()
    return any(word in text for word in ("BAD_DECRYPT", "PEM LIB", "BAD PASSWORD"))


def _expired_on(cert_file: Path) -> str | None:
    """When the (first) certificate of a PEM file expired, if it has; None if it has not or
    cannot be read. CPython's own certificate decoder, the one ``getpeercert`` uses."""
    decode = getattr(getattr(ssl, "_ssl", None), "_test_decode_cert", None)
    if decode is None:
        return None
    try:
        not_after = decode(str(cert_file))["notAfter"]
        return str(not_after) if ssl.cert_time_to_seconds(not_after) < time.time() else None
    except (OSError, ssl.SSLError, KeyError, ValueError):
        return None


def _reason(exc: BaseException) -> str:
    if isinstance(exc, ssl.SSLError):
        return str(getattr(exc, "reason", None) or exc)
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror
    return type(exc).__name__


@contextlib.contextmanager
def quiet_aiokafka() -> Iterator[None]:
    """Silence aiokafka's own connection-error logs while we check a connection: we report
    the failure ourselves."""
    client_log = logging.getLogger("aiokafka")
    level = client_log.level
    client_log.setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        client_log.setLevel(level)
