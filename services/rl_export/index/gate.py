"""Who may write to the query index at once: ingests side by side, maintenance alone.

The indexer writes corpora on a pool of writer threads
(:class:`~rl_export.index.follower.Indexer`), and DuckDB runs their transactions side by side:
appends never conflict, and each corpus deletes and updates only its own rows. Two writers
on two cores indexed two corpora 1.3 times faster than one writer after the other
(docs/performance.md). At most ``writers`` ingests run at once (each is a DuckDB statement
of several threads and a batch of Arrow rows in memory).

Moving and deleting segments (:meth:`QueryIndex.compact_segments`,
:meth:`~QueryIndex.collect_segments`) must never run between a segment and the rows that
point into it: they wait for every ingest to end, and an ingest that arrives while one waits
waits behind it (so maintenance is never starved by a long catch-up).
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator


class Gate:
    """A shared/exclusive lock with a cap on its shared holders, exclusive first."""

    def __init__(self, writers: int) -> None:
        if writers < 1:
            raise ValueError("writers must be at least 1")
        self.writers = writers
        self._cond = threading.Condition()
        self._shared = 0
        self._exclusive = False
        self._waiting_exclusive = 0

    @contextlib.contextmanager
    def shared(self) -> Iterator[None]:
        """One of at most ``writers`` ingests at once, never during maintenance."""
        with self._cond:
            self._cond.wait_for(
                lambda: (
                    not self._exclusive
                    and not self._waiting_exclusive
                    and self._shared < self.writers
                )
            )
            self._shared += 1
        try:
            yield
        finally:
            with self._cond:
                self._shared -= 1
                self._cond.notify_all()

    @contextlib.contextmanager
    def exclusive(self) -> Iterator[None]:
        """Alone: once the ingests under way have ended."""
        with self._cond:
            self._waiting_exclusive += 1
            try:
                self._cond.wait_for(lambda: not self._exclusive and not self._shared)
            finally:
                self._waiting_exclusive -= 1
            self._exclusive = True
        try:
            yield
        finally:
            with self._cond:
                self._exclusive = False
                self._cond.notify_all()
