"""A TCP proxy in front of a server that can cut it off on cue: the store unreachable.

While cut, every open connection through it is reset and every new one is accepted and
reset at once: to a client it looks like a store that went away, then came back. It runs
on the caller's event loop; the soak points ``AWS_ENDPOINT_URL`` at it.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import struct

from rl_export.runtime.net import LOOPBACK, free_port


class CuttableProxy:
    """Forwards ``LOOPBACK:port`` to ``target_host:target_port`` until :meth:`cut`."""

    def __init__(self, target_host: str, target_port: int, port: int | None = None) -> None:
        self.target = (target_host, target_port)
        self.port = port or free_port()
        self.is_cut = False
        self.connections = 0
        self.refused = 0
        self._server: asyncio.Server | None = None
        self._open: set[asyncio.StreamWriter] = set()

    @property
    def url(self) -> str:
        return f"http://{LOOPBACK}:{self.port}"

    async def start(self) -> CuttableProxy:
        self._server = await asyncio.start_server(self._accept, LOOPBACK, self.port)
        return self

    def cut(self) -> None:
        """Reset every connection, and every new one until :meth:`restore`."""
        self.is_cut = True
        for writer in list(self._open):
            _reset(writer)
        self._open.clear()

    def restore(self) -> None:
        self.is_cut = False

    async def stop(self) -> None:
        self.cut()
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
            self._server = None

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self.is_cut:
            self.refused += 1
            _reset(writer)
            return
        try:
            upstream_reader, upstream_writer = await asyncio.open_connection(*self.target)
        except OSError:
            _reset(writer)
            return
        self.connections += 1
        pair = (writer, upstream_writer)
        self._open.update(pair)
        try:
            await asyncio.gather(
                _pipe(reader, upstream_writer), _pipe(upstream_reader, writer),
                return_exceptions=True,
            )  # fmt: skip
        finally:
            for each in pair:
                self._open.discard(each)
                each.close()


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    finally:
        with contextlib.suppress(OSError, RuntimeError):
            if writer.can_write_eof():
                writer.write_eof()


def _reset(writer: asyncio.StreamWriter) -> None:
    """Close with a TCP reset (SO_LINGER 0), as a vanished server's host would."""
    sock = writer.get_extra_info("socket")
    with contextlib.suppress(OSError):
        if sock is not None:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()
