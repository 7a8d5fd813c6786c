"""Each subject's share of an instance's export work (docs/guides/security.md).

A :class:`SubjectLimit` counts what each subject holds (direct exports, or export jobs) and
refuses one more over its share with :class:`~rl_export.web.errors.TooMany` (429 with
``Retry-After``). A subject is a token's user *in one org/project*: the key is
``(org, project, subject)``, so two tenants whose users share a name never share a limit.

A :class:`Slot` is released once, from any thread (an export's thread ends on its own pool),
and releasing it again does nothing, so every path that ends a piece of work may release it.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable

from rl_export.web.errors import TooMany

Key = tuple[str, str, str]  # org, project, subject


class Slot:
    """One piece of work a subject holds; :meth:`release` gives it back (once)."""

    def __init__(self, release: Callable[[], None]) -> None:
        self._release: Callable[[], None] | None = release
        self._lock = threading.Lock()

    def release(self) -> None:
        with self._lock:
            release, self._release = self._release, None
        if release is not None:
            release()

    @property
    def held(self) -> bool:
        return self._release is not None


class SubjectLimit:
    """At most ``per_subject`` slots per key at once; thread-safe."""

    def __init__(self, per_subject: int, *, kind: str, what: str, retry_after_s: int) -> None:
        if per_subject < 1:
            raise ValueError("per_subject must be at least 1")
        self.per_subject = per_subject
        self.kind = kind  # a short name (metric label): exports, jobs
        self.what = what  # for people: "direct exports running"
        self.retry_after_s = retry_after_s
        self._held: dict[Key, int] = {}
        self._lock = threading.Lock()

    def acquire(self, key: Key) -> Slot:
        """A slot for ``key``; :class:`TooMany` when the key holds its share already."""
        with self._lock:
            held = self._held.get(key, 0)
            if held >= self.per_subject:
                raise TooMany(
                    f"you already have {held} {self.what} on this instance (the most one "
                    f"user may have at once); retry when one has finished",
                    self.retry_after_s,
                    self.kind,
                )
            self._held[key] = held + 1
        return Slot(lambda: self._give_back(key))

    def _give_back(self, key: Key) -> None:
        with self._lock:
            left = self._held.get(key, 0) - 1
            if left > 0:
                self._held[key] = left
            else:
                self._held.pop(key, None)  # the map holds only subjects with work: bounded

    def held(self, key: Key) -> int:
        with self._lock:
            return self._held.get(key, 0)

    def total(self) -> int:
        with self._lock:
            return sum(self._held.values())


class FailureLimit:
    """At most ``per_window`` failures per client address in each ``window_s`` (fixed
    windows), remembered for at most ``max_addresses`` addresses (the least recent forgotten).
    Used for 401s: an address over its limit is refused without a store read."""

    def __init__(self, per_window: int, *, window_s: float = 60.0, max_addresses: int = 10_000,
                 clock: Callable[[], float] = time.monotonic) -> None:  # fmt: skip
        self.per_window = per_window
        self.window_s = window_s
        self.max_addresses = max_addresses
        self.clock = clock
        self._seen: OrderedDict[str, tuple[float, int]] = OrderedDict()  # start, failures
        self._lock = threading.Lock()

    def note(self, address: str) -> None:
        """Count one failure of ``address``."""
        now = self.clock()
        with self._lock:
            start, count = self._seen.get(address, (now, 0))
            if now - start >= self.window_s:
                start, count = now, 0
            self._seen[address] = (start, count + 1)
            self._seen.move_to_end(address)
            while len(self._seen) > self.max_addresses:
                self._seen.popitem(last=False)

    def retry_after(self, address: str) -> int:
        """0 when ``address`` is within its limit; else the seconds until its window ends."""
        now = self.clock()
        with self._lock:
            found = self._seen.get(address)
        if found is None or now - found[0] >= self.window_s or found[1] < self.per_window:
            return 0
        return max(1, int(found[0] + self.window_s - now + 0.999))
