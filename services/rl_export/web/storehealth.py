"""The object store's health as ``/readyz`` reports it, checked in the background.

A readiness probe that asked S3 itself would take every replica out of traffic at the same
moment on one S3 blip (every replica's probe fails together), and would send the store one
request per probe per replica. Instead each instance checks the store every ``every_s`` and
``/readyz`` reads the result: not ready before the first answer, and not ready once no check
has succeeded for ``grace_s`` (several checks in a row failed), with the last error.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable

from rl_export.corpora.store import ObjectStore

log = logging.getLogger(__name__)

CHECK_EVERY_S = 10.0
GRACE_S = 45.0  # four checks in a row
CHECK_TIMEOUT_S = 5.0


class StoreHealth:
    """The last store check's result, refreshed by :meth:`run`."""

    def __init__(
        self, store: ObjectStore, *, every_s: float = CHECK_EVERY_S, grace_s: float = GRACE_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:  # fmt: skip
        self.store = store
        self.every_s = every_s
        self.grace_s = grace_s
        self.clock = clock
        self.ok_at: float | None = None  # when a check last succeeded
        self.error: str | None = None  # why the last check failed, if it did

    async def check_once(self) -> None:
        try:
            await asyncio.wait_for(self.store.check(), CHECK_TIMEOUT_S)
        except Exception as exc:  # any failure counts; the reason goes to the log only
            error = str(exc) or type(exc).__name__
            if error != self.error:  # once per new reason, not once per check
                log.warning("the object store did not answer its health check: %s", error)
            self.error = error
        else:
            self.ok_at = self.clock()
            self.error = None

    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            await self.check_once()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), self.every_s)

    def problem(self) -> str | None:
        """Why the instance is not ready for the store's sake; None when it is."""
        if self.ok_at is None:
            return self.error or "the object store has not been checked yet"
        if self.clock() - self.ok_at > self.grace_s:
            return self.error or "no store check succeeded lately"
        return None
