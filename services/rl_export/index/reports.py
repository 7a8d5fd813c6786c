"""Agreement reports kept warm: ``GET agreement`` answers from the last report of its filters.

A report over 1,000,000 traces costs about a second of CPU (docs/performance.md), and every
label changes the corpus it reads. So each (corpus, filters) keeps its latest report with
the index's change count read before its input was: a request answers from it while the
count has not moved. When the corpus changed since and the report is younger than
``RL_EXPORT_WEB_AGREEMENT_MAX_AGE_S``, the request still answers from it (saying so) and
one computation of a new report starts in the background; an older report, or none, is
computed while the request waits. Either way one computation runs per report at a time,
shared by every request that asks meanwhile. Pure but for the clock and the tasks.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from rl_export.index.memo import LRU

log = logging.getLogger(__name__)

Key = tuple[int, str]  # the corpus id, the filters (as JSON)


@dataclass(frozen=True)
class Kept:
    """A computed report: the corpus's change count and the time (the clock's, and UTC as
    epoch seconds) read before its input was."""

    changes: int
    at: float
    wall: float
    report: dict[str, Any]


@dataclass(frozen=True)
class Answer:
    """A report to answer with; ``updating``: the corpus changed since it was computed and a
    new one is being computed."""

    kept: Kept
    updating: bool


class Reports:
    """The latest report per key, at most ``size`` keys (the least recently asked go first)."""

    def __init__(
        self, size: int, max_age_s: float, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.max_age_s = max_age_s
        self.clock = clock
        self._kept: LRU[Key, Kept] = LRU(size)
        self._running: dict[Key, asyncio.Task[Kept]] = {}

    async def get(
        self, key: Key, changes: Callable[[], int], compute: Callable[[], Awaitable[dict[str, Any]]]
    ) -> Answer:
        """The report of ``key``: kept, kept while a new one is computed, or computed now."""
        kept = self._kept.get(key)
        if kept is not None and kept.changes == changes():
            return Answer(kept, updating=False)
        if kept is not None and self.clock() - kept.at < self.max_age_s:
            self._start(key, changes, compute)
            return Answer(kept, updating=True)
        # A request that gives up does not cancel the computation others may share.
        return Answer(await asyncio.shield(self._start(key, changes, compute)), updating=False)

    def _start(
        self, key: Key, changes: Callable[[], int], compute: Callable[[], Awaitable[dict[str, Any]]]
    ) -> asyncio.Task[Kept]:
        task = self._running.get(key)
        if task is None:
            task = asyncio.create_task(self._compute(key, changes, compute), name="agreement")
            self._running[key] = task
            task.add_done_callback(lambda done: self._done(key, done))
        return task

    async def _compute(
        self, key: Key, changes: Callable[[], int], compute: Callable[[], Awaitable[dict[str, Any]]]
    ) -> Kept:
        seen, at, wall = changes(), self.clock(), time.time()  # before the input is read
        kept = Kept(seen, at, wall, await compute())
        self._kept.put(key, kept)
        return kept

    def _done(self, key: Key, task: asyncio.Task[Kept]) -> None:
        if self._running.get(key) is task:
            del self._running[key]
        if not task.cancelled() and (exc := task.exception()) is not None:
            # Seen here too when nobody waited (a background update); the next request
            # computes again. The report's input is never logged, only what failed.
            log.warning("web: an agreement report failed: %s", type(exc).__name__)

    async def close(self) -> None:
        """Cancel the computations under way (the service is stopping)."""
        for task in list(self._running.values()):
            task.cancel()
        await asyncio.gather(*self._running.values(), return_exceptions=True)
