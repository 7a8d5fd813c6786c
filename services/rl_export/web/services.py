"""What the API's routes use, made once per process: the services container.

Built from the settings by :func:`build_services`, started and stopped by the app's lifespan
(:mod:`rl_export.web.app`). Tests build the same container against the real broker and store.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry

from rl_export.common.errors import RlExportError
from rl_export.common.metrics import WebMetrics
from rl_export.common.redact import warm_up
from rl_export.common.settings import Settings
from rl_export.corpora.store import ObjectStore, open_store
from rl_export.stream.topics import ensure_service_topics
from rl_export.web.follower import Indexer
from rl_export.web.index import QueryIndex
from rl_export.web.jobs import Jobs
from rl_export.web.overlay import LabelsFollower, Overlay
from rl_export.web.publish import Publisher
from rl_export.web.tokens import TokenStore, TokenVerifier

log = logging.getLogger(__name__)


@dataclass
class Services:
    settings: Settings
    registry: CollectorRegistry
    metrics: WebMetrics
    store: ObjectStore
    tokens: TokenVerifier
    index: QueryIndex
    indexer: Indexer
    overlay: Overlay
    publisher: Publisher
    jobs: Jobs
    _stop: asyncio.Event = field(default_factory=asyncio.Event)
    _tasks: list[asyncio.Task[None]] = field(default_factory=list)

    async def start(self) -> None:
        self.indexer.start()
        # The redaction libraries load in a thread at start (Presidio's brings spaCy: seconds
        # of CPU), so that the first preview that redacts does not wait for them.
        threading.Thread(target=warm_up, name="redact-warm-up", daemon=True).start()
        self._tasks = [
            asyncio.create_task(self._topics(), name="topics"),
            asyncio.create_task(
                LabelsFollower(self.settings, self.overlay).run(self._stop), name="labels"
            ),
            asyncio.create_task(self.jobs.sweep_forever(self._stop), name="sweep"),
        ]

    async def _topics(self) -> None:
        """Create or check the topics; a broker that is down now is tried again later."""
        while not self._stop.is_set():
            try:
                await ensure_service_topics(self.settings)
                return
            except RlExportError as exc:
                log.warning("web: topics not ready (%s); labels answer 503 until they are", exc)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stop.wait(), 10)

    async def stop(self) -> None:
        self._stop.set()
        for task in self._tasks:
            with contextlib.suppress(TimeoutError, asyncio.CancelledError):
                await asyncio.wait_for(task, 10)
        await self.jobs.close()
        await self.publisher.close()
        await asyncio.to_thread(self.indexer.stop)
        self.index.close()
        await self.store.close()


def build_services(settings: Settings, registry: CollectorRegistry | None = None) -> Services:
    registry = registry or CollectorRegistry()
    metrics = WebMetrics(registry)
    store = open_store(settings.store_url)
    index = QueryIndex(
        settings.index_dir, threads=settings.web_index_threads, memory=settings.web_index_memory
    )
    return Services(
        settings=settings,
        registry=registry,
        metrics=metrics,
        store=store,
        tokens=TokenVerifier(TokenStore(store), settings.web_token_cache_s),
        index=index,
        # The indexer's thread has an event loop of its own, so a store client of its own.
        indexer=Indexer(
            index,
            open_store(settings.store_url),
            metrics,
            poll_interval_s=settings.web_index_poll_s,
        ),
        overlay=Overlay(settings.web_overlay_ttl_s),
        publisher=Publisher(settings, metrics),
        jobs=Jobs(settings, store, metrics),
    )
