"""Answers kept while their inputs do not change: :class:`LRU`, a bounded map, least recently
used first out (an ``OrderedDict``, without a lock), and :class:`Memo`, answers computed once
at a time by any number of threads and kept in one (the index's
:meth:`~rl_export.index.queryindex.QueryIndex.memo`)."""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from typing import Generic, TypeVar, cast

K = TypeVar("K")
V = TypeVar("V")
T = TypeVar("T")

AGREEMENT_REPORTS = 64
"""Agreement reports kept per web instance (a few KiB each): the filters a team looks at."""


class LRU(Generic[K, V]):
    """At most ``size`` entries; a read moves its entry to the back."""

    def __init__(self, size: int) -> None:
        self.size = size
        self._entries: OrderedDict[K, V] = OrderedDict()

    def get(self, key: K) -> V | None:
        value = self._entries.get(key)
        if value is not None:
            self._entries.move_to_end(key)
        return value

    def put(self, key: K, value: V) -> None:
        self._entries[key] = value
        self._entries.move_to_end(key)
        while len(self._entries) > self.size:
            self._entries.popitem(last=False)

    def __len__(self) -> int:
        return len(self._entries)


@dataclass
class _Flight:
    """An answer being computed: who computes it holds ``lock``; ``error`` is what the
    computation raised, for those who waited for it."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    error: Exception | None = None


class Memo:
    """At most ``size`` answers by key (:class:`LRU`), for threads.

    One computation of an answer at a time: those who ask for it meanwhile wait for the
    first rather than compute it too. When it fails, those waiting for it get its error at
    once (each computing it again in turn would make the last wait for every failure); the
    next request tries again.
    """

    def __init__(self, size: int) -> None:
        self._kept: LRU[Hashable, object] = LRU(size)
        self._lock = threading.Lock()
        self._flights: dict[Hashable, _Flight] = {}  # answers being computed

    def get(self, key: Hashable, compute: Callable[[], T]) -> T:
        """The answer kept for ``key``, else ``compute()``'s, kept."""
        with self._lock:
            kept = self._kept.get(key)
            if kept is not None:
                return cast(T, kept)
            flight = self._flights.setdefault(key, _Flight())
        try:
            with flight.lock:
                if flight.error is not None:
                    raise flight.error
                with self._lock:
                    kept = self._kept.get(key)
                if kept is not None:
                    return cast(T, kept)
                try:
                    value = compute()
                except Exception as exc:
                    flight.error = exc
                    raise
                with self._lock:
                    self._kept.put(key, value)
                return value
        finally:
            with self._lock:
                if self._flights.get(key) is flight:
                    del self._flights[key]
