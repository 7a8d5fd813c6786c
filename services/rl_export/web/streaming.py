"""Run direct exports on a bounded pool of their own and hand their chunks to the API.

``GET export`` streams a whole export, which parses, filters and renders every record: done
on the API's event loop it would hold every other request back for its whole duration, and
done on the loop's default thread pool it would take the threads that stats, the queue,
claims and ``/readyz`` run their queries on (docs/guides/security.md). So:

1. :class:`ExportPool` owns ``web_export_threads`` threads for exports only, and the
   per-subject limit of direct exports (``web_exports_per_subject``: 429 over it).
2. :class:`ThreadStream` runs one export's chunk generator on a thread of that pool, with an
   event loop and an object-store client of its own, a few chunks ahead at most (a slow
   client slows the export, memory stays small). Chunks reach the API's loop through an
   :class:`asyncio.Queue` (``call_soon_threadsafe``), so waiting for the next chunk holds no
   thread at all, and a cancelled wait (the client went away) ends at once.
3. :meth:`ThreadStream.close` stops the export: it cancels the export's task on its own loop
   (whatever it awaits, a slow store read included, ends within milliseconds), or the queued
   work if it never started; the subject's slot is released when the thread is done.
4. An export whose answer needs it whole first (a redacted one says its counts in a header)
   is :func:`spooled` to a temporary file, then sent from it (:func:`read_spool`).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import tempfile
import threading
from collections.abc import AsyncIterator, Callable
from typing import IO

from rl_export.corpora.store import ObjectStore
from rl_export.runtime.metrics import WebMetrics
from rl_export.web.limits import Key, Slot, SubjectLimit

_END = object()
_AHEAD = 4
_POLL_S = 0.02  # how often a producer waiting for room (a slow client) looks again
RETRY_AFTER_S = 5

StoreFactory = Callable[[], ObjectStore]
Make = Callable[[ObjectStore], AsyncIterator[bytes]]


class ExportPool:
    """The instance's threads for direct exports, and each subject's share of them."""

    def __init__(self, threads: int, per_subject: int, open_store: StoreFactory,
                 metrics: WebMetrics) -> None:  # fmt: skip
        self.threads = threads
        self.open_store = open_store
        self.metrics = metrics
        self.limit = SubjectLimit(per_subject, kind="exports", what="direct exports running",
                                  retry_after_s=RETRY_AFTER_S)  # fmt: skip
        self._executor = concurrent.futures.ThreadPoolExecutor(
            max_workers=threads, thread_name_prefix="rl-export-export"
        )

    def stream(self, key: Key, make: Make) -> ThreadStream:
        """Start ``make``'s export for ``key``'s subject; TooMany over its share."""
        slot = self.limit.acquire(key)
        try:
            return ThreadStream(make, self, slot)
        except BaseException:
            slot.release()
            raise

    def running(self) -> int:
        """Direct exports running or waiting for a thread."""
        return self.limit.total()

    def close(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)


class ThreadStream:
    """``make(store)``'s chunks, produced on the export pool, consumed with :meth:`next`."""

    def __init__(self, make: Make, pool: ExportPool, slot: Slot) -> None:
        self._make = make
        self._pool = pool
        self._slot = slot
        self._api_loop = asyncio.get_running_loop()
        self._items: asyncio.Queue[object] = asyncio.Queue()
        self._room = threading.Semaphore(_AHEAD)
        self._cancel = threading.Event()
        self._lock = threading.Lock()
        self._task: asyncio.Task[None] | None = None
        self._task_loop: asyncio.AbstractEventLoop | None = None
        pool.metrics.exports_running.inc()
        self._future = pool._executor.submit(self._run)
        self._future.add_done_callback(self._done)

    def _done(self, _: concurrent.futures.Future[None]) -> None:
        if self._slot.held:
            self._slot.release()
            self._pool.metrics.exports_running.dec()

    async def _deliver(self, item: object) -> bool:
        """Hand ``item`` to the API's loop once there is room; False when nobody reads.
        (The wait is a sleep on the export's loop: :meth:`close` cancels it.)"""
        while not self._room.acquire(blocking=False):
            if self._cancel.is_set():
                return False
            await asyncio.sleep(_POLL_S)
        try:
            self._api_loop.call_soon_threadsafe(self._items.put_nowait, item)
        except RuntimeError:  # the API's loop is closed
            return False
        return True

    async def _produce(self) -> None:
        store = self._pool.open_store()
        try:
            async for chunk in self._make(store):
                if not await self._deliver(chunk):
                    return
            await self._deliver(_END)
        except asyncio.CancelledError:
            return
        except Exception as exc:  # handed to the consumer, who raises it
            await self._deliver(exc)
        finally:
            await store.close()

    def _run(self) -> None:
        async def main() -> None:
            task = asyncio.current_task()
            with self._lock:
                if self._cancel.is_set():
                    return
                self._task, self._task_loop = task, asyncio.get_running_loop()
            await self._produce()

        asyncio.run(main())

    async def next(self) -> bytes | None:
        """The next chunk, None at the end; the producer's exception is raised here."""
        item = await self._items.get()
        self._room.release()
        if item is _END:
            return None
        if isinstance(item, BaseException):
            raise item
        assert isinstance(item, bytes)
        return item

    def join(self, timeout_s: float | None = None) -> None:
        """Wait until the export's thread is done with it (or its queued work cancelled)."""
        with contextlib.suppress(concurrent.futures.CancelledError):
            self._future.result(timeout_s)

    def close(self) -> None:
        """Stop the producer (the client went away, or the stream ended)."""
        with self._lock:
            self._cancel.set()
            task, loop = self._task, self._task_loop
        if self._future.cancel():  # still waiting for a thread: it never runs
            return
        if task is not None and loop is not None:
            with contextlib.suppress(RuntimeError):  # its loop already ended
                loop.call_soon_threadsafe(task.cancel)


SPOOL_BYTES = 8 << 20
"""A spooled export is held in memory up to this, then on disk."""


async def spooled(stream: ThreadStream, first: bytes | None) -> IO[bytes]:
    """A stream whose first chunk was taken, that chunk and the rest, in a temporary file
    (memory up to :data:`SPOOL_BYTES`); the stream is closed."""
    spool = tempfile.SpooledTemporaryFile(max_size=SPOOL_BYTES)  # noqa: SIM115  # read later
    try:
        chunk = first
        while chunk is not None:
            spool.write(chunk)
            chunk = await stream.next()
    except BaseException:
        spool.close()
        raise
    finally:
        stream.close()
    spool.seek(0)
    return spool


async def read_spool(spool: IO[bytes]) -> AsyncIterator[bytes]:
    """A spooled file's bytes, a MiB at a time; the file is closed at the end."""
    try:
        while piece := spool.read(1 << 20):
            yield piece
    finally:
        spool.close()
