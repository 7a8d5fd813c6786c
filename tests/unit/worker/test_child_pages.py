"""A join child's pages (healthz, readyz, metrics) on the standard library's server, on the
socket its worker bound; and a join child that imports no aiohttp."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

from rl_export.runtime.net import LOOPBACK
from rl_export.worker.child_pages import ChildPages


def get(port: int, path: str) -> tuple[int, str, bytes]:
    try:
        with urllib.request.urlopen(f"http://{LOOPBACK}:{port}{path}", timeout=5) as response:
            return response.status, response.headers["Content-Type"], response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.headers["Content-Type"], exc.read()


async def test_pages_answer_from_the_event_loop() -> None:
    state = {"ready": False, "asked_on_loop": False}
    loop = asyncio.get_running_loop()

    async def ready() -> bool:
        state["asked_on_loop"] = asyncio.get_running_loop() is loop
        return bool(state["ready"])

    async def metrics() -> bytes:
        return b"rl_export_join_events_total 3.0\n"

    listening = socket.create_server((LOOPBACK, 0))
    port = listening.getsockname()[1]
    pages = ChildPages(listening, ready, metrics)
    try:
        assert await asyncio.to_thread(get, port, "/healthz") == (
            200, "application/json", b'{"status":"ok"}',
        )  # fmt: skip
        assert await asyncio.to_thread(get, port, "/readyz") == (
            503, "application/json", b'{"ready":false}',
        )  # fmt: skip
        assert state["asked_on_loop"]
        state["ready"] = True
        assert (await asyncio.to_thread(get, port, "/readyz"))[:2] == (200, "application/json")
        status, content_type, body = await asyncio.to_thread(get, port, "/metrics")
        assert (status, body) == (200, b"rl_export_join_events_total 3.0\n")
        assert content_type.startswith("text/plain")
        assert (await asyncio.to_thread(get, port, "/nothing"))[0] == 404
    finally:
        await pages.close()
    # Closed, with its socket: the port is free again.
    socket.create_server((LOOPBACK, port)).close()


def test_a_join_child_serves_on_the_socket_its_worker_bound(tmp_path: Path) -> None:
    """The worker binds the port and passes the listening socket down: the child never
    binds a port of its own, so nothing can take it between the worker's choice and the
    child's start. (Its join waits for an unreachable broker meanwhile.)"""
    log = tmp_path / "child.log"
    with socket.create_server((LOOPBACK, 0)) as listening, log.open("wb") as err:
        port = listening.getsockname()[1]
        env = {**os.environ, "RL_EXPORT_KAFKA_BOOTSTRAP": f"{LOOPBACK}:9",
               "RL_EXPORT_DATA_DIR": str(tmp_path), "RL_EXPORT_LOG_LEVEL": "error"}  # fmt: skip
        child = subprocess.Popen(
            [sys.executable, "-m", "rl_export.worker.join_process", str(os.getpid()),
             str(listening.fileno())],
            env=env, pass_fds=(listening.fileno(),), stderr=err,
        )  # fmt: skip
    try:  # our copy is closed: only the child's serves
        deadline = time.monotonic() + 30
        while True:
            try:
                assert get(port, "/healthz")[0] == 200
                break
            except (urllib.error.URLError, ConnectionError):  # not serving yet
                assert child.poll() is None, log.read_text()
                assert time.monotonic() < deadline, "the child never answered"
                time.sleep(0.1)
        assert get(port, "/readyz")[0] == 503  # no broker: not ready, but serving
    finally:
        child.send_signal(signal.SIGTERM)
        child.wait(30)


def test_a_join_child_imports_no_aiohttp() -> None:
    """What keeps a join process about 10 MiB smaller (the worker's own pages use aiohttp)."""
    code = (
        "import sys, rl_export.worker.join_process; "
        "print(sorted(m for m in sys.modules if m.startswith('aiohttp')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
