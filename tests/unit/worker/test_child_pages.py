"""A join child's pages (healthz, readyz, metrics) on the standard library's server, and a
join child that imports no aiohttp."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import urllib.error
import urllib.request

from rl_export.common.net import LOOPBACK, free_port
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

    port = free_port()
    pages = ChildPages(port, ready, metrics)
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
    # Closed: the port is free again.
    again = ChildPages(port, ready, metrics)
    await again.close()


def test_a_join_child_imports_no_aiohttp() -> None:
    """What keeps a join process about 10 MiB smaller (the worker's own pages use aiohttp)."""
    code = (
        "import sys, rl_export.worker.join_process; "
        "print(sorted(m for m in sys.modules if m.startswith('aiohttp')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
