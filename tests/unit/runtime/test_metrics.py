"""The sink's batch histogram reads exactly like a prometheus_client Histogram."""

from __future__ import annotations

import math

import pytest
from prometheus_client import CollectorRegistry, Histogram, generate_latest

from rl_export.runtime.metrics import BatchHistogram, SinkMetrics

BUCKETS = (0.005, 0.01, 0.5, 1, 2.5, 300)
VALUES = [0.0, 0.005, 0.0051, 0.01, 0.3, 1.0, 1.0, 2.4999, 2.5, 299.0, 300.0, 301.0, 1e9]


def exposition(registry: CollectorRegistry) -> list[str]:
    """The text a scrape reads, ``_created`` times aside."""
    text = generate_latest(registry).decode()
    return [line for line in text.splitlines() if "_created " not in line]


def test_a_batch_reads_like_the_same_values_observed_one_by_one() -> None:
    plain_registry, batch_registry = CollectorRegistry(), CollectorRegistry()
    plain = Histogram("h_seconds", "Help.", buckets=BUCKETS, registry=plain_registry)
    batch = BatchHistogram("h_seconds", "Help.", buckets=BUCKETS, registry=batch_registry)
    for value in VALUES:
        plain.observe(value)
    batch.observe_many(VALUES[:5])
    batch.observe_many([])
    batch.observe(VALUES[5])
    batch.observe_many(iter(VALUES[6:]))
    assert exposition(batch_registry) == exposition(plain_registry)
    for le in ("0.005", "0.01", "0.5", "1.0", "2.5", "300.0", "+Inf"):
        name, labels = "h_seconds_bucket", {"le": le}
        assert batch_registry.get_sample_value(name, labels) == plain_registry.get_sample_value(
            name, labels
        )
    assert batch_registry.get_sample_value("h_seconds_count") == len(VALUES)
    # The sum too, to the last bit: added in the same order.
    assert batch_registry.get_sample_value("h_seconds_sum") == plain_registry.get_sample_value(
        "h_seconds_sum"
    )
    assert batch_registry.get_sample_value("h_seconds_created") is not None


def test_nan_is_in_the_sum_and_no_bucket_as_observe_leaves_it() -> None:
    plain_registry, batch_registry = CollectorRegistry(), CollectorRegistry()
    plain = Histogram("h_seconds", "Help.", buckets=BUCKETS, registry=plain_registry)
    batch = BatchHistogram("h_seconds", "Help.", buckets=BUCKETS, registry=batch_registry)
    plain.observe(math.nan)
    plain.observe(0.2)
    batch.observe_many([math.nan, 0.2])
    assert exposition(batch_registry) == exposition(plain_registry)


def test_the_registry_knows_its_names() -> None:
    registry = CollectorRegistry()
    metrics = SinkMetrics(registry)
    metrics.freshness.observe_many([0.2, 7.0])
    assert registry.get_sample_value("rl_export_sink_freshness_seconds_count") == 2
    with pytest.raises(ValueError, match="Duplicated"):
        Histogram("rl_export_sink_freshness_seconds", "Again.", registry=registry)


def test_buckets_must_be_sorted() -> None:
    with pytest.raises(ValueError, match="sorted"):
        BatchHistogram("h", "Help.", buckets=(1, 0.5), registry=CollectorRegistry())
