"""Answers kept while their inputs do not change: a bounded map, least recently used first
out (an ``OrderedDict``). Without a lock: a user in several threads holds one (the index's
:meth:`~rl_export.web.index.QueryIndex.memo`)."""

from __future__ import annotations

from collections import OrderedDict
from typing import Generic, TypeVar

K = TypeVar("K")
V = TypeVar("V")

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
