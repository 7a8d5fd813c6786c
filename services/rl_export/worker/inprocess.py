"""The join in this process: the join loop with a metrics registry of its own.

What a join child runs (:mod:`rl_export.worker.join_process`), and what the worker runs
itself with ``join_processes=0``. Kept apart from :mod:`rl_export.worker.joins` (the
children's supervisor) so that a join child imports no HTTP client.
"""

from __future__ import annotations

import asyncio
from typing import Protocol

from prometheus_client import CollectorRegistry, generate_latest

from rl_export.corpora.rubrics import RubricVersions
from rl_export.corpora.store import open_store
from rl_export.runtime.metrics import Metrics
from rl_export.runtime.settings import Settings
from rl_export.stream.loop import JoinWorker


class JoinStage(Protocol):
    """The join as the worker's pages see it: in this process or in a child process."""

    async def run(self, stop: asyncio.Event) -> None: ...
    async def is_ready(self) -> bool: ...
    async def metrics_text(self) -> bytes: ...


class InProcessJoin:
    """The join in this process: a join child's, or the worker's own (``join_processes=0``).

    The join reads the rubric versions its labels name from the worker's object store
    (:mod:`rl_export.stream.rubriccheck`): the store is opened here, closed when it stops.
    """

    def __init__(self, settings: Settings) -> None:
        self.registry = CollectorRegistry()
        self.store = open_store(settings.store_url)
        self.worker = JoinWorker(settings, Metrics(self.registry), RubricVersions(self.store))

    async def run(self, stop: asyncio.Event) -> None:
        try:
            await self.worker.run(stop)
        finally:
            await self.store.close()

    async def is_ready(self) -> bool:
        return self.worker.ready.is_set() and not self.worker.to_restore

    async def metrics_text(self) -> bytes:
        return generate_latest(self.registry)
