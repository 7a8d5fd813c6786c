"""A web service in this process whose direct exports read from a slow source.

For the work-isolation test and benchmark (DESIGN.md section 10): :class:`GatedStore` wraps
the real store that exports read and holds every read of a corpus's data (shards and
compactions) until its gate opens, so an export holds its slot for as long as a test needs,
without any timing. Everything else (the index, tokens, claims, jobs) uses the real store
directly. :class:`InProcessWeb` serves the real app (:func:`rl_export.web.app.create_app`)
with uvicorn on a thread, so the test can reach the services' own counters.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import AsyncIterator, Sequence
from typing import Any

import uvicorn

from rl_export.corpora.store import CHUNK, ObjectStore, open_store
from rl_export.runtime.net import free_port
from rl_export.runtime.settings import Settings
from rl_export.web.app import create_app
from rl_export.web.services import Services, build_services

_HELD = ("/data/", "/_compacted/", "/_manifest/")  # a commit may hold its lines (inline)


class Gate:
    """Open or shut, for every export's store; counts the reads it holds."""

    def __init__(self) -> None:
        self._open = threading.Event()
        self._lock = threading.Lock()
        self.waiting = 0

    def open(self) -> None:
        self._open.set()

    async def wait(self, key: str) -> None:
        if self._open.is_set() or not any(part in key for part in _HELD):
            return
        with self._lock:
            self.waiting += 1
        try:
            # A threading event (exports run on loops of their own), polled: the sleep is
            # what a stopped export's cancellation ends.
            while not self._open.is_set():  # noqa: ASYNC110
                await asyncio.sleep(0.05)
        finally:
            with self._lock:
                self.waiting -= 1


class GatedStore:
    """The real store, each read of a corpus's data held at the gate."""

    def __init__(self, inner: ObjectStore, gate: Gate) -> None:
        self.inner = inner
        self.gate = gate
        self.url = inner.url

    async def get(self, key: str) -> bytes:
        await self.gate.wait(key)
        return await self.inner.get(key)

    async def get_ranges(self, key: str, ranges: Sequence[tuple[int, int]]) -> list[bytes]:
        await self.gate.wait(key)
        return await self.inner.get_ranges(key, ranges)

    async def chunks(self, key: str, size: int = CHUNK) -> AsyncIterator[bytes]:
        await self.gate.wait(key)
        async for chunk in self.inner.chunks(key, size):
            yield chunk

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


class InProcessWeb:
    """The web service on a free port, on a thread of this process."""

    def __init__(self, settings: Settings, gate: Gate) -> None:
        self.port = free_port()
        own = {"web_port": self.port, "web_metrics_port": free_port(),
               "data_dir": settings.data_dir / f"web-{self.port}"}  # fmt: skip
        self.settings = settings.model_copy(update=own)
        url = self.settings.store_url
        self.services: Services = build_services(
            self.settings, export_store=lambda: GatedStore(open_store(url), gate)
        )
        config = uvicorn.Config(
            create_app(self.services), host="127.0.0.1", port=self.port, log_level="warning",
            access_log=False, server_header=False, timeout_graceful_shutdown=5,
        )  # fmt: skip
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, name="web", daemon=True)
        self.base = f"http://127.0.0.1:{self.port}"

    def start(self, timeout_s: float = 60.0) -> InProcessWeb:
        self.thread.start()
        deadline = time.monotonic() + timeout_s
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("the in-process web service did not start")
            time.sleep(0.05)
        return self

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(30)
