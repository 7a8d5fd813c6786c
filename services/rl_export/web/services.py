"""What the API's routes use, made once per process: the services container.

Built from the settings by :func:`build_services`, started and stopped by the app's lifespan
(:mod:`rl_export.web.app`). Tests build the same container against the real broker and store.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web
from prometheus_client import CollectorRegistry, generate_latest

from rl_export.corpora.rubrics import RubricVersions
from rl_export.corpora.store import ObjectStore, open_store
from rl_export.formats.specs import SOURCE_CORPORA
from rl_export.index.follower import Followed, Indexer
from rl_export.index.memo import AGREEMENT_REPORTS
from rl_export.index.pairbook import PairBook
from rl_export.index.queryindex import CorpusKey, QueryIndex
from rl_export.index.reports import Reports
from rl_export.kafka import access
from rl_export.kafka.access import Grant, Kind, Op, Resource, Role
from rl_export.kafka.client import KafkaConnection, watch_refusals
from rl_export.labeling.claims import ClaimBook, Claims, entry_from_wire
from rl_export.labeling.settings import LabelingSettings, SettingsBook
from rl_export.model.errors import (
    ConfigError,
    KafkaAccessError,
    PartitionMismatchError,
    RlExportError,
    TopicMismatchError,
)
from rl_export.model.pairs import COMPARISONS
from rl_export.privacy.redact import warm_up
from rl_export.runtime.metrics import WebMetrics
from rl_export.runtime.settings import Settings
from rl_export.stream.topics import ensure_service_topics
from rl_export.web.fresh import FreshLines
from rl_export.web.jobs import Jobs
from rl_export.web.limits import FailureLimit
from rl_export.web.metricsport import serve_metrics
from rl_export.web.overlay import Overlay, note_label_event
from rl_export.web.publish import Publisher
from rl_export.web.storehealth import StoreHealth
from rl_export.web.streaming import ExportPool, StoreFactory
from rl_export.web.tailing import Tail
from rl_export.web.tokens import TokenStore, TokenVerifier

log = logging.getLogger(__name__)


@dataclass
class Services:
    settings: Settings
    registry: CollectorRegistry
    metrics: WebMetrics
    store: ObjectStore
    tokens: TokenVerifier
    auth_limit: FailureLimit
    index: QueryIndex
    indexer: Indexer
    overlay: Overlay
    fresh: FreshLines
    publisher: Publisher
    jobs: Jobs
    exports: ExportPool
    labeling: SettingsBook
    rubrics: RubricVersions
    claim_book: ClaimBook
    claims: Claims
    store_health: StoreHealth
    agreement_reports: Reports  # by (corpus id, filters), kept warm
    pairbook: PairBook  # the comparison queue's pairs, from the traces corpora
    # The corpora of RL_EXPORT_WEB_WARM, followed from the start: /readyz waits for them.
    warming: list[Followed] = field(default_factory=list)
    # Why the instance must end (the broker refused our TLS handshake or login), and what
    # ends it: ``run_web`` stops the server, which then reports this.
    fatal: ConfigError | None = None
    on_fatal: Callable[[], object] = lambda: None
    # The topic check found the broker's ACLs refuse writing labels (and only that): the
    # instance serves reads but is not ready, and checks again every 10 s.
    topics_refused: KafkaAccessError | None = None
    _stop: asyncio.Event = field(default_factory=asyncio.Event)
    _watch: contextlib.AbstractContextManager[None] | None = None
    _tasks: list[asyncio.Task[None]] = field(default_factory=list)
    _metrics_site: web.AppRunner | None = None

    def metrics_text(self) -> bytes:
        """The instance's metrics, the index's brought up to date."""
        self.indexer.update_metrics()
        return generate_latest(self.registry)

    async def start(self) -> None:
        self.publisher.on_refused = self._fail  # news of claims the ACLs refuse: we end
        # Refused reconnections of the running clients end the instance too.
        self._watch = watch_refusals(KafkaConnection.of(self.settings), self._fail)
        self._watch.__enter__()
        self._metrics_site = await serve_metrics(
            self.settings.web_host, self.settings.web_metrics_port, self.metrics_text
        )
        self.indexer.start()
        names = {spec.name for spec in self.settings.corpora}
        self.warming = [
            self.indexer.follow(CorpusKey(org, project, name))
            for org, project in self.settings.warm_projects
            for name in SOURCE_CORPORA
            if name in names and name != COMPARISONS  # pair records: read by ratings, not indexed
        ]
        self._tasks = [
            asyncio.create_task(self._warm_redaction(), name="redact-warm-up"),
            asyncio.create_task(self._warm_pairs(), name="pairs-warm-up"),
            asyncio.create_task(self._fatal_ends(self._topics()), name="topics"),
            asyncio.create_task(
                self._fatal_ends(self._labels_tail().run(self._stop)), name="labels"
            ),
            asyncio.create_task(
                self._fatal_ends(self._claims_tail().run(self._stop)), name="claims"
            ),
            asyncio.create_task(
                self._fatal_ends(self._trajectories_tail().run(self._stop)), name="fresh"
            ),
            asyncio.create_task(self.jobs.sweep_forever(self._stop), name="sweep"),
            asyncio.create_task(self.store_health.run(self._stop), name="store-health"),
        ]

    async def _fatal_ends(self, work: Coroutine[Any, Any, None]) -> None:
        """Run ``work``; a refused TLS handshake or login ends the instance (no retry loop)."""
        try:
            await work
        except ConfigError as exc:  # KafkaSecurityError, or a secret file that cannot be read
            self._fail(exc)

    def _fail(self, exc: ConfigError) -> None:
        log.error("web: %s; stopping", exc)
        if self.fatal is None:
            self.fatal = exc
            self.on_fatal()

    def labels_refused(self) -> KafkaAccessError | None:
        """Why labels cannot be published here (the ACLs refuse it): not ready meanwhile."""
        return self.topics_refused or self.publisher.refused

    def cold(self) -> list[str]:
        """The warmed corpora not indexed through once yet (the instance is not ready).

        A complete pass, not ``first_pass``: that is also set when a pass fails (the API
        then answers from what there is), and a failed pass is no reason to take traffic.
        """
        return [f.key.name for f in self.warming if f.passes == 0]

    async def _warm_pairs(self) -> None:
        """Build the warmed projects' pairs to compare once their traces are indexed (every
        body read once: the first comparison request would otherwise wait for it); not a
        condition of readiness."""
        while self.cold() and not self._stop.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stop.wait(), 0.5)
        for followed in self.warming:
            if self._stop.is_set() or followed.key.corpus != "traces":
                continue
            cid = followed.corpus_id
            if cid is None:
                continue
            try:
                settings = await self.labeling.get(followed.key.org, followed.key.project)
                await asyncio.to_thread(self.pairbook.pairs, cid, settings)
            except Exception as exc:  # a warm-up: the first request builds them instead
                log.warning("web: pairs of %s not built ahead (%s)", followed.key.name,
                            type(exc).__name__)  # fmt: skip

    async def _warm_redaction(self) -> None:
        """Load the redaction libraries in a thread (Presidio's bring spaCy: 1.5 s of CPU),
        so that the first preview that redacts does not wait for them; after the warmed
        corpora's first pass, which needs both cores more."""
        while self.cold() and not self._stop.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stop.wait(), 0.5)
        if not self._stop.is_set():
            threading.Thread(target=warm_up, name="redact-warm-up", daemon=True).start()

    def _labels_tail(self) -> Tail:
        """Everyone's label events since one overlay TTL ago, into the overlay."""
        overlay = self.overlay
        skipped = self.metrics.tail_skipped.labels("labels")
        return Tail(self.settings, access.labels_tail(self.settings), lookback_s=overlay.ttl_s,
                    note=lambda value: note_label_event(overlay, value),
                    tick=overlay.expire, skipped=skipped.inc)  # fmt: skip

    def _claims_tail(self) -> Tail:
        """Every instance's claim entries since one overlay TTL ago, into the claim book.
        Older claims (leases can last a day) are learnt from the store when a race is lost."""
        book = self.claim_book
        keep_s = 2 * self.overlay.ttl_s

        def note(value: bytes | None) -> None:
            entry = None if value is None else entry_from_wire(value)
            if entry is not None:
                book.learn(entry)

        skipped = self.metrics.tail_skipped.labels("claims")
        return Tail(self.settings, access.claims_tail(self.settings),
                    lookback_s=self.overlay.ttl_s, note=note,
                    tick=lambda: book.forget(time.time(), keep_s), skipped=skipped.inc)  # fmt: skip

    def _trajectories_tail(self) -> Tail:
        """The snapshots of the last few minutes and every new one, as corpus lines for the
        index: new traces reach the queue and stats before the sink commits them."""
        skipped = self.metrics.tail_skipped.labels("trajectories")
        return Tail(self.settings, access.trajectories_tail(self.settings),
                    lookback_s=self.fresh.keep_s, note=self.fresh.note,
                    skipped=skipped.inc, committed_only=True)  # fmt: skip

    async def _topics(self) -> None:
        """Check what the broker's ACLs let us do and create or check the topics, then start
        the label producer; a broker that is down now is tried again later, and so are
        topics that are not right yet, or labels the ACLs refuse (not ready meanwhile)."""
        may_not_label = Grant(Resource(Kind.TOPIC, self.settings.topic_labels), Op.WRITE)
        while not self._stop.is_set():
            try:
                await ensure_service_topics(self.settings, role=Role.WEB)
                self.topics_refused = self.publisher.refused = None
                await self.publisher.warm()
                return
            except KafkaAccessError as exc:
                if not exc.grants or set(exc.grants) != {may_not_label}:
                    raise  # fatal (_fatal_ends): the instance ends, naming every one
                if self.topics_refused is None:
                    log.error("web: %s; not ready (labels answer 503) until it may", exc)
                self.topics_refused = exc
            except (PartitionMismatchError, TopicMismatchError) as exc:  # may be fixed meanwhile
                log.warning("web: topics not ready (%s); labels answer 503 until they are", exc)
            except ConfigError:  # a refused login, an unreadable secret: fatal (_fatal_ends)
                raise
            except RlExportError as exc:
                log.warning("web: topics not ready (%s); labels answer 503 until they are", exc)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stop.wait(), 10)

    async def stop(self) -> None:
        self._stop.set()
        if self._watch is not None:
            self._watch.__exit__(None, None, None)
        for task in self._tasks:
            with contextlib.suppress(TimeoutError, asyncio.CancelledError):
                await asyncio.wait_for(task, 10)
        await self.agreement_reports.close()
        await self.jobs.close()
        self.exports.close()
        await self.publisher.close()
        await asyncio.to_thread(self.indexer.stop)
        self.index.close()
        await self.store.close()
        if self._metrics_site is not None:
            await self._metrics_site.cleanup()


def build_services(
    settings: Settings,
    registry: CollectorRegistry | None = None,
    *,
    export_store: StoreFactory | None = None,
) -> Services:
    """The container; ``export_store`` opens the store each direct export reads (default:
    the settings' store, a client per export)."""
    registry = registry or CollectorRegistry()
    metrics = WebMetrics(registry)
    store = open_store(settings.store_url)
    index = QueryIndex(
        settings.index_dir, threads=settings.web_index_threads, memory=settings.web_index_memory,
        writers=settings.web_index_threads,
    )  # fmt: skip
    publisher = Publisher(settings, metrics)  # its on_refused is set by the container
    indexer = Indexer(
        index,
        open_store(settings.store_url),  # the indexer's thread has a loop of its own
        metrics,
        poll_interval_s=settings.web_index_poll_s,
    )
    # What the sink may hold back (quiet chains, the shard age bound), and a minute more.
    keep_s = settings.corpus_max_age_s + settings.shard_max_age_s + 60.0
    fresh = FreshLines(settings.corpora, indexer.offer, keep_s=keep_s)
    indexer.recent = fresh.recent
    # A label made through a claim counts before the index shows it for one overlay TTL.
    claim_book = ClaimBook(label_grace_s=settings.web_overlay_ttl_s)
    defaults = LabelingSettings(labels_per_trace=settings.labels_per_trace,
                                lease_s=settings.lease_s)  # fmt: skip
    return Services(
        settings=settings,
        registry=registry,
        metrics=metrics,
        store=store,
        tokens=TokenVerifier(TokenStore(store), settings.web_token_cache_s),
        auth_limit=FailureLimit(settings.web_auth_failures_per_minute),
        index=index,
        indexer=indexer,
        overlay=Overlay(settings.web_overlay_ttl_s),
        fresh=fresh,
        publisher=publisher,
        jobs=Jobs(settings, store, metrics),
        exports=ExportPool(
            settings.web_export_threads,
            settings.web_exports_per_subject,
            export_store or (lambda: open_store(settings.store_url)),
            metrics,
        ),
        labeling=SettingsBook(store, defaults, cache_s=settings.labeling_cache_s),
        rubrics=RubricVersions(store, latest_cache_s=settings.labeling_cache_s),
        claim_book=claim_book,
        claims=Claims(store, claim_book, publisher.broadcast),
        store_health=StoreHealth(store),
        agreement_reports=Reports(AGREEMENT_REPORTS, settings.web_agreement_max_age_s),
        pairbook=PairBook(index, settings.compare_partners),
    )
