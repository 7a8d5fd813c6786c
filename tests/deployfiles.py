"""The operations files under deploy/, read for the tests: alert rules, the Grafana dashboard,
the PromQL they hold and the metric names that PromQL reads.

Used by the static checks (tests/unit/test_alerts.py, test_dashboard.py) and by the
integration test that scrapes a running worker and web service
(tests/integration/test_deploy_metrics.py).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import promql_parser
import yaml
from prometheus_client import CollectorRegistry, generate_latest

from rl_export.runtime.metrics import Metrics, SinkMetrics, WebMetrics

ROOT = Path(__file__).resolve().parents[1]
DEPLOY = ROOT / "deploy"
ALERTS_FILE = DEPLOY / "prometheus" / "alerts.yml"
DASHBOARD_FILE = DEPLOY / "grafana" / "dashboards" / "rl-export.json"
RUNBOOK_FILE = ROOT / "docs" / "operations" / "runbook.md"

OUR_PREFIX = "rl_export_"

# Metrics the rules and the dashboard read that rl-export does not export, each from the
# documentation of what exports it. Anything else must be an rl_export_* name.
KAFKA_EXPORTER_DOC = "danielqsj/kafka_exporter README, section Metrics (image v1.9.0)"
EXTERNAL_METRICS: dict[str, str] = {
    "kafka_consumergroup_lag": KAFKA_EXPORTER_DOC,
    "kafka_consumergroup_lag_sum": KAFKA_EXPORTER_DOC,
    "kafka_consumergroup_current_offset": KAFKA_EXPORTER_DOC,
    "kafka_consumergroup_current_offset_sum": KAFKA_EXPORTER_DOC,
    "kafka_consumergroup_members": KAFKA_EXPORTER_DOC,
    "kafka_topic_partitions": KAFKA_EXPORTER_DOC,
    "kafka_topic_partition_current_offset": KAFKA_EXPORTER_DOC,
    "kafka_topic_partition_oldest_offset": KAFKA_EXPORTER_DOC,
    "kafka_brokers": KAFKA_EXPORTER_DOC,
    "kube_deployment_status_replicas_unavailable": (
        "kubernetes/kube-state-metrics docs/metrics/workload/deployment-metrics.md"
    ),
    "up": "Prometheus: the health of each scrape (jobs and instances documentation)",
}

# What Grafana puts in place of its variables before a query reaches Prometheus (for the
# parser: a dashboard's own variables take their default values).
GRAFANA_BUILTINS = {"__rate_interval": "1m", "__interval": "15s", "__range": "1h"}


@dataclass(frozen=True)
class Query:
    """One PromQL expression and where it is written."""

    where: str
    expr: str


def load_alert_rules(path: Path = ALERTS_FILE) -> list[dict[str, Any]]:
    data = yaml.safe_load(path.read_text(encoding="utf-8"))
    return [rule for group in data["groups"] for rule in group["rules"]]


def load_dashboard(path: Path = DASHBOARD_FILE) -> dict[str, Any]:
    data = json.loads(path.read_text(encoding="utf-8"))
    assert isinstance(data, dict)
    return data


def dashboard_panels(dashboard: dict[str, Any]) -> list[dict[str, Any]]:
    """Every panel, those inside collapsed rows included (rows themselves excluded)."""
    found: list[dict[str, Any]] = []
    for panel in dashboard["panels"]:
        if panel.get("type") == "row":
            found.extend(panel.get("panels", []))
        else:
            found.append(panel)
    return found


def variable_defaults(dashboard: dict[str, Any]) -> dict[str, str]:
    """Each templating variable's current value (text boxes, constants, custom lists)."""
    values = dict(GRAFANA_BUILTINS)
    for variable in dashboard.get("templating", {}).get("list", []):
        current = variable.get("current") or {}
        value = current.get("value", variable.get("query", ""))
        values[variable["name"]] = str(value)
    return values


def interpolate(expr: str, values: dict[str, str]) -> str:
    """``$name`` and ``${name}`` replaced by their values; an unknown variable is an error."""

    def replace(match: re.Match[str]) -> str:
        name = match.group(1) or match.group(2)
        if name not in values:
            raise KeyError(f"unknown dashboard variable ${name} in {expr!r}")
        return values[name]

    return re.sub(r"\$\{(\w+)\}|\$(\w+)", replace, expr)


def alert_queries(rules: list[dict[str, Any]]) -> list[Query]:
    return [Query(f"alert {rule['alert']}", str(rule["expr"])) for rule in rules]


def dashboard_queries(dashboard: dict[str, Any]) -> list[Query]:
    values = variable_defaults(dashboard)
    return [
        Query(f"panel {panel['title']!r} {target['refId']}", interpolate(target["expr"], values))
        for panel in dashboard_panels(dashboard)
        for target in panel.get("targets", [])
    ]


def metric_names(expr: str) -> set[str]:
    """The metric names an expression selects (raises ValueError if it does not parse).

    A selector without a plain metric name (``{__name__=~"..."}``) is refused: the checks
    below could not say which metrics it reads.
    """
    names: set[str] = set()
    unnamed: list[str] = []

    def visit(node: Any) -> bool:
        if isinstance(node, promql_parser.VectorSelector):
            if node.name:
                names.add(node.name)
            else:
                unnamed.append(str(node))
        return True

    promql_parser.walk(promql_parser.parse(expr), visit)
    if unnamed:
        raise ValueError(f"selector without a metric name: {unnamed}")
    return names


def family_of(sample_name: str) -> str:
    """The metric family a histogram sample name belongs to (``_bucket/_sum/_count``)."""
    for suffix in ("_bucket", "_sum", "_count"):
        if sample_name.endswith(suffix):
            return sample_name.removesuffix(suffix)
    return sample_name


def our_metric_names(queries: list[Query]) -> dict[str, list[str]]:
    """Every rl_export_* name read by the queries, with where each is read."""
    found: dict[str, list[str]] = {}
    for query in queries:
        for name in metric_names(query.expr):
            if name.startswith(OUR_PREFIX):
                found.setdefault(name, []).append(query.where)
    return found


def exposed_sample_names(text: str) -> set[str]:
    """The sample names a Prometheus text exposition offers, declared or present.

    A labelled counter that was never incremented has ``# TYPE`` and no sample yet; it is
    still exported (its first increment adds the series), so the names its type implies
    count: ``x_total`` for a counter, ``x_bucket``, ``x_sum`` and ``x_count`` for a
    histogram.
    """
    names: set[str] = set()
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split(maxsplit=3)
            if kind == "histogram":
                names |= {f"{name}_bucket", f"{name}_sum", f"{name}_count"}
            elif kind == "summary":
                names |= {name, f"{name}_sum", f"{name}_count"}
            elif kind == "counter":
                names.add(name if name.endswith("_total") else f"{name}_total")
            else:
                names.add(name)
        elif line and not line.startswith("#"):
            names.add(re.split(r"[{\s]", line, maxsplit=1)[0])
    return names


def defined_metric_names() -> set[str]:
    """Every sample name the metric classes of rl-export declare, on fresh registries."""
    worker, web = CollectorRegistry(), CollectorRegistry()
    Metrics(worker)
    SinkMetrics(worker)
    WebMetrics(web)
    return exposed_sample_names(generate_latest(worker).decode()) | exposed_sample_names(
        generate_latest(web).decode()
    )


def unknown_metrics(queries: list[Query]) -> set[tuple[str, str]]:
    """(where, name) of each metric read that rl-export does not define (rl_export_*) or
    that is not in ``EXTERNAL_METRICS`` (anything else)."""
    defined = defined_metric_names()
    return {
        (query.where, name)
        for query in queries
        for name in metric_names(query.expr)
        if (name not in defined if name.startswith(OUR_PREFIX) else name not in EXTERNAL_METRICS)
    }
