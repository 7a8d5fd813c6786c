"""Every Prometheus metric of rl-export, in one container bound to a registry.

Names follow ``rl_export_<noun>_<unit>[_total]``; label values come from closed sets
(event types, :class:`~rl_export.model.events.RejectReason`, outcomes), or are bounded
(:class:`ProjectLabels`), so cardinality is bounded.
Tests build ``Metrics(CollectorRegistry())`` and read the values back.
"""

from __future__ import annotations

import bisect
import math
import threading
import time
from collections.abc import Iterable, Iterator, Sequence

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import HistogramMetricFamily
from prometheus_client.samples import Sample
from prometheus_client.utils import floatToGoString

from rl_export.privacy.detectors import KINDS

_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300)
_FRESHNESS_BUCKETS = (0.05, 0.1, 0.25, 0.5, 0.75, 1, 1.25, 1.5, 2, 2.5, 3, 5, 10, 12.5, 15, 30, 60,
                      120, 130, 180, 300, 600)  # fmt: skip
"""Event to visible: fine around the goals and the bounds (2 s at the bench's 1 s shard age,
the 10 s default, quiet chains' 120 s), so a p99 is not an interpolation across a wide bucket
(it was across (1, 2.5])."""

REDACTION_KINDS = KINDS
"""The kinds of docs/guides/exports.md's redaction: the closed set of ``kind`` label values."""

CLAIM_OUTCOMES = ("granted", "renewed", "lost", "released", "ended")
"""What became of a claim attempt or a claim (the ``outcome`` label of the claims counter):
granted a place, handed back unexpired on a repeated ask, lost a create-only race, released
by its holder, ended by the holder's label or skip."""


OBJECT_KINDS = ("shard", "commit", "sidecar", "erasure", "compaction", "table", "other")
"""What an object written is (the ``kind`` label of the objects counter): a data shard, a
commit entry, an index sidecar, an erasure entry, a compaction's object, a Delta table's file
(data or log), anything else."""
TABLE_OUTCOMES = ("merged", "full", "vacuumed", "failed")
"""What a table write did: merged the changes, merged every record (the table was behind),
merged and then deleted earlier versions' files (an erasure), or failed."""
FEED_KINDS = ("commit", "compaction")
OTHER = "_other"
"""The org and project label values of every pair past the bound (:class:`ProjectLabels`)."""
PROJECT_SERIES = 50
"""Org/project pairs with series of their own in the per-project metrics (the first met)."""


class ProjectLabels:
    """``org`` and ``project`` label values, at most ``limit`` distinct pairs: the first
    pairs met keep their names (a series stays one tenant's for the process's life), every
    later one is counted as ``(_other, _other)``. Thread-safe."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._named: set[tuple[str, str]] = set()
        self._lock = threading.Lock()

    def __call__(self, org: str, project: str) -> tuple[str, str]:
        pair = (org, project)
        if pair in self._named:
            return pair
        with self._lock:
            if len(self._named) < self.limit:
                self._named.add(pair)
                return pair
        return (OTHER, OTHER)


def redactions_counter(registry: CollectorRegistry) -> Counter:
    """``rl_export_redactions_total{kind}``, every kind at 0 from the start (a dashboard's
    rate() needs the series before the first redaction)."""
    counter = Counter(
        "rl_export_redactions_total",
        "Substrings replaced by [REDACTED:KIND] in exports and redacted corpora, by kind.",
        ["kind"],
        registry=registry,
    )
    for kind in REDACTION_KINDS:
        counter.labels(kind)
    return counter


class Metrics:
    """The metrics of one process."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry
        self.events = Counter(
            "rl_export_join_events_total",
            "Input events seen by the join, by event type and outcome "
            "(accepted, duplicate, pending, ignored, rejected).",
            ["event_type", "outcome"],
            registry=registry,
        )
        self.rejected = Counter(
            "rl_export_dead_letters_total",
            "Events sent to the dead-letter topic, by reason.",
            ["reason"],
            registry=registry,
        )
        self.dead_letter_references = Counter(
            "rl_export_dead_letter_references_total",
            "Dead letters the dead-letter topic refused for their size, sent instead as a "
            "reference (source topic, partition, offset, size, reason, first bytes), by "
            "reason; also counted in rl_export_dead_letters_total.",
            ["reason"],
            registry=registry,
        )
        self.snapshots = Counter(
            "rl_export_join_snapshots_total",
            "Snapshots emitted to the trajectories topic (tombstones included).",
            registry=registry,
        )
        self.table_keys = Gauge(
            "rl_export_join_table_keys",
            "Keys in this worker's join table: a state per trace (live, orphan, tombstone) "
            "and a conversation per trace that has arrived.",
            registry=registry,
        )
        self.forwarded = Counter(
            "rl_export_join_forwarded_total",
            "Valid events that arrived on another partition than their trace's and were "
            "forwarded to it, by the partitioner that would have routed them where they "
            "arrived (murmur2, crc32, fnv1a; none: random partitions).",
            ["matches"],
            registry=registry,
        )
        self.pair_sends = Counter(
            "rl_export_join_pair_sends_total",
            "What the join sent a comparison's other trace on the labels topic, by kind "
            "(mirror: a comparison or its retraction; pair.void: the pair is gone), resends "
            "after a failed transaction included (docs/concepts/join-rules.md).",
            ["kind"],
            registry=registry,
        )
        self.expired = Counter(
            "rl_export_join_expired_total",
            "States dropped from the table after their retention, by kind (orphan, tombstone).",
            ["kind"],
            registry=registry,
        )
        self.latency = BatchHistogram(
            "rl_export_join_latency_seconds",
            "From an event's Kafka timestamp to its snapshot being handed to the producer.",
            buckets=_LATENCY_BUCKETS,
            registry=registry,
        )
        self.core_events = Counter(
            "rl_export_join_core_events_total",
            "Input events the join decoded and merged in its native core (native) or with "
            "the Python rules (python: the core is off, or the event or its trace's state "
            "is one the core does not take, rejections included).",
            ["core"],
            registry=registry,
        )
        self.batch_size = Histogram(
            "rl_export_join_batch_events",
            "Events per batch taken from the stream.",
            buckets=(1, 10, 50, 100, 250, 500, 1000, 2500, 5000),
            registry=registry,
        )


class BatchHistogram:
    """A histogram without labels that takes a whole batch of observations at once.

    The sink observes the freshness of every record of a commit together, the join the
    latency of every snapshot of a batch, and
    ``Histogram.observe`` costs microseconds per value (a walk over the buckets and two
    locked updates), which added up to a sizeable part of the sink's time. This custom
    collector (the way prometheus_client supports for metrics it does not model) counts a
    batch into its buckets under one lock and is exposed with the same samples as a
    ``Histogram``: ``_bucket`` (cumulative, ``le`` as Prometheus writes it), ``_count``,
    ``_sum`` and ``_created``.
    """

    def __init__(
        self, name: str, documentation: str, *, buckets: Sequence[float],
        registry: CollectorRegistry,
    ) -> None:  # fmt: skip
        bounds = [float(b) for b in buckets]
        if bounds != sorted(bounds):
            raise ValueError("buckets not in sorted order")
        if not bounds or bounds[-1] != math.inf:
            bounds.append(math.inf)
        self.name = name
        self.documentation = documentation
        self._bounds = bounds
        # ``le`` as a Histogram writes it ("0.005", "1.0", "+Inf").
        self._les = [floatToGoString(b) for b in bounds]  # type: ignore[no-untyped-call]
        self._counts = [0] * len(bounds)  # per bucket, not cumulative
        self._sum = 0.0
        self._created = time.time()
        self._lock = threading.Lock()  # collect() runs in the metrics server's thread
        registry.register(self)

    def observe(self, value: float) -> None:
        self.observe_many((value,))

    def observe_many(self, values: Iterable[float]) -> None:
        """Observe every value, leaving exactly what as many ``observe`` calls would leave
        (the sum too: added one value at a time, in order)."""
        bounds, counts = self._bounds, self._counts
        with self._lock:
            total = self._sum
            for value in values:
                if not math.isnan(value):  # observe() counts NaN in no bucket
                    counts[bisect.bisect_left(bounds, value)] += 1  # the first bound >= value
                total += value
            self._sum = total

    def describe(self) -> Iterator[HistogramMetricFamily]:
        yield HistogramMetricFamily(self.name, self.documentation)

    def collect(self) -> Iterator[HistogramMetricFamily]:
        with self._lock:
            counts, total = list(self._counts), self._sum
        cumulative, buckets = 0, []
        for le, count in zip(self._les, counts, strict=True):
            cumulative += count
            buckets.append((le, float(cumulative)))
        family = HistogramMetricFamily(self.name, self.documentation, buckets, total)
        family.samples.append(Sample(f"{self.name}_created", {}, self._created, None, None))
        yield family


class SinkMetrics:
    """The sink's metrics (registered on the same registry as the join's).

    ``projects`` bounds the org/project label values of the objects counter
    (:class:`ProjectLabels`).
    """

    def __init__(self, registry: CollectorRegistry, projects: int = PROJECT_SERIES) -> None:
        self.projects = ProjectLabels(projects)
        self.objects = Counter(
            "rl_export_objects_written_total",
            "Objects the worker wrote to the store (the sink, compaction and the open "
            "tables), by org, project (the first 50 pairs met; the others as _other) and "
            "kind (shard, commit, sidecar, erasure, compaction, table, other): what an "
            "object store bills.",
            ["org", "project", "kind"],
            registry=registry,
        )
        self.table_writes = Counter(
            "rl_export_table_writes_total",
            "Writes of corpora's open tables (Delta Lake) by compaction, by outcome (merged, "
            "full, vacuumed, failed).",
            ["outcome"],
            registry=registry,
        )
        for outcome in TABLE_OUTCOMES:
            self.table_writes.labels(outcome)
        self.table_seconds = Histogram(
            "rl_export_table_write_seconds",
            "Time to bring a corpus's open table to a new compaction generation.",
            buckets=_LATENCY_BUCKETS,
            registry=registry,
        )
        self.feed_messages = Counter(
            "rl_export_feed_messages_total",
            "Messages sent to the change feed (RL_EXPORT_TOPIC_COMMITS), by kind (commit, "
            "compaction).",
            ["kind"],
            registry=registry,
        )
        for kind in FEED_KINDS:
            self.feed_messages.labels(kind)
        self.feed_errors = Counter(
            "rl_export_feed_errors_total",
            "Change-feed messages the broker did not take (sent again when the chain is "
            "read again; see docs/guides/tables.md).",
            registry=registry,
        )
        self.records = Counter(
            "rl_export_sink_records_total",
            "Records (and tombstones) committed to corpora, by corpus name.",
            ["corpus"],
            registry=registry,
        )
        self.bytes = Counter(
            "rl_export_sink_bytes_total",
            "Bytes of shard objects committed, by corpus name.",
            ["corpus"],
            registry=registry,
        )
        self.commits = Counter(
            "rl_export_sink_commits_total",
            "Commits created in manifest chains, by corpus name.",
            ["corpus"],
            registry=registry,
        )
        self.commit_latency = Histogram(
            "rl_export_sink_commit_latency_seconds",
            "From starting a shard upload to its commit being created.",
            buckets=_LATENCY_BUCKETS,
            registry=registry,
        )
        self.freshness = BatchHistogram(
            "rl_export_sink_freshness_seconds",
            "From an input event's Kafka timestamp to its record being visible in a corpus.",
            buckets=_FRESHNESS_BUCKETS,
            registry=registry,
        )
        self.quiet_freshness = BatchHistogram(
            "rl_export_sink_quiet_freshness_seconds",
            "From an input event's Kafka timestamp to its record being visible in a corpus, "
            "for the lines of quiet chains that waited past their partition's commit "
            "(RL_EXPORT_CORPUS_MAX_AGE_S; the web service shows them from the trajectories "
            "topic meanwhile). The others are in rl_export_sink_freshness_seconds.",
            buckets=_FRESHNESS_BUCKETS,
            registry=registry,
        )
        self.conflicts = Counter(
            "rl_export_sink_conflicts_total",
            "Create-only commits that lost to another writer.",
            registry=registry,
        )
        self.backfilled = Counter(
            "rl_export_sink_backfilled_records_total",
            "Records a new corpus was seeded with from the traces corpus's history, by corpus.",
            ["corpus"],
            registry=registry,
        )
        self.repeats = Counter(
            "rl_export_sink_repeats_dropped_total",
            "Snapshots dropped because the corpus already holds that revision or a later one.",
            registry=registry,
        )
        self.store_errors = Counter(
            "rl_export_sink_store_errors_total",
            "Object-store requests that failed (the flush is retried).",
            registry=registry,
        )
        self.compactions = Counter(
            "rl_export_sink_compactions_total",
            "Compaction generations this process created.",
            registry=registry,
        )
        self.early_flushes = Counter(
            "rl_export_sink_early_flushes_total",
            "Partitions whose shards were committed before their own bounds, to keep the "
            "sink's buffer within RL_EXPORT_SINK_BUFFER_MIB.",
            registry=registry,
        )
        self.buffered_bytes = Gauge(
            "rl_export_sink_buffered_bytes",
            "Bytes of records the sink holds, not yet committed to corpora (all partitions).",
            registry=registry,
        )
        self.paused = Gauge(
            "rl_export_sink_paused",
            "1 while the sink has paused reading: its buffer is over RL_EXPORT_SINK_BUFFER_MIB "
            "because the store refuses commits.",
            registry=registry,
        )
        self.left_out = Counter(
            "rl_export_sink_template_left_out_total",
            "Rows a corpus made for a chat template left out, by corpus and reason (raises, "
            "drops_text, drops_tool_calls, garbles_arguments).",
            ["corpus", "reason"],
            registry=registry,
        )
        self.bad_snapshots = Counter(
            "rl_export_sink_bad_snapshots_total",
            "Messages on the trajectories topic that are not snapshots (skipped).",
            registry=registry,
        )
        self.redactions = redactions_counter(registry)


_WEB_LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10)


class WebMetrics:
    """The web service's metrics: requests, export jobs, labels and the query index.

    ``route`` is the route's template (``/api/v1/{org}/{project}/stats``), never the path
    itself, and requests that match no route are counted under ``other``; ``corpus`` is the
    corpus name (``human``, ``evaluator``, ``traces``), summed over orgs and projects: every
    label has a bounded set of values.
    """

    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry
        self.requests = Counter(
            "rl_export_web_requests_total",
            "HTTP requests answered, by route template, method and status code.",
            ["route", "method", "status"],
            registry=registry,
        )
        self.latency = Histogram(
            "rl_export_web_request_duration_seconds",
            "Time to answer an HTTP request (to its last body byte), by route template.",
            ["route", "method"],
            buckets=_WEB_LATENCY_BUCKETS,
            registry=registry,
        )
        self.index_fresh_lines = Counter(
            "rl_export_web_index_fresh_lines_total",
            "Lines the query index took from the trajectories topic before their corpus "
            "committed them (new traces reach the queue and stats within a poll), by corpus.",
            ["corpus"],
            registry=registry,
        )
        self.auth_failures = Counter(
            "rl_export_web_auth_failures_total",
            "Requests refused by the token check, by reason (missing, malformed, unknown, "
            "revoked, expired, project, scope, throttled: 429 after too many 401s).",
            ["reason"],
            registry=registry,
        )
        self.raw_reads = Counter(
            "rl_export_raw_reads_total",
            "Reads with a redaction weaker than the project's default (scope raw), each "
            "audited, by route (export, records, exports).",
            ["route"],
            registry=registry,
        )
        self.published = Counter(
            "rl_export_web_events_published_total",
            "Label events acknowledged by the broker, by event type.",
            ["event_type"],
            registry=registry,
        )
        self.publish_failures = Counter(
            "rl_export_web_publish_failures_total",
            "Label events the broker did not acknowledge in time (answered 503).",
            registry=registry,
        )
        self.tail_skipped = Counter(
            "rl_export_web_tail_skipped_total",
            "Records of the labels, claims or trajectories topic the web service's followers "
            "could not take: skipped, and the records behind them read on; by topic.",
            ["topic"],
            registry=registry,
        )
        self.jobs = Counter(
            "rl_export_web_export_jobs_total",
            "Background export jobs of this instance, by outcome (started, ready, failed).",
            ["outcome"],
            registry=registry,
        )
        self.jobs_running = Gauge(
            "rl_export_web_export_jobs_running",
            "Background export jobs running in this instance's export processes.",
            registry=registry,
        )
        self.exports_running = Gauge(
            "rl_export_web_exports_running",
            "Direct exports (GET export) running or waiting on this instance's export pool.",
            registry=registry,
        )
        self.throttled = Counter(
            "rl_export_web_throttled_total",
            "Requests refused with 429 because their subject was over its share (direct "
            "exports, jobs).",
            ["what"],
            registry=registry,
        )
        self.index_records = Gauge(
            "rl_export_web_index_records",
            "Live records (latest revision per trace) in this instance's query index, by corpus.",
            ["corpus"],
            registry=registry,
        )
        self.index_ingested = Counter(
            "rl_export_web_index_lines_total",
            "Corpus lines (records and tombstones) the query index has read, by corpus.",
            ["corpus"],
            registry=registry,
        )
        self.index_objects = Counter(
            "rl_export_web_index_objects_total",
            "Store objects the query index has read, by corpus and how: 'columns' (its index "
            "sidecar; bodies stay in the store) or 'lines' (the records parsed).",
            ["corpus", "read"],
            registry=registry,
        )
        self.index_sidecars_refused = Counter(
            "rl_export_web_index_sidecars_refused_total",
            "Index sidecars refused (missing, or not matching their object): the object was "
            "read whole instead.",
            registry=registry,
        )
        self.index_lag = Gauge(
            "rl_export_web_index_lag_seconds",
            "Worst over the followed corpora: seconds since the index last saw the head of "
            "every chain of the corpus (0 while it is caught up), by corpus.",
            ["corpus"],
            registry=registry,
        )
        self.index_corpora = Gauge(
            "rl_export_web_index_corpora",
            "Corpora this instance's query index follows.",
            registry=registry,
        )
        self.redactions = redactions_counter(registry)
        self.claims = Counter(
            "rl_export_web_claims_total",
            "Labeling claims by outcome (granted, renewed, lost, released, ended).",
            ["outcome"],
            registry=registry,
        )
        for outcome in CLAIM_OUTCOMES:
            self.claims.labels(outcome)
        self.comparisons_over_target = Counter(
            "rl_export_comparisons_over_target_total",
            "Comparisons accepted although their pair already held its target of comparisons "
            "and claims (a comparison whose claim had expired and whose place someone took).",
            registry=registry,
        )
        self.labels_over_target = Counter(
            "rl_export_labels_over_target_total",
            "Labels accepted although their trace already held its target of labels and "
            "claims (a label whose claim had expired and whose place someone else took).",
            registry=registry,
        )
