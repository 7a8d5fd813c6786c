"""The worker's page sums the metrics of its join processes."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from rl_export.worker.joins import sum_metrics


def process_text(events: int, keys: int, latencies: list[float]) -> str:
    registry = CollectorRegistry()
    counter = Counter("x_events", "events", ["outcome"], registry=registry)
    counter.labels("accepted").inc(events)
    Gauge("x_table_keys", "keys", registry=registry).set(keys)
    histogram = Histogram("x_latency_seconds", "latency", buckets=(0.1, 1.0), registry=registry)
    for value in latencies:
        histogram.observe(value)
    return generate_latest(registry).decode()


def samples(text: bytes) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text.decode())
        for s in family.samples
    }


def test_counters_gauges_and_histograms_add_up() -> None:
    total = samples(sum_metrics([process_text(3, 10, [0.05, 2.0]), process_text(4, 5, [0.5])]))

    assert total[("x_events_total", (("outcome", "accepted"),))] == 7
    assert total[("x_table_keys", ())] == 15
    assert total[("x_latency_seconds_bucket", (("le", "0.1"),))] == 1
    assert total[("x_latency_seconds_bucket", (("le", "1.0"),))] == 2
    assert total[("x_latency_seconds_bucket", (("le", "+Inf"),))] == 3
    assert total[("x_latency_seconds_count", ())] == 3
    assert total[("x_latency_seconds_sum", ())] == pytest.approx(2.55)
    assert b"_created" not in sum_metrics([process_text(1, 1, [])])


def test_one_process_is_unchanged_and_none_is_empty() -> None:
    text = process_text(2, 1, [0.2])
    alone = {k: v for k, v in samples(text.encode()).items() if not k[0].endswith("_created")}
    assert samples(sum_metrics([text])) == alone
    assert sum_metrics([]) == b""
