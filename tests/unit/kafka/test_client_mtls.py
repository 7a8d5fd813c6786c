"""Mutual TLS: an encrypted client key opens with its password setting and never with a
prompt, and a client certificate the other side refuses is named from its TLS alert.

The refusals are read from a real TLS 1.3 server on loopback that requires a client
certificate signed by the test's CA (as a broker with ``ssl.client.auth=required`` does);
the integration tests run the same against Kafka (tests/integration/security/test_mtls.py).
"""

from __future__ import annotations

import contextlib
import os
import pty
import select
import socket
import ssl
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from rl_export.kafka.client import KafkaConnection
from rl_export.model.errors import ConfigError, KafkaSecurityError
from rl_export.runtime.net import LOOPBACK
from rl_export.runtime.settings import load_settings
from tests.harness.tls import KEY_PASSWORD, TlsFiles, make_tls_files


@pytest.fixture(scope="module")
def tls(tmp_path_factory: pytest.TempPathFactory) -> TlsFiles:
    return make_tls_files(tmp_path_factory.mktemp("tls"))


def mtls(tls: TlsFiles, port: int = 9093, **changes: object) -> KafkaConnection:
    values: dict[str, object] = {"ssl_ca_file": tls.ca, "ssl_cert_file": tls.client_cert,
                                 "ssl_key_file": tls.client_key} | changes  # fmt: skip
    return KafkaConnection(f"{LOOPBACK}:{port}", "SSL", **values)  # type: ignore[arg-type]


def test_an_encrypted_key_opens_with_its_password_or_its_file(
    tls: TlsFiles, tmp_path: Path
) -> None:
    kafka = mtls(tls, ssl_key_file=tls.client_key_encrypted, ssl_key_password=KEY_PASSWORD)
    assert isinstance(kafka.aiokafka()["ssl_context"], ssl.SSLContext)
    assert kafka.confluent()["ssl.key.password"] == KEY_PASSWORD
    secret = tmp_path / "key-password"
    secret.write_text(KEY_PASSWORD + "\n")
    from_file = KafkaConnection.of(load_settings(
        kafka_security_protocol="SSL", kafka_ssl_ca_file=tls.ca,
        kafka_ssl_cert_file=tls.client_cert, kafka_ssl_key_file=tls.client_key_encrypted,
        kafka_ssl_key_password_file=secret,
    ))  # fmt: skip
    assert isinstance(from_file.aiokafka()["ssl_context"], ssl.SSLContext)
    assert KEY_PASSWORD not in repr(from_file)
    # An unencrypted key ignores a password, as OpenSSL does.
    assert isinstance(mtls(tls, ssl_key_password="x").ssl_context(), ssl.SSLContext)


@pytest.mark.parametrize(
    ("password", "variable", "words"),
    [
        (None, "RL_EXPORT_KAFKA_SSL_KEY_PASSWORD", "is encrypted"),
        ("not-the-password", "RL_EXPORT_KAFKA_SSL_KEY_PASSWORD", "cannot decrypt"),
    ],
)
def test_an_encrypted_key_without_its_password_names_the_setting(
    tls: TlsFiles, password: str | None, variable: str, words: str
) -> None:
    kafka = mtls(tls, ssl_key_file=tls.client_key_encrypted, ssl_key_password=password)
    with pytest.raises(ConfigError) as refused:
        kafka.aiokafka()
    assert refused.value.setting == variable
    assert words in refused.value.detail
    assert "not-the-password" not in str(refused.value)


def test_the_key_password_and_its_file_are_not_both_set() -> None:
    with pytest.raises(ConfigError) as refused:
        load_settings(kafka_ssl_key_password="p", kafka_ssl_key_password_file="/run/p")
    assert refused.value.setting == "RL_EXPORT_KAFKA_SSL_KEY_PASSWORD_FILE"


# What a process does with an encrypted key and no password: one line naming the setting.
_BUILD = (
    "import sys\n"
    "from pathlib import Path\n"
    "from rl_export.kafka.client import KafkaConnection\n"
    "from rl_export.model.errors import ConfigError\n"
    "kafka = KafkaConnection('127.0.0.1:9093', 'SSL', ssl_cert_file=Path(sys.argv[1]),\n"
    "                        ssl_key_file=Path(sys.argv[2]))\n"
    "try:\n"
    "    kafka.ssl_context()\n"
    "except ConfigError as exc:\n"
    "    print(exc, flush=True)\n"
    "    sys.exit(2)\n"
)


def test_no_terminal_is_ever_asked_for_the_key_password(tls: TlsFiles) -> None:
    """With a terminal OpenSSL would wait there for the pass phrase (forever, in a pod with
    a tty); without one it prints the question and fails with a wrong message."""
    argv = [sys.executable, "-c", _BUILD, str(tls.client_cert), str(tls.client_key_encrypted)]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    # No terminal: nothing on stdin, no controlling terminal either.
    done = subprocess.run(argv, capture_output=True, text=True, stdin=subprocess.DEVNULL,
                          start_new_session=True, env=env, timeout=60, check=False)  # fmt: skip
    assert done.returncode == 2, done.stderr
    assert "RL_EXPORT_KAFKA_SSL_KEY_PASSWORD" in done.stdout
    assert "pass phrase" not in (done.stdout + done.stderr).lower()
    # A terminal: the child's controlling terminal is a pseudo-terminal we hold.
    pid, fd = pty.fork()
    if pid == 0:  # the child
        os.execve(argv[0], argv, env)
    output, deadline = b"", time.monotonic() + 60
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([fd], [], [], 0.5)
            if ready:
                try:
                    chunk = os.read(fd, 4096)
                except OSError:  # the child closed the terminal
                    break
                if not chunk:
                    break
                output += chunk
            elif os.waitpid(pid, os.WNOHANG) != (0, 0):
                break
    finally:
        ended = os.waitpid(pid, os.WNOHANG)
        while ended == (0, 0) and time.monotonic() < deadline:  # the terminal closes first
            time.sleep(0.05)
            ended = os.waitpid(pid, os.WNOHANG)
        if ended == (0, 0):  # still waiting: it asked the terminal
            os.kill(pid, 9)
            os.waitpid(pid, 0)
        os.close(fd)
    assert ended != (0, 0), f"still running after 60 s; it wrote {output!r}"
    assert os.waitstatus_to_exitcode(ended[1]) == 2
    assert b"RL_EXPORT_KAFKA_SSL_KEY_PASSWORD" in output
    assert b"pass phrase" not in output.lower()


# --- a refused client certificate, read from the TLS alert --------------------------------------


@pytest.fixture
def refusing_server(tls: TlsFiles) -> Iterator[int]:
    """A TLS 1.3 server that requires a client certificate signed by the CA; it answers
    nothing (it is no broker), so an accepted client sees only a hang-up.

    Blocking sockets in a thread: asyncio's own TLS server drops its alert when a handshake
    fails. A refused client's request is read before the socket closes, or the close would
    reset the connection and the client could lose the alert before it reads it.
    """
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_3
    context.load_cert_chain(tls.keystore)
    context.load_verify_locations(tls.ca)
    context.verify_mode = ssl.CERT_REQUIRED
    listening = socket.create_server((LOOPBACK, 0))

    def answer(conn: socket.socket) -> None:
        tls_conn = context.wrap_socket(conn, server_side=True, do_handshake_on_connect=False)
        try:
            tls_conn.do_handshake()
            tls_conn.recv(64)
        except OSError:  # ssl.SSLError too: the handshake failed, the alert is sent
            with contextlib.suppress(OSError):  # read what the client sent until it closes
                while select.select([tls_conn], [], [], 5)[0] and os.read(tls_conn.fileno(), 4096):
                    pass
        finally:
            tls_conn.close()

    def serve() -> None:
        while True:
            try:
                conn, _ = listening.accept()
            except OSError:  # closed: the test is over
                return
            threading.Thread(target=answer, args=(conn,), daemon=True).start()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield listening.getsockname()[1]
    finally:
        with contextlib.suppress(OSError):
            listening.shutdown(socket.SHUT_RDWR)  # wakes the accept
        listening.close()
        thread.join(10)


@pytest.mark.parametrize(
    ("cert", "words"),
    [
        (None, "requires a TLS client certificate"),
        ("expired_cert", "it expired on"),
        ("stranger_cert", "signed by an authority the broker's trust store holds"),
    ],
)
async def test_a_refused_client_certificate_is_named_from_the_alert(
    tls: TlsFiles, refusing_server: int, cert: str | None, words: str
) -> None:
    if cert is None:
        kafka = mtls(tls, refusing_server, ssl_cert_file=None, ssl_key_file=None)
    else:
        kafka = mtls(tls, refusing_server, ssl_cert_file=getattr(tls, cert))
    started = time.monotonic()
    with pytest.raises(KafkaSecurityError) as refused:
        await kafka.check(timeout_s=5)
    assert refused.value.setting == "RL_EXPORT_KAFKA_SSL_CERT_FILE"
    assert words in refused.value.detail
    assert "ALERT" in refused.value.detail  # the alert's own name, as OpenSSL gives it
    assert time.monotonic() - started < 10


async def test_an_accepted_client_certificate_is_no_refusal(
    tls: TlsFiles, refusing_server: int
) -> None:
    # Accepted, then hung up on (the server is no broker): no refusal, no broker either.
    assert await mtls(tls, refusing_server).check(timeout_s=5) is False
