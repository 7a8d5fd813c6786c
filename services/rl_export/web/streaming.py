"""Run an export's chunk generator in a thread of its own and hand its chunks to the API.

``GET export`` streams a whole export, which parses, filters and renders every record: done
on the API's event loop it would hold every other request back for its whole duration. So
the generator runs on a thread with its own event loop and its own object-store client, a few
chunks ahead at most (a bounded queue: a slow client slows the export, memory stays small),
and stops when the client goes away.
"""

from __future__ import annotations

import asyncio
import contextlib
import queue
import threading
from collections.abc import AsyncIterator, Callable

from rl_export.corpora.store import ObjectStore, open_store

_END = object()
_AHEAD = 4


class ThreadStream:
    """``make(store)``'s chunks, produced on a thread, consumed with ``async for``."""

    def __init__(self, make: Callable[[ObjectStore], AsyncIterator[bytes]], store_url: str) -> None:
        self._make = make
        self._store_url = store_url
        self._queue: queue.Queue[object] = queue.Queue(maxsize=_AHEAD)
        self._cancel = threading.Event()
        self._thread = threading.Thread(target=self._run, name="rl-export-export", daemon=True)
        self._thread.start()

    def _put(self, item: object) -> bool:
        while not self._cancel.is_set():
            with contextlib.suppress(queue.Full):
                self._queue.put(item, timeout=0.5)
                return True
        return False

    def _run(self) -> None:
        async def main() -> None:
            store = open_store(self._store_url)
            try:
                async for chunk in self._make(store):
                    if not self._put(chunk):
                        return
                self._put(_END)
            except BaseException as exc:  # handed to the consumer, who raises it
                self._put(exc)
            finally:
                await store.close()

        asyncio.run(main())

    async def next(self) -> bytes | None:
        """The next chunk, None at the end; the producer's exception is raised here."""
        item = await asyncio.to_thread(self._queue.get)
        if item is _END:
            return None
        if isinstance(item, BaseException):
            raise item
        assert isinstance(item, bytes)
        return item

    def close(self) -> None:
        """Stop the producer (the client went away, or the stream ended)."""
        self._cancel.set()
        with contextlib.suppress(queue.Empty):
            while True:
                self._queue.get_nowait()
