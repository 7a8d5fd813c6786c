"""Each subject's share of an instance's export work (DESIGN.md section 10).

A :class:`SubjectLimit` counts what each subject holds (direct exports, or export jobs) and
refuses one more over its share with :class:`~rl_export.web.errors.TooMany` (429 with
``Retry-After``). A subject is a token's user *in one org/project*: the key is
``(org, project, subject)``, so two tenants whose users share a name never share a limit.

A :class:`Slot` is released once, from any thread (an export's thread ends on its own pool),
and releasing it again does nothing, so every path that ends a piece of work may release it.
"""

from __future__ import annotations

import threading
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
