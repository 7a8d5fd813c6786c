"""Direct exports on their own pool: chunks in order, errors handed on, a stop that frees the
thread and the subject's slot whatever the export was waiting on, and waits that hold no
thread of the API's pool."""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from collections.abc import AsyncIterator, Iterator

import pytest
from prometheus_client import CollectorRegistry

from rl_export.corpora.store import MemoryStore, ObjectStore
from rl_export.runtime.metrics import WebMetrics
from rl_export.web.errors import TooMany
from rl_export.web.streaming import ExportPool, Make

ANA = ("acme", "bot", "ana")
GUARD_S = 10.0  # a guard against a hang, not a measure


@pytest.fixture
def pool() -> Iterator[ExportPool]:
    made = ExportPool(2, 2, MemoryStore, WebMetrics(CollectorRegistry()))
    try:
        yield made
    finally:
        made.close()


def chunks(n: int) -> Make:
    async def make(store: ObjectStore) -> AsyncIterator[bytes]:
        for i in range(n):
            yield b"%d;" % i

    return make


def forever(started: threading.Event, stopped: threading.Event) -> Make:
    """An export whose source never answers (until it is cancelled)."""

    async def make(store: ObjectStore) -> AsyncIterator[bytes]:
        started.set()
        try:
            await asyncio.Event().wait()
        finally:
            stopped.set()
        yield b""  # pragma: no cover

    return make


def running(pool: ExportPool) -> float:
    return float(pool.metrics.exports_running._value.get())


async def test_chunks_arrive_in_order_and_the_slot_is_freed_at_the_end(pool: ExportPool) -> None:
    stream = pool.stream(ANA, chunks(50))
    got = []
    while (chunk := await stream.next()) is not None:
        got.append(chunk)
    assert b"".join(got) == b"".join(b"%d;" % i for i in range(50))
    stream.close()
    stream.join(GUARD_S)
    assert pool.limit.held(ANA) == 0
    assert running(pool) == 0


async def test_the_exports_error_is_raised_to_the_reader(pool: ExportPool) -> None:
    async def broken(store: ObjectStore) -> AsyncIterator[bytes]:
        yield b"first"
        raise ValueError("no such column: nope")

    stream = pool.stream(ANA, broken)
    assert await stream.next() == b"first"
    with pytest.raises(ValueError, match="no such column"):
        await stream.next()
    stream.join(GUARD_S)
    assert pool.limit.held(ANA) == 0


async def test_a_stop_ends_an_export_waiting_on_its_source_and_frees_its_slot(
    pool: ExportPool,
) -> None:
    started, stopped = threading.Event(), threading.Event()
    stream = pool.stream(ANA, forever(started, stopped))
    reader = asyncio.ensure_future(stream.next())
    assert await asyncio.to_thread(started.wait, GUARD_S)
    assert pool.limit.held(ANA) == 1
    reader.cancel()  # the client went away: its wait ends at once
    with pytest.raises(asyncio.CancelledError):
        await reader
    stream.close()
    await asyncio.to_thread(stream.join, GUARD_S)
    assert stopped.is_set()  # the export's own wait was cancelled
    assert pool.limit.held(ANA) == 0
    assert running(pool) == 0


async def test_a_reader_that_stops_reading_holds_the_export_a_few_chunks_ahead_until_stopped(
    pool: ExportPool,
) -> None:
    made: list[int] = []

    async def endless(store: ObjectStore) -> AsyncIterator[bytes]:
        n = 0
        while True:
            made.append(n)
            yield b"x" * 10
            n += 1

    stream = pool.stream(ANA, endless)
    assert await stream.next() == b"x" * 10
    for _ in range(20):  # let the producer run into its bound
        await asyncio.sleep(0.01)
    assert len(made) <= 8  # a few ahead, not the whole (endless) export
    stream.close()
    await asyncio.to_thread(stream.join, GUARD_S)
    assert pool.limit.held(ANA) == 0


async def test_a_subject_over_its_share_gets_429_and_others_still_run(pool: ExportPool) -> None:
    started, stopped = threading.Event(), threading.Event()
    held = [pool.stream(ANA, forever(started, stopped)) for _ in range(2)]
    with pytest.raises(TooMany):
        pool.stream(ANA, chunks(1))
    for stream in held:
        stream.close()
    for stream in held:
        await asyncio.to_thread(stream.join, GUARD_S)
    other = pool.stream(("acme", "bot", "bo"), chunks(1))
    assert await other.next() == b"0;"
    assert await other.next() is None


async def test_an_export_waiting_for_a_thread_never_runs_once_stopped() -> None:
    pool = ExportPool(1, 2, MemoryStore, WebMetrics(CollectorRegistry()))
    try:
        started, stopped = threading.Event(), threading.Event()
        busy = pool.stream(("acme", "bot", "bo"), forever(started, stopped))
        assert await asyncio.to_thread(started.wait, GUARD_S)
        ran: list[bool] = []

        async def never(store: ObjectStore) -> AsyncIterator[bytes]:
            ran.append(True)
            yield b""

        queued = pool.stream(ANA, never)
        assert pool.limit.held(ANA) == 1
        queued.close()
        queued.join(GUARD_S)
        assert pool.limit.held(ANA) == 0
        busy.close()
        await asyncio.to_thread(busy.join, GUARD_S)
        assert ran == []
    finally:
        pool.close()


async def test_waiting_for_a_chunk_holds_no_thread_of_the_apis_pool(pool: ExportPool) -> None:
    """The API's loop has one thread for queries here: an export whose source never answers
    must not take it (the old design waited for chunks on that pool)."""
    loop = asyncio.get_running_loop()
    loop.set_default_executor(concurrent.futures.ThreadPoolExecutor(max_workers=1))
    try:
        started, stopped = threading.Event(), threading.Event()
        stream = pool.stream(ANA, forever(started, stopped))
        reader = asyncio.ensure_future(stream.next())
        await asyncio.sleep(0)
        assert await asyncio.wait_for(asyncio.to_thread(lambda: "query answered"), GUARD_S) == (
            "query answered"
        )
        reader.cancel()
        stream.close()
        await asyncio.to_thread(stream.join, GUARD_S)
    finally:  # the session's loop goes on to other tests: give it back a pool of its size
        loop.set_default_executor(
            concurrent.futures.ThreadPoolExecutor(thread_name_prefix="asyncio")
        )
