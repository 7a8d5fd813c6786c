"""Every Prometheus metric of rl-export, in one container bound to a registry.

Names follow ``rl_export_<noun>_<unit>[_total]``; label values come from closed sets
(event types, :class:`~rl_export.events.RejectReason`, outcomes), so cardinality is bounded.
Tests build ``Metrics(CollectorRegistry())`` and read the values back.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300)


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
        self.snapshots = Counter(
            "rl_export_join_snapshots_total",
            "Snapshots emitted to the trajectories topic (tombstones included).",
            registry=registry,
        )
        self.table_keys = Gauge(
            "rl_export_join_table_keys",
            "Traces held in this worker's join table (live, orphan and tombstone).",
            registry=registry,
        )
        self.expired = Counter(
            "rl_export_join_expired_total",
            "States dropped from the table after their retention, by kind (orphan, tombstone).",
            ["kind"],
            registry=registry,
        )
        self.latency = Histogram(
            "rl_export_join_latency_seconds",
            "From an event's Kafka timestamp to its snapshot being handed to the producer.",
            buckets=_LATENCY_BUCKETS,
            registry=registry,
        )
        self.batch_size = Histogram(
            "rl_export_join_batch_events",
            "Events per batch taken from the stream.",
            buckets=(1, 10, 50, 100, 250, 500, 1000, 2500, 5000),
            registry=registry,
        )
