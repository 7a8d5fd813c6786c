"""The local single-node Apache Kafka (KRaft) for development and the integration tests.

The broker comes from Maven Central: ``deploy/kafka/pom.xml`` names it, Maven copies the jars
into ``.cache/kafka/<version>/libs`` once, and later runs reuse them. Starting it means:

1. check Java >= 17 and Maven, and resolve the jars (first run only);
2. write ``server.properties`` (127.0.0.1 only, no topic auto-creation, rebalance delay 0);
3. format the storage directory with a new cluster id when it has not been formatted;
4. start ``kafka.Kafka`` and wait until it logs that it started and accepts connections;
5. on stop, send SIGTERM (a controlled shutdown) and wait, then SIGKILL if it hangs.

Given a :class:`SaslSslListener`, the broker's client listener is ``SASL_SSL`` (SCRAM users
made when the storage is formatted, a PEM key store and trust store): how the integration
tests check that every client of the project connects to a secured cluster. The listener may
add a second one, ``SSL`` with ``ssl.client.auth=required`` (mutual TLS), and KRaft's
``StandardAuthorizer``, under which a principal may do only what an ACL grants it.
"""

from __future__ import annotations

import base64
import fcntl
import os
import re
import shutil
import subprocess
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from rl_export.local.process import ManagedProcess
from rl_export.model.errors import LocalStackError
from rl_export.runtime.net import LOOPBACK, free_port, port_open

KAFKA_VERSION = "3.9.1"
_STARTED = "Kafka Server started"

_LOG4J = """\
log4j.rootLogger=WARN, stdout
log4j.appender.stdout=org.apache.log4j.ConsoleAppender
log4j.appender.stdout.layout=org.apache.log4j.PatternLayout
log4j.appender.stdout.layout.ConversionPattern=[%d] %p %m (%c)%n
log4j.logger.kafka.server.KafkaRaftServer=INFO
"""


def project_root() -> Path:
    """Return the checkout that holds ``deploy/kafka/pom.xml`` (``RL_EXPORT_HOME`` overrides)."""
    env = os.environ.get("RL_EXPORT_HOME")
    candidates = [Path(env)] if env else list(Path(__file__).resolve().parents)
    for folder in candidates:
        if (folder / "deploy" / "kafka" / "pom.xml").is_file():
            return folder
    raise LocalStackError(
        "cannot find deploy/kafka/pom.xml: run from a checkout of rl-export "
        "(installed with `make install`) or set RL_EXPORT_HOME to one"
    )


def java_major_version(java: str = "java") -> int:
    """Return the major version of the Java runtime on PATH; raise if there is none."""
    if shutil.which(java) is None:
        raise LocalStackError("Java >= 17 is required for the local Kafka broker: `java` not found")
    out = subprocess.run([java, "-version"], capture_output=True, text=True, check=False)
    match = re.search(r'version "(\d+)(?:\.(\d+))?', out.stderr + out.stdout)
    if not match:
        raise LocalStackError(f"cannot tell the Java version from: {out.stderr.strip()[:200]}")
    major = int(match.group(1))
    return int(match.group(2) or 0) if major == 1 else major  # "1.8" means Java 8


def check_prerequisites() -> None:
    """Raise LocalStackError with a clear message unless Java >= 17 and Maven are installed."""
    major = java_major_version()
    if major < 17:
        raise LocalStackError(f"Java >= 17 is required for the local Kafka broker, found {major}")
    if shutil.which("mvn") is None:
        raise LocalStackError(
            "Maven is required to fetch the Kafka broker from Maven Central: `mvn` not found"
        )


def kafka_libs(root: Path | None = None) -> Path:
    """Return the folder of broker jars, resolving them with Maven on first use."""
    root = root or project_root()
    target = root / ".cache" / "kafka" / KAFKA_VERSION / "libs"
    done = target / ".complete"
    if done.exists():
        return target
    check_prerequisites()
    target.parent.mkdir(parents=True, exist_ok=True)
    # One resolver at a time (parallel test sessions, `make run` beside `make test`).
    with open(target.parent / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if done.exists():
            return target
        staging = target.parent / "libs.partial"
        shutil.rmtree(staging, ignore_errors=True)
        cmd = [
            "mvn", "-q", "-B", "-f", str(root / "deploy" / "kafka" / "pom.xml"),
            "dependency:copy-dependencies", "-DincludeScope=runtime",
            f"-DoutputDirectory={staging}",
        ]  # fmt: skip
        result = subprocess.run(cmd, capture_output=True, text=True, check=False)
        if result.returncode != 0 or not any(staging.glob("kafka_2.13-*.jar")):
            output = (result.stdout + result.stderr).strip().splitlines()[-10:]
            raise LocalStackError(
                "Maven could not fetch Apache Kafka from Maven Central:\n" + "\n".join(output)
            )
        shutil.rmtree(target, ignore_errors=True)
        staging.rename(target)
        done.touch()
    return target


def new_cluster_id() -> str:
    """Return a random Kafka cluster id (a UUID in URL-safe base64, unpadded).

    URL-safe base64 may start with "-", which the storage tool would read as an option.
    """
    while True:
        cluster_id = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        if not cluster_id.startswith("-"):
            return cluster_id


@dataclass(frozen=True)
class SaslSslListener:
    """A SASL_SSL listener: the broker's PEM key and certificate, the CA and SCRAM users.

    ``keystore`` holds the broker's unencrypted PKCS#8 private key and certificate chain,
    whose names must include 127.0.0.1; ``users`` (name to password) get SCRAM-SHA-256 and
    SCRAM-SHA-512 credentials; the first one is the broker's own, between its listeners.

    With ``mtls_port``, a second client listener there (``MTLS``, protocol ``SSL``) refuses
    a client without a certificate signed by the trust store's authorities. With
    ``authorizer``, KRaft's ``StandardAuthorizer`` allows only what ACLs grant, except to the
    super users: the first user (the broker's own, and the tests' admin), ``super_users``
    (a client certificate's ``User:CN=...``, say) and ``User:ANONYMOUS``, which is how the
    broker speaks to its own controller over the plaintext controller listener on loopback.
    """

    keystore: Path
    truststore: Path
    users: Mapping[str, str]
    mtls_port: int | None = None
    authorizer: bool = False
    super_users: tuple[str, ...] = ()

    def config(self, listener: str) -> dict[str, str]:
        """The broker settings of the listener named ``listener`` (and of ``MTLS``)."""
        admin, password = next(iter(self.users.items()))
        jaas = ("org.apache.kafka.common.security.scram.ScramLoginModule required "
                f'username="{admin}" password="{password}";')  # fmt: skip
        prefix = f"listener.name.{listener.lower()}"
        return (
            {
                "sasl.enabled.mechanisms": "SCRAM-SHA-512,SCRAM-SHA-256",
                "sasl.mechanism.inter.broker.protocol": "SCRAM-SHA-512",
                f"{prefix}.scram-sha-512.sasl.jaas.config": jaas,
                f"{prefix}.scram-sha-256.sasl.jaas.config": jaas,
                "ssl.keystore.type": "PEM",
                "ssl.keystore.location": str(self.keystore),
                "ssl.truststore.type": "PEM",
                "ssl.truststore.location": str(self.truststore),
                "ssl.client.auth": "none",
            }
            | self._mtls()
            | self._authorizer(admin)
        )

    def _mtls(self) -> dict[str, str]:
        return {} if self.mtls_port is None else {"listener.name.mtls.ssl.client.auth": "required"}

    def _authorizer(self, admin: str) -> dict[str, str]:
        if not self.authorizer:
            return {}
        supers = [f"User:{admin}", "User:ANONYMOUS", *self.super_users]
        return {
            "authorizer.class.name": "org.apache.kafka.metadata.authorizer.StandardAuthorizer",
            "super.users": ";".join(supers),
            "allow.everyone.if.no.acl.found": "false",
        }

    def format_args(self) -> list[str]:
        """``kafka-storage format`` arguments that create the SCRAM credentials."""
        return [
            arg
            for name, password in self.users.items()
            for mechanism in ("SCRAM-SHA-256", "SCRAM-SHA-512")
            for arg in ("--add-scram", f"{mechanism}=[name={name},password={password}]")
        ]


class LocalKafka(ManagedProcess):
    """A single-node KRaft Kafka on 127.0.0.1 with its data under ``data_dir``."""

    name = "Kafka broker"

    def __init__(
        self,
        data_dir: Path,
        port: int = 9092,
        *,
        heap: str = "768m",
        libs: Path | None = None,
        sasl_ssl: SaslSslListener | None = None,
        rebalance_delay_ms: int = 0,
    ) -> None:
        super().__init__(data_dir / "broker.log")
        self.sasl_ssl = sasl_ssl
        self.data_dir = data_dir.resolve()
        self.port = port
        self.heap = heap
        # How long a new group waits for more members before its first rebalance: 0 for the
        # tests (fast), Kafka's own 3 s for ``dev``, whose join processes start a moment apart
        # (so they join one generation instead of rebalancing a group that just settled).
        self.rebalance_delay_ms = rebalance_delay_ms
        self._libs = libs
        self._log_from = 0

    @property
    def bootstrap(self) -> str:
        """The bootstrap address clients use."""
        return f"{LOOPBACK}:{self.port}"

    def _controller_port(self, props: Path) -> int:
        # Reuse the controller port of an earlier run of this data dir when it is free.
        if props.exists():
            voters = r"^controller\.quorum\.voters=1@[^:]+:(\d+)$"
            match = re.search(voters, props.read_text(), re.M)
            if match and not port_open(int(match.group(1))):
                return int(match.group(1))
        return free_port()

    def _write_config(self) -> Path:
        props = self.data_dir / "server.properties"
        controller = self._controller_port(props)
        logs = self.data_dir / "logs"
        config = {
            "process.roles": "broker,controller",
            "node.id": "1",
            "controller.quorum.voters": f"1@{LOOPBACK}:{controller}",
            "listeners": f"PLAINTEXT://{LOOPBACK}:{self.port},CONTROLLER://{LOOPBACK}:{controller}",
            "advertised.listeners": f"PLAINTEXT://{LOOPBACK}:{self.port}",
            "controller.listener.names": "CONTROLLER",
            "inter.broker.listener.name": "PLAINTEXT",
            "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
            "log.dirs": str(logs),
            "num.partitions": "1",
            "auto.create.topics.enable": "false",
            "offsets.topic.replication.factor": "1",
            "offsets.topic.num.partitions": "8",
            "transaction.state.log.replication.factor": "1",
            "transaction.state.log.min.isr": "1",
            # Kafka makes 50 by default; creating them is the first transaction's wait.
            "transaction.state.log.num.partitions": "8",
            # One node: the produce path's check with the transaction coordinator (KIP-890
            # part 1) only adds a round trip to itself, and its retriable outcomes reach the
            # producers as NOT_ENOUGH_REPLICAS (KAFKA-15459), which aiokafka logs as a warning
            # at every retry: noise a newcomer takes for a fault.
            "transaction.partition.verification.enable": "false",
            "group.initial.rebalance.delay.ms": str(self.rebalance_delay_ms),
            "message.max.bytes": str(8 * 1024 * 1024),
            "log.retention.hours": "-1",
            "log.flush.interval.messages": str(2**62),
        }
        if self.sasl_ssl is not None:  # the client listener is SASL_SSL (and MTLS)
            clients = [f"SASL_SSL://{LOOPBACK}:{self.port}"]
            if self.sasl_ssl.mtls_port is not None:
                clients.append(f"MTLS://{LOOPBACK}:{self.sasl_ssl.mtls_port}")
            config |= {
                "listeners": ",".join([*clients, f"CONTROLLER://{LOOPBACK}:{controller}"]),
                "advertised.listeners": ",".join(clients),
                "inter.broker.listener.name": "SASL_SSL",
                "listener.security.protocol.map": "SASL_SSL:SASL_SSL,MTLS:SSL,CONTROLLER:PLAINTEXT",
            } | self.sasl_ssl.config("SASL_SSL")
        props.write_text("".join(f"{k}={v}\n" for k, v in config.items()))
        (self.data_dir / "log4j.properties").write_text(_LOG4J)
        return props

    def _java(self, libs: Path, main: str, *args: str) -> list[str]:
        return [
            "java",
            f"-Xms{self.heap}",
            f"-Xmx{self.heap}",
            "-XX:+UseG1GC",
            "-Djava.awt.headless=true",
            f"-Dlog4j.configuration=file:{self.data_dir / 'log4j.properties'}",
            "-cp",
            f"{libs}/*",
            main,
            *args,
        ]

    def start(self, timeout_s: float = 90.0) -> LocalKafka:
        """Start the broker and return once it accepts clients."""
        self.launch()
        self._wait_until(self.up, timeout_s, f"listening on {self.bootstrap}")
        return self

    def launch(self) -> None:
        """Start the broker and return at once (:meth:`up` says when it is ready)."""
        if port_open(self.port):
            raise LocalStackError(
                f"port {self.port} on {LOOPBACK} is already in use; choose another with "
                "--port or RL_EXPORT_BROKER_PORT"
            )
        libs = self._libs or kafka_libs()
        self.data_dir.mkdir(parents=True, exist_ok=True)
        props = self._write_config()
        if not (self.data_dir / "logs" / "meta.properties").exists():
            scram = [] if self.sasl_ssl is None else self.sasl_ssl.format_args()
            fmt = self._java(
                libs, "kafka.tools.StorageTool", "format", "-t", new_cluster_id(), "-c", str(props),
                *scram,
            )  # fmt: skip
            result = subprocess.run(fmt, capture_output=True, text=True, check=False)
            if result.returncode != 0:
                raise LocalStackError(f"formatting Kafka storage failed: {result.stderr[-500:]}")
        self._log_from = self.log_path.stat().st_size if self.log_path.exists() else 0
        self._spawn(self._java(libs, "kafka.Kafka", str(props)))

    def up(self) -> bool:
        """Whether the broker launched last has started and accepts connections."""
        with open(self.log_path, "rb") as fh:
            fh.seek(self._log_from)
            started = _STARTED.encode() in fh.read()
        return started and port_open(self.port)
