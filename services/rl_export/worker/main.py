"""The worker process: the join processes, the sink, compaction and the health pages.

``rl-export worker`` runs :func:`run_worker`: it checks the topics, then runs the join (in
``join_processes`` child processes, :mod:`rl_export.worker.joins`), the sink
(:mod:`rl_export.corpora.sink`) and a compaction timer side by side, and serves
``/healthz``, ``/readyz`` and ``/metrics`` (:mod:`rl_export.worker.pages`) until SIGTERM.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time

from prometheus_client import CollectorRegistry, generate_latest

from rl_export.corpora.chain import SinkConfig
from rl_export.corpora.compaction import compact, expire
from rl_export.corpora.feed import Feed
from rl_export.corpora.layout import CorpusRef
from rl_export.corpora.metered import MeteredStore
from rl_export.corpora.sink import Sink
from rl_export.corpora.store import open_store
from rl_export.corpora.table import TableSync
from rl_export.kafka import access
from rl_export.kafka.access import Role
from rl_export.kafka.client import KafkaConnection, check_app_id, watch_refusals
from rl_export.model.errors import KafkaSecurityError, StoreError
from rl_export.runtime.gctune import tune_gc
from rl_export.runtime.metrics import SinkMetrics
from rl_export.runtime.settings import MIB, Settings
from rl_export.stream import native
from rl_export.stream.produce import make_producer
from rl_export.stream.topics import ensure_service_topics
from rl_export.worker.inprocess import InProcessJoin, JoinStage
from rl_export.worker.joins import ChildJoins
from rl_export.worker.pages import serve_pages
from rl_export.worker.runtime import configure_logging, run_bounded, run_stages, stop_on_signals

log = logging.getLogger(__name__)


def build_sink(settings: Settings, registry: CollectorRegistry) -> Sink:
    uses = access.sink_consumer(settings)

    def refused(exc: BaseException) -> Exception | None:
        return access.refused(settings, Role.WORKER, uses, exc)

    metrics = SinkMetrics(registry)
    return Sink(
        kafka=KafkaConnection.of(settings),
        topic=uses.reads[0],
        group=uses.group or settings.sink_group,
        # Every object the sink and compaction write is counted (what the store bills).
        store=MeteredStore(open_store(settings.store_url), metrics.objects, metrics.projects),
        metrics=metrics,
        config=SinkConfig(
            max_records=settings.shard_max_records,
            max_bytes=settings.shard_max_bytes,
            max_age_s=settings.shard_max_age_s,
            quiet_max_age_s=settings.corpus_max_age_s,
            quiet_records=settings.quiet_chain_records,
            buffer_bytes=settings.sink_buffer_mib * MIB,
            compression=settings.shard_compression,
            inline_max_bytes=settings.shard_inline_max_bytes,
            sidecars=settings.shard_sidecars and settings.sink_sidecars,
            partitions=settings.partitions,
            partitioner=settings.partitioner,
            crash_at=settings.crash_at,
        ),
        specs=settings.corpora,
        session_timeout_s=settings.session_timeout_s,
        instance_id=settings.instance_id,
        on_refused=refused,
        feed=Feed(
            access.commits_feed(settings).writes[0],
            lambda: make_producer(settings, linger_ms=5),
            metrics,
        ),
    )


def table_sync(settings: Settings) -> TableSync | None:
    """How compaction keeps the corpora's open tables (None: ``RL_EXPORT_TABLES`` off)."""
    if not settings.tables:
        return None
    formats = {spec.name: spec.format for spec in settings.corpora}
    return TableSync(formats=formats, retention_s=settings.shard_retention_s)


async def compact_corpora(
    sink: Sink, settings: Settings, waiting: dict[CorpusRef, float] | None = None
) -> None:
    """Compact what this worker writes; other workers may race, create-only decides.

    A corpus is compacted once its tail is worth rewriting: ``compaction_min_commits``
    commits, counted by the sink as it makes them (:meth:`Sink.tail_commits`, so a quiet
    corpus costs no request until then), or once it has waited ``compaction_max_wait_s``
    since this worker first let it wait (``waiting``: since when, kept between passes).
    """
    waiting = {} if waiting is None else waiting
    tails = sink.tail_commits()
    for ref in sink.corpora_written():
        now = time.monotonic()
        if not tails.get(ref):
            waiting.pop(ref, None)
            continue  # nothing committed here since its last compaction
        overdue = now - waiting.setdefault(ref, now) >= settings.compaction_max_wait_s
        if tails[ref] < settings.compaction_min_commits and not overdue:
            continue
        table = table_sync(settings)
        try:
            made = await compact(
                sink.store, ref, writer=sink.writer, compression=settings.shard_compression,
                partitioning=(settings.partitioner, settings.partitions),
                tombstone_retention_s=settings.tombstone_retention_s,
                sidecars=settings.shard_sidecars, table=table,
            )  # fmt: skip
            await expire(sink.store, ref, retention_s=settings.shard_retention_s, now=time.time())
        except StoreError as exc:
            log.error("compaction of %s failed, will retry: %s", ref.root, exc)
            continue
        sink.compacted(ref)  # compacted, or nothing new (another worker's generation)
        waiting.pop(ref, None)
        if made is None:
            continue
        sink.metrics.compactions.inc()
        log.info("%s: generation %d, %d records", ref.root, made.generation, made.records)
        written = None if table is None else table.written
        if table is not None:
            note_table(sink, ref, table)
        await sink.announce_compaction(ref, made, written)


def note_table(sink: Sink, ref: CorpusRef, table: TableSync) -> None:
    """A table write's metrics: its outcome, time and the files it wrote."""
    written, metrics = table.written, sink.metrics
    if table.error is not None:
        metrics.table_writes.labels("failed").inc()
    if written is None:
        return
    outcome = "vacuumed" if written.vacuumed else "full" if written.full else "merged"
    metrics.table_writes.labels(outcome).inc()
    metrics.table_seconds.observe(table.seconds)
    if isinstance(sink.store, MeteredStore):
        sink.store.count(ref.org, ref.project, "table", written.objects)


async def serve_worker(settings: Settings, stop: asyncio.Event) -> None:
    """Run the join, the sink, compaction and the web pages until ``stop`` is set."""
    registry = CollectorRegistry()
    sink = build_sink(settings, registry)
    join: JoinStage = (
        ChildJoins(settings, settings.join_processes) if settings.join_processes else (
            InProcessJoin(settings))
    )  # fmt: skip

    async def ready() -> bool:
        return sink.assigned.is_set() and await join.is_ready()

    async def metrics_text() -> bytes:
        return generate_latest(registry) + await join.metrics_text()

    runner = await serve_pages(settings.web_host, settings.worker_web_port, ready, metrics_text)

    async def compaction_timer() -> None:
        waiting: dict[CorpusRef, float] = {}  # short tails let wait, since when (monotonic)
        while not stop.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), settings.compaction_interval_s)
            if not stop.is_set():
                await compact_corpora(sink, settings, waiting)

    tasks = [
        asyncio.create_task(join.run(stop), name="join"),
        asyncio.create_task(sink.run(stop), name="sink"),
        asyncio.create_task(compaction_timer(), name="compaction"),
    ]
    try:
        await run_stages(tasks, stop, settings.stop_grace_s)
    finally:
        await runner.cleanup()
        await sink.store.close()


def run_worker(settings: Settings) -> int:
    """Check the topics, then run the worker until SIGTERM/SIGINT; return the exit code."""
    configure_logging(settings)

    check_app_id(settings)
    log.info("%s", native.describe(settings))  # which join rules run (refuses if on but absent)

    async def main() -> None:
        stop = asyncio.Event()
        stop_on_signals(stop)
        # Refuses when a partition count differs; waits for a broker that is still starting.
        check = asyncio.ensure_future(
            ensure_service_topics(settings, settings.kafka_wait_s, Role.WORKER)
        )
        stopped = asyncio.ensure_future(stop.wait())
        await asyncio.wait({check, stopped}, return_when=asyncio.FIRST_COMPLETED)
        stopped.cancel()
        if not check.done():  # SIGTERM while waiting for the broker
            check.cancel()
            log.info("worker stopped before the broker answered")
            return
        check.result()
        tune_gc()
        log.info("worker starting: join group %s in %d processes (0: in this one), sink group "
                 "%s, store %s", settings.app_id, settings.join_processes, settings.sink_group,
                 settings.store_url)  # fmt: skip
        refused: list[KafkaSecurityError] = []

        def on_refusal(exc: KafkaSecurityError) -> None:
            log.error("worker: %s; stopping", exc)
            refused.append(exc)
            stop.set()

        with watch_refusals(KafkaConnection.of(settings), on_refusal):
            await serve_worker(settings, stop)
        if refused:  # the command line reports it in one line, and exits non-zero
            raise refused[0]
        log.info("worker stopped")

    run_bounded(main())  # a WorkerError is reported by the command line, in one line
    return 0
