"""Every rl_export_* metric the alert rules and the Grafana dashboard read is exported by a
running worker or web service: no panel or alert for a metric that does not exist.

A real worker (join processes and sink) and a real web service run against the session's
Kafka broker and SeaweedFS; their ``/metrics`` pages are scraped as Prometheus would. A
histogram counts by its ``_bucket``, ``_sum`` and ``_count`` samples; a labelled counter
that has not been incremented yet counts by its ``# TYPE`` line (its first increment adds
the series). The names of kafka-exporter, kube-state-metrics and Prometheus are checked
against their documentation in tests/unit/test_alerts.py and test_dashboard.py.
"""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

from rl_export.local.broker import LocalKafka
from rl_export.local.seaweed import LocalS3
from rl_export.runtime.settings import Settings
from tests.deployfiles import (
    alert_queries,
    dashboard_queries,
    exposed_sample_names,
    load_alert_rules,
    load_dashboard,
    our_metric_names,
)
from tests.integration.conftest import run_settings, unique
from tests.integration.webproc import WebProcess
from tests.integration.workers import WorkerProcess


@pytest.fixture(scope="module")
def stack_settings(
    kafka: LocalKafka, s3: LocalS3, tmp_path_factory: pytest.TempPathFactory
) -> Settings:
    """One run's topics and groups, the corpora in the S3 store, as deployed."""
    run = unique("deploy")
    return run_settings(kafka, run, tmp_path_factory.mktemp("deploy"), f"s3://{s3.bucket}/{run}")


@pytest.fixture(scope="module")
def exported(stack_settings: Settings) -> Iterator[dict[str, set[str]]]:
    """The sample names each running service exports: {"worker": ..., "web": ...}."""
    worker = WorkerProcess(stack_settings, "worker", store="rocksdb://").start()
    try:
        web = WebProcess(stack_settings, "web").start()
        try:
            worker_text = httpx.get(worker.url("/metrics"), timeout=10).text
            yield {
                "worker": exposed_sample_names(worker_text),
                "web": exposed_sample_names(web.metrics()),
            }
        finally:
            web.stop()
    finally:
        worker.stop()


def test_every_alert_metric_is_exported(exported: dict[str, set[str]]) -> None:
    used = our_metric_names(alert_queries(load_alert_rules()))
    assert used, "the alert rules read no rl_export_* metric"
    every = exported["worker"] | exported["web"]
    assert {name: where for name, where in used.items() if name not in every} == {}


def test_every_dashboard_metric_is_exported(exported: dict[str, set[str]]) -> None:
    used = our_metric_names(dashboard_queries(load_dashboard()))
    assert len(used) >= 15
    every = exported["worker"] | exported["web"]
    assert {name: where for name, where in used.items() if name not in every} == {}


def test_each_service_exports_its_own_metrics(exported: dict[str, set[str]]) -> None:
    """The join's metrics come through the worker (summed over its join processes), the
    web's through the web service; redactions are counted by both."""
    worker, web = exported["worker"], exported["web"]
    assert {"rl_export_join_events_total", "rl_export_join_snapshots_total",
            "rl_export_sink_freshness_seconds_bucket", "rl_export_sink_store_errors_total",
            "rl_export_redactions_total"} <= worker  # fmt: skip
    assert {"rl_export_web_requests_total", "rl_export_web_request_duration_seconds_bucket",
            "rl_export_web_index_lag_seconds", "rl_export_web_claims_total",
            "rl_export_labels_over_target_total", "rl_export_redactions_total"} <= web  # fmt: skip
    assert "rl_export_web_requests_total" not in worker
    assert "rl_export_join_events_total" not in web


def test_a_missing_metric_would_be_reported(exported: dict[str, set[str]]) -> None:
    every = exported["worker"] | exported["web"]
    assert "rl_export_consumer_lag" not in every
    assert "rl_export_sink_freshness_seconds" not in every  # a histogram has no bare sample
