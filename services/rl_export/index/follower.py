"""The indexer: follows each corpus the API is asked about into the query index.

It runs in a thread of its own with its own event loop and object-store client, so reading
and ingesting shards (verifying checksums, DuckDB's JSON parsing) never blocks the API's event
loop; the index's writes go to a pool of writer threads (as many as the index lets write at
once, :mod:`rl_export.index.gate`), each corpus's one at a time and in order, so reading the
next object (its checksum, in C) overlaps ingesting the last one (in DuckDB, without the
GIL), and corpora are ingested side by side.
Per corpus (:meth:`Indexer.follow`, thread-safe, idempotent):

1. Register the corpus in the index and load its saved cursor (none: start from the latest
   compaction).
2. Follow it with the corpora's reader (:meth:`CorpusReader.follow_objects`), one verified
   object at a time; each object's lines and the cursor after them go into the index, so a
   restart resumes there (lines ingested twice change nothing).
3. After each pass over the chains, ingest the lines offered since (:meth:`Indexer.offer`:
   what the corpus will hold, read from the trajectories topic before the sink commits it;
   once a pass is done they are ingested as they come, a batch every
   :data:`FRESH_BATCH_S`), and note when the pass began: the index then holds every commit
   made before that moment (the lag). The first pass releases the requests waiting for it.
4. When the chains no longer continue at the cursor (history expired under it), forget the
   corpus and start again from the latest compaction. A store that fails is retried on the
   next poll; the index keeps answering from what it has.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, TypeVar

from rl_export.corpora.commits import ChainError
from rl_export.corpora.layout import CorpusRef
from rl_export.corpora.reader import CorpusReader, Cursor, ObjectLines
from rl_export.corpora.store import ObjectStore
from rl_export.index.batches import IndexError_
from rl_export.index.queryindex import CorpusKey, QueryIndex
from rl_export.model.errors import StoreError
from rl_export.runtime.metrics import WebMetrics

log = logging.getLogger(__name__)
GC_INTERVAL_S = 60.0
FETCH_TIMEOUT_S = 30.0
FRESH_BATCH_S = 0.05
"""Offered lines that come this close together are ingested in one write."""
BATCH_ROWS = 200_000
"""Most sidecar rows the index takes in one transaction."""
T = TypeVar("T")


@dataclass
class _Waiting:
    """Objects read as columns wait here while their corpus's writer is busy, and go to it
    together (one transaction) when it is free or they reach :data:`BATCH_ROWS`: a catch-up
    writes a few large batches, a follower that keeps up one object at a time."""

    objects: list[tuple[str, Any]] = field(default_factory=list)  # (key, sidecar rows)
    rows: int = 0
    fresh: bool = True  # all are parts of the compaction the corpus is read from
    cursor: Cursor = field(default_factory=dict)  # the reader's, after the last

    def add(self, item: ObjectLines, cursor: Cursor) -> None:
        self.objects.append((item.key, item.columns))
        self.rows += item.count
        self.fresh = self.fresh and item.compacted
        self.cursor = cursor

    def take(self) -> tuple[list[tuple[str, Any]], Cursor, bool]:
        """What waits, the cursor after it and whether it is fresh; nothing waits after."""
        taken = (self.objects, self.cursor, self.fresh)
        self.objects, self.rows, self.fresh = [], 0, True
        return taken


@dataclass
class Followed:
    """One followed corpus, as the API sees it."""

    key: CorpusKey
    first_pass: asyncio.Event  # of the API's event loop
    since: float  # monotonic: when following began
    corpus_id: int | None = None  # set by the indexer thread before its first pass
    caught_up_at: float | None = None  # monotonic start of the last complete pass
    error: str | None = None
    lines: int = 0
    live: int = 0
    passes: int = 0
    restarting: bool = False  # read again from the latest compaction (a body expired)
    # Lines the corpus does not hold yet (the trajectories topic: rl_export.web.fresh),
    # ingested after the next pass; only the indexer's loop touches it once following.
    fresh: list[bytes] = field(default_factory=list, repr=False)
    # The index holds the corpus read through a pass (not between a reset and the pass
    # after it, when the compaction's first rows are inserted unchecked): offered lines are
    # then ingested at once, a batch every FRESH_BATCH_S, not at the pass's end.
    settled: bool = False
    flushing: bool = False
    task: asyncio.Task[None] | None = field(default=None, repr=False)
    # Held by each of the corpus's writes to the index (of the indexer's loop; FIFO): one at
    # a time and in order, and a restart's reset after the writes of the task it replaces.
    writes: asyncio.Lock = field(default_factory=asyncio.Lock, repr=False)

    def lag_s(self, now: float) -> float:
        """Seconds of commits the index may not hold yet."""
        return max(now - (self.since if self.caught_up_at is None else self.caught_up_at), 0.0)


class Indexer:
    """The index's writer thread and its followers (see the module)."""

    def __init__(
        self,
        index: QueryIndex,
        store: ObjectStore,
        metrics: WebMetrics,
        *,
        poll_interval_s: float = 1.0,
        recent: Callable[[CorpusKey], bytes] | None = None,
    ) -> None:
        self.index = index
        self.recent = recent  # the fresh lines kept for a corpus followed now (web.fresh)
        self.store = store
        self.metrics = metrics
        self.poll_interval_s = poll_interval_s
        self.followed: dict[CorpusKey, Followed] = {}
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._api_loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._thread: threading.Thread | None = None
        self._started = threading.Event()
        # Every corpus's writes, as many at once as the index lets write (the threads, and
        # their DuckDB connections, do not grow with the corpora followed).
        self._writers = ThreadPoolExecutor(
            index.writers, thread_name_prefix="rl-export-index-writer"
        )
        # Moving and deleting segments: alone (the index's gate waits for the writers).
        self._maintenance = ThreadPoolExecutor(1, thread_name_prefix="rl-export-index-gc")
        index.fetch = self._fetch
        index.gone = self._gone

    # -- lifecycle -----------------------------------------------------------------------

    def start(self) -> None:
        """Start the thread; call from the API's event loop."""
        self._api_loop = asyncio.get_running_loop()
        self._thread = threading.Thread(target=self._run, name="rl-export-indexer", daemon=True)
        self._thread.start()
        self._started.wait(10)

    def _run(self) -> None:
        loop = asyncio.new_event_loop()
        self._loop = loop
        self._stop = asyncio.Event()
        self._started.set()
        try:
            loop.run_until_complete(self._main(self._stop))
        finally:
            loop.run_until_complete(self.store.close())
            loop.close()

    async def _main(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), GC_INTERVAL_S)
            try:  # never between a segment and its rows: the index's gate sees to it
                loop = asyncio.get_running_loop()
                merged = await loop.run_in_executor(self._maintenance,
                                                    self.index.compact_segments)  # fmt: skip
                if merged:
                    log.info("index: merged %d small or mostly dead segments", merged)
                removed = await loop.run_in_executor(self._maintenance,
                                                     self.index.collect_segments)  # fmt: skip
            except Exception as exc:  # a failed collection is tried again later
                log.warning("index: collecting segments failed: %s", exc)
                continue
            if removed:
                log.info("index: removed %d segments no record points into", len(removed))
        # The followers, and the writes and settlings they left (a write being run ends).
        tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    def stop(self) -> None:
        if self._loop is not None and self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
        if self._thread is not None:
            self._thread.join(30)
        self._maintenance.shutdown(wait=True)
        self._writers.shutdown(wait=True)

    # -- following -----------------------------------------------------------------------

    def follow(self, key: CorpusKey) -> Followed:
        """The corpus's state, following it from now on if it was not followed yet.

        Called from the API's event loop; the indexer thread registers the corpus (a write
        to the index) and starts following it.
        """
        with self._lock:
            found = self.followed.get(key)
            if found is not None:
                return found
            followed = Followed(key, asyncio.Event(), time.monotonic())
            if self.recent is not None and (lines := self.recent(key)):
                followed.fresh.append(lines)
            self.followed[key] = followed
        assert self._loop is not None
        self._loop.call_soon_threadsafe(self._begin, followed)
        self.metrics.index_corpora.set(len(self.followed))
        return followed

    def offer(self, key: CorpusKey, lines: bytes) -> bool:
        """Lines of a corpus it does not hold yet (whole JSON Lines lines), for the index
        after the corpus's next pass; True when the corpus is followed (else they are not
        taken). Called from the API's event loop."""
        followed = self.followed.get(key)
        loop = self._loop
        if followed is None or loop is None or loop.is_closed():
            return False
        loop.call_soon_threadsafe(self._take_fresh, followed, lines)
        return True

    def _take_fresh(self, followed: Followed, lines: bytes) -> None:
        """On the indexer's loop: keep offered lines, and ingest them soon if the corpus is
        settled (else the next pass's end does)."""
        followed.fresh.append(lines)
        if followed.settled and not followed.flushing and followed.corpus_id is not None:
            followed.flushing = True
            loop = asyncio.get_running_loop()
            loop.call_later(FRESH_BATCH_S, lambda: loop.create_task(self._flush_fresh(followed)))

    async def _flush_fresh(self, followed: Followed) -> None:
        followed.flushing = False
        if not followed.settled or not followed.fresh or followed.corpus_id is None:
            return  # a reset came: the pass after it takes them
        data = b"".join(followed.fresh)
        followed.fresh.clear()
        try:
            await self._write(followed, self.index.ingest, followed.corpus_id, data, None)
        except (IndexError_, OSError) as exc:
            log.warning("index: %s: fresh lines not taken (%s); the corpus will have them",
                        followed.key.name, exc)  # fmt: skip
            return
        taken = data.count(b"\n")
        self.metrics.index_fresh_lines.labels(followed.key.corpus).inc(taken)
        followed.lines += taken

    async def ready(self, key: CorpusKey, timeout_s: float) -> Followed:
        """Follow the corpus and wait (at most ``timeout_s``) for its first pass."""
        followed = self.follow(key)
        if not followed.first_pass.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(followed.first_pass.wait(), timeout_s)
        return followed

    def _begin(self, followed: Followed) -> None:
        followed.task = asyncio.get_running_loop().create_task(self._follow(followed))

    def _released(self, followed: Followed) -> None:
        assert self._api_loop is not None
        with contextlib.suppress(RuntimeError):  # the API's loop has closed: shutting down
            self._api_loop.call_soon_threadsafe(followed.first_pass.set)

    async def _follow(self, followed: Followed, *, reset: bool = False) -> None:
        key = followed.key
        loop = asyncio.get_running_loop()

        def write(fn: Callable[..., T], *args: Any) -> asyncio.Future[T]:
            return loop.create_task(self._write(followed, fn, *args))

        cid = followed.corpus_id = await write(self.index.corpus_id, key)
        if reset:  # after the writes of the task it replaces (they run in order)
            followed.settled = False
            await write(self.index.reset, cid)
            followed.restarting = False
        reader = CorpusReader(
            self.store, CorpusRef(key.org, key.project, key.corpus),
            poll_interval_s=self.poll_interval_s, columns=True,
            refused=lambda _: self.metrics.index_sidecars_refused.inc(),
        )  # fmt: skip
        ingested = self.metrics.index_ingested.labels(key.corpus)
        as_columns = self.metrics.index_objects.labels(key.corpus, "columns")
        as_lines = self.metrics.index_objects.labels(key.corpus, "lines")
        fresh = self.metrics.index_fresh_lines.labels(key.corpus)
        assert self._stop is not None
        pending: asyncio.Future[None] | None = None
        counted = -1  # lines read when ``live`` was last counted
        settling: set[asyncio.Task[None]] = set()

        async def settle(began: float) -> None:
            nonlocal counted
            with contextlib.suppress(Exception):  # a failed ingest is the loop's to report
                if pending is not None:
                    await pending
                if counted != followed.lines:  # counted before the pass is marked done
                    live = await write(self.index.live_counts)
                    followed.live, counted = live.get(cid, 0), followed.lines
                followed.caught_up_at = began
                followed.passes += 1
                followed.error = None
                self._released(followed)

        waiting = _Waiting()

        def hand_over() -> None:
            nonlocal pending
            if waiting.objects:
                objects, cursor, fresh = waiting.take()
                pending = write(functools.partial(
                    self.index.ingest_columns, cid, objects, cursor, fresh=fresh
                ))  # fmt: skip

        def caught_up(began: float) -> None:
            nonlocal pending
            hand_over()  # the pass is done: what waits goes now (settle waits for it)
            if followed.fresh:  # after the pass: never among a compaction's first rows
                data = b"".join(followed.fresh)
                followed.fresh.clear()
                pending = write(self.index.ingest, cid, data, None)
                taken = data.count(b"\n")
                fresh.inc(taken)
                followed.lines += taken  # the live count is taken again
            followed.settled = True
            task = loop.create_task(settle(began))
            settling.add(task)
            task.add_done_callback(settling.discard)

        while not self._stop.is_set():
            # 1. Where the index stopped.
            cursor = await write(self.index.cursor, cid)
            try:
                # 2. and 3.: the next object is read while the last one is ingested.
                async for item in reader.follow_objects(cursor, stop=self._stop,
                                                        caught_up=caught_up):  # fmt: skip
                    if item.columns is not None:  # its sidecar: columns, bodies left there
                        waiting.add(item, reader.cursor)
                        as_columns.inc()
                        if pending is None or pending.done() or waiting.rows >= BATCH_ROWS:
                            if pending is not None:
                                await pending
                            hand_over()
                    else:
                        if pending is not None:
                            await pending
                        hand_over()  # in reading order: what waits first
                        if pending is not None:
                            await pending
                        pending = write(self.index.ingest, cid, item.data, reader.cursor)
                        as_lines.inc()
                    followed.lines += item.count
                    ingested.inc(item.count)
                hand_over()
                if pending is not None:
                    await pending
            except ChainError as exc:
                waiting.take()  # dropped: read again
                # 4. The chains moved on without us: start again from the latest compaction.
                log.warning("index: %s: %s; reading it again from its latest compaction",
                            key.name, exc)  # fmt: skip
                await self._drain(pending)
                followed.settled = False
                await write(self.index.reset, cid)
                followed.error = str(exc)
            except (StoreError, IndexError_, OSError) as exc:
                waiting.take()  # dropped: read again
                log.error("index: %s: %s; retrying", key.name, exc)
                await self._drain(pending)
                followed.error = str(exc)
                self._released(followed)  # answer from what there is, do not wait
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._stop.wait(), self.poll_interval_s * 5)
            pending = None

    # -- bodies left in the store ---------------------------------------------------------

    def _fetch(self, key: str, ranges: list[tuple[int, int]]) -> list[bytes]:
        """Byte ranges of a store object, for a query's thread: read on this indexer's loop
        (its store client), waited for here."""
        loop = self._loop
        if loop is None or loop.is_closed():
            raise StoreError("the indexer is not running")
        future = asyncio.run_coroutine_threadsafe(self.store.get_ranges(key, ranges), loop)
        return future.result(FETCH_TIMEOUT_S)

    def _gone(self, corpus_id: int) -> None:
        """A body's object no longer exists (it expired after a compaction covered it): read
        the corpus again from its latest compaction."""
        for followed in list(self.followed.values()):
            if followed.corpus_id == corpus_id and self._loop is not None:
                log.warning("index: %s: a body's object expired; reading it again from its "
                            "latest compaction", followed.key.name)  # fmt: skip
                self._loop.call_soon_threadsafe(self._restart, followed)

    def _restart(self, followed: Followed) -> None:
        if followed.restarting:
            return
        followed.restarting = True
        if followed.task is not None:
            followed.task.cancel()
        followed.task = asyncio.get_running_loop().create_task(self._follow(followed, reset=True))

    async def _write(self, followed: Followed, fn: Callable[..., T], *args: Any) -> T:
        """One of the corpus's writes, on the writers' pool, after its earlier ones. Should
        the caller be cancelled (a restart), the write still ends before the next begins."""
        async with followed.writes:
            done = asyncio.get_running_loop().run_in_executor(self._writers, fn, *args)
            try:
                return await asyncio.shield(done)
            except asyncio.CancelledError:
                while not done.done():
                    with contextlib.suppress(asyncio.CancelledError):
                        await asyncio.wait([done])
                raise

    @staticmethod
    async def _drain(pending: asyncio.Future[None] | None) -> None:
        if pending is not None:
            with contextlib.suppress(Exception):
                await pending

    # -- metrics -------------------------------------------------------------------------

    def update_metrics(self) -> None:
        """Index size and lag per corpus name (summed and worst over orgs and projects)."""
        now = time.monotonic()
        live: dict[str, int] = {}
        lag: dict[str, float] = {}
        for followed in list(self.followed.values()):
            name = followed.key.corpus
            live[name] = live.get(name, 0) + followed.live
            lag[name] = max(lag.get(name, 0.0), followed.lag_s(now))
        for name, count in live.items():
            self.metrics.index_records.labels(name).set(count)
        for name, seconds in lag.items():
            self.metrics.index_lag.labels(name).set(seconds)
