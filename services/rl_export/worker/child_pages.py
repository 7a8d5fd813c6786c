"""A join child's pages, on a loopback port only its worker reads: healthz, readyz, metrics.

The worker binds the port and hands the listening socket down (its file descriptor is the
child's second argument): a port the parent only picked, for the child to bind a moment
later, could be taken in between, and then the join process could not start (an outgoing
connection's ephemeral port took one in ``make bench-ab``).

The standard library's HTTP server, in a thread, instead of aiohttp's: a join child then
imports no aiohttp, which is about 10 MiB of each join process's memory. The answers come
from the child's event loop (``run_coroutine_threadsafe``), so they say what the join says
between two of its steps, as pages served by the loop itself would. The worker's own pages,
which people and Prometheus read, are :mod:`rl_export.worker.pages`.
"""

from __future__ import annotations

import asyncio
import socket
import threading
from collections.abc import Callable, Coroutine
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, TypeVar

import orjson

from rl_export.runtime.net import LOOPBACK

T = TypeVar("T")

ANSWER_TIMEOUT_S = 5.0
"""How long a request waits for the event loop (the worker's own request gives up at 5 s)."""


class _Server(ThreadingHTTPServer):
    """Serves on a socket that is bound and listening already, and owns it from then on."""

    daemon_threads = True

    def __init__(self, listening: socket.socket, handler: type[BaseHTTPRequestHandler]) -> None:
        super().__init__(listening.getsockname(), handler, bind_and_activate=False)
        self.socket.close()  # the unbound one the base class made
        self.socket = listening
        self.server_name, self.server_port = LOOPBACK, listening.getsockname()[1]


class ChildPages:
    """The server, on ``listening`` (bound and listening); :meth:`close` stops it and closes
    the socket."""

    def __init__(
        self,
        listening: socket.socket,
        ready: Callable[[], Coroutine[Any, Any, bool]],
        metrics_text: Callable[[], Coroutine[Any, Any, bytes]],
    ) -> None:
        loop = asyncio.get_running_loop()

        def answer(make: Callable[[], Coroutine[Any, Any, T]]) -> T:
            future = asyncio.run_coroutine_threadsafe(make(), loop)
            return future.result(timeout=ANSWER_TIMEOUT_S)

        class Pages(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                if self.path == "/healthz":
                    self._send(200, "application/json", b'{"status":"ok"}')
                elif self.path == "/readyz":
                    up = answer(ready)
                    self._send(200 if up else 503, "application/json", orjson.dumps({"ready": up}))
                elif self.path == "/metrics":
                    text = answer(metrics_text)
                    self._send(200, "text/plain; version=0.0.4; charset=utf-8", text)
                else:
                    self._send(404, "application/json", b'{"error":"not_found"}')

            def _send(self, status: int, content_type: str, body: bytes) -> None:
                self.send_response(status)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:
                """No access log, as the worker's pages keep none."""

        self.server = _Server(listening, Pages)
        self._thread = threading.Thread(
            target=self.server.serve_forever, name="join-pages", daemon=True
        )
        self._thread.start()

    async def close(self) -> None:
        """Stop serving (``shutdown`` waits for the serving loop, so not on the event loop)."""
        await asyncio.to_thread(self.server.shutdown)
        self.server.server_close()
