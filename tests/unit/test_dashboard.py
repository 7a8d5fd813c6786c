"""Offline checks of the Grafana dashboard (deploy/grafana/dashboards/rl-export.json) and
of how docker-compose.yml provisions it.

Import-ready: the data source is a dashboard variable (no ``__inputs`` to fill in), panel ids
are unique and panels do not overlap. Every query parses once Grafana's variables are put in,
and reads only metrics rl-export defines or kafka-exporter documents; the panels the issue
asks for are there. That running services export the rl_export_* names is checked by
tests/integration/test_deploy_metrics.py.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.deployfiles import (
    DASHBOARD_FILE,
    ROOT,
    Query,
    dashboard_panels,
    dashboard_queries,
    interpolate,
    load_dashboard,
    metric_names,
    unknown_metrics,
)

GRAFANA_PROVISIONING = ROOT / "deploy" / "grafana" / "provisioning"

# The panels issue 34 asks for, each by a metric it must read.
REQUIRED_PANELS = {
    "input rate per topic": "kafka_topic_partition_current_offset",
    "lag per topic": "kafka_consumergroup_lag_sum",
    "join events by outcome": "rl_export_join_events_total",
    "dead letters by reason": "rl_export_dead_letters_total",
    "snapshot rate": "rl_export_join_snapshots_total",
    "sink commits": "rl_export_sink_commits_total",
    "freshness p50/p99": "rl_export_sink_freshness_seconds_bucket",
    "store errors": "rl_export_sink_store_errors_total",
    "web request rate": "rl_export_web_requests_total",
    "web p99 by route": "rl_export_web_request_duration_seconds_bucket",
    "index lag": "rl_export_web_index_lag_seconds",
    "export jobs": "rl_export_web_export_jobs_total",
    "redactions": "rl_export_redactions_total",
    "labels over target": "rl_export_labels_over_target_total",
    "claims": "rl_export_web_claims_total",
    # Issue 58: objects written per org/project, and the open tables' writes.
    "objects written": "rl_export_objects_written_total",
    "table writes": "rl_export_table_writes_total",
}


@pytest.fixture(scope="module")
def dashboard() -> dict[str, Any]:
    return load_dashboard()


def test_data_source_is_a_variable(dashboard: dict[str, Any]) -> None:
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    assert "__inputs" not in dashboard, "provisioning does not fill __inputs: use the variable"
    for panel in dashboard_panels(dashboard):
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, panel["title"]
        for target in panel["targets"]:
            assert target["datasource"] == panel["datasource"]


def test_panels_have_unique_ids_and_do_not_overlap(dashboard: dict[str, Any]) -> None:
    ids = [p["id"] for p in dashboard["panels"]] + [
        p["id"] for row in dashboard["panels"] for p in row.get("panels", [])
    ]
    assert len(ids) == len(set(ids))
    cells: dict[tuple[int, int], str] = {}
    for panel in dashboard["panels"]:
        grid = panel["gridPos"]
        assert grid["x"] + grid["w"] <= 24, panel["title"]
        for x in range(grid["x"], grid["x"] + grid["w"]):
            for y in range(grid["y"], grid["y"] + grid["h"]):
                assert (x, y) not in cells, f"{panel['title']} overlaps {cells.get((x, y))}"
                cells[(x, y)] = panel["title"]


@pytest.mark.parametrize("query", dashboard_queries(load_dashboard()), ids=lambda q: q.where)
def test_every_query_parses(query: Query) -> None:
    assert metric_names(query.expr)


def test_an_unknown_variable_is_an_error() -> None:
    with pytest.raises(KeyError, match="consumer_group"):
        interpolate('kafka_consumergroup_lag_sum{consumergroup=~"$consumer_group"}', {})


def test_metrics_are_ours_or_documented_by_their_exporter(dashboard: dict[str, Any]) -> None:
    assert unknown_metrics(dashboard_queries(dashboard)) == set()


@pytest.mark.parametrize(("panel", "metric"), REQUIRED_PANELS.items())
def test_the_required_panels_are_there(dashboard: dict[str, Any], panel: str, metric: str) -> None:
    read = set().union(*(metric_names(q.expr) for q in dashboard_queries(dashboard)))
    assert metric in read, f"no panel for {panel} (reads {metric})"


def test_panels_say_what_they_show(dashboard: dict[str, Any]) -> None:
    for panel in dashboard_panels(dashboard):
        assert panel["title"], panel
        assert panel["description"], panel["title"]


# --- docker-compose.yml's Grafana ------------------------------------------------------------


def compose_service(name: str) -> dict[str, Any]:
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text(encoding="utf-8"))
    svc = compose["services"][name]
    assert isinstance(svc, dict)
    return svc


def mounts(name: str) -> dict[str, Path]:
    """Container path -> repository path of a service's bind mounts."""
    found = {}
    for mount in compose_service(name).get("volumes", []):
        source, _, rest = str(mount).partition(":")
        if source.startswith("./"):
            found[rest.split(":")[0]] = ROOT / source
    return found


def test_grafana_is_provisioned_with_prometheus_and_the_dashboard() -> None:
    bound = mounts("grafana")
    assert bound["/etc/grafana/provisioning"] == GRAFANA_PROVISIONING
    datasource = yaml.safe_load(
        (GRAFANA_PROVISIONING / "datasources" / "prometheus.yml").read_text(encoding="utf-8")
    )["datasources"][0]
    assert datasource["type"] == "prometheus"
    assert datasource["url"] == "http://prometheus:9090"
    assert "9090:9090" in compose_service("prometheus")["ports"]
    provider = yaml.safe_load(
        (GRAFANA_PROVISIONING / "dashboards" / "rl-export.yml").read_text(encoding="utf-8")
    )["providers"][0]
    folder = bound[provider["options"]["path"]]
    assert folder / DASHBOARD_FILE.name == DASHBOARD_FILE


def test_prometheus_loads_the_alert_rules() -> None:
    config = yaml.safe_load(
        (ROOT / "deploy" / "prometheus" / "prometheus.yml").read_text(encoding="utf-8")
    )
    bound = mounts("prometheus")
    for path in config["rule_files"]:
        assert path in bound, f"{path} is not mounted into the prometheus service"
        assert bound[path].is_file()
