"""Offline checks of the alert rules (deploy/prometheus/alerts.yml) and their runbook.

Prometheus's own promtool (``make install`` unpacks it from Debian's prometheus package into
``.cache/``) checks the rule file and runs its unit tests, deploy/prometheus/alerts.test.yml:
each alert fires on series that should page and stays quiet on a near miss. Every
expression parses (promql-parser); every metric it reads is one rl-export defines
(:mod:`rl_export.runtime.metrics`) or one an exporter documents (``EXTERNAL_METRICS``); every
alert links a section of docs/operations/runbook.md that exists, and every section belongs
to an alert. That running services really export the rl_export_* names is checked by
tests/integration/test_deploy_metrics.py.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.deployfiles import (
    ALERTS_FILE,
    ROOT,
    RUNBOOK_FILE,
    Query,
    alert_queries,
    defined_metric_names,
    exposed_sample_names,
    load_alert_rules,
    metric_names,
    unknown_metrics,
)

# What the alerts must cover (issue 34): each concern, and the alert that pages on it.
REQUIRED_ALERTS = {
    "lag growing for 10 minutes": "RlExportConsumerLagGrowing",
    "freshness p99 above its objective": "RlExportFreshnessSlow",
    "dead-letter rate spike": "RlExportDeadLetterSpike",
    "store errors": "RlExportStoreErrors",
    "a worker not ready": "RlExportWorkerNotReady",
    "the web 5xx ratio": "RlExportWeb5xx",
    "export jobs failing": "RlExportExportJobsFailing",
    "index lag": "RlExportIndexLag",
}
SEVERITIES = {"warning", "critical"}
PROMTOOL = ROOT / ".cache" / "promtool" / "promtool"
ALERT_TESTS_FILE = ALERTS_FILE.with_name("alerts.test.yml")


@pytest.fixture(scope="module")
def rules() -> list[dict[str, Any]]:
    return load_alert_rules()


def runbook_anchors() -> set[str]:
    """The anchors of the runbook's sections, as GitHub and MkDocs make them (lowercase)."""
    text = RUNBOOK_FILE.read_text(encoding="utf-8")
    return {m.lower() for m in re.findall(r"^## (\S+)\s*$", text, re.MULTILINE)}


def test_the_required_alerts_exist(rules: list[dict[str, Any]]) -> None:
    names = [rule["alert"] for rule in rules]
    assert len(names) == len(set(names)), "an alert name repeats"
    assert set(REQUIRED_ALERTS.values()) <= set(names)


def test_lag_alert_waits_ten_minutes(rules: list[dict[str, Any]]) -> None:
    lag = next(r for r in rules if r["alert"] == REQUIRED_ALERTS["lag growing for 10 minutes"])
    assert lag["for"] == "10m"
    assert "[10m]" in lag["expr"]


@pytest.mark.parametrize("query", alert_queries(load_alert_rules()), ids=lambda q: q.where)
def test_every_expression_parses(query: Any) -> None:
    assert metric_names(query.expr)


def test_the_parser_refuses_a_broken_expression() -> None:
    with pytest.raises(ValueError, match="parenthesis"):
        metric_names("sum(rate(rl_export_dead_letters_total[5m])")


def test_metrics_are_ours_or_documented_by_their_exporter(rules: list[dict[str, Any]]) -> None:
    assert unknown_metrics(alert_queries(rules)) == set()


def test_a_metric_that_does_not_exist_is_caught() -> None:
    assert unknown_metrics([Query("x", "rate(rl_export_consumer_lag_total[5m]) + kafka_lag")]) == {
        ("x", "rl_export_consumer_lag_total"),
        ("x", "kafka_lag"),
    }
    defined = defined_metric_names()
    assert "rl_export_sink_store_errors_total" in defined
    assert "rl_export_sink_freshness_seconds_bucket" in defined
    assert "rl_export_consumer_lag" not in defined


@pytest.mark.parametrize("rule", load_alert_rules(), ids=lambda r: r["alert"])
def test_each_alert_is_labelled_and_links_its_runbook_section(rule: dict[str, Any]) -> None:
    assert rule["labels"]["severity"] in SEVERITIES
    assert rule["annotations"]["summary"]
    url = rule["annotations"]["runbook_url"]
    path, _, anchor = url.partition("#")
    # Absolute: the docs site of the deployment (an external label), then the runbook's page.
    assert path == "{{ $externalLabels.rl_export_docs }}/operations/runbook/"
    assert anchor == rule["alert"].lower()
    assert anchor in runbook_anchors(), f"no section '## {rule['alert']}' in the runbook"


def test_every_runbook_section_belongs_to_an_alert(rules: list[dict[str, Any]]) -> None:
    assert runbook_anchors() == {rule["alert"].lower() for rule in rules}


def test_runbook_sections_say_what_it_means_and_what_to_do() -> None:
    text = RUNBOOK_FILE.read_text(encoding="utf-8")
    sections = re.split(r"^## ", text, flags=re.MULTILINE)[1:]
    for section in sections:
        title = section.splitlines()[0]
        assert "**Means.**" in section, title
        assert "**Do.**" in section, title


def test_exposed_names_read_prometheus_text() -> None:
    """A counter by its TYPE line, a histogram by its three sample names."""
    text = '# HELP a_total x\n# TYPE a_total counter\n# TYPE h histogram\nh_bucket{le="1"} 0\n'
    assert exposed_sample_names(text) == {"a_total", "h_bucket", "h_sum", "h_count"}


def promtool(*args: str) -> subprocess.CompletedProcess[str]:
    if not PROMTOOL.is_file():
        pytest.skip(f"promtool is not installed at {PROMTOOL} (make install fetches it)")
    return subprocess.run(
        [str(PROMTOOL), *args], capture_output=True, text=True, timeout=120, check=False
    )


def test_promtool_accepts_the_rule_file() -> None:
    done = promtool("check", "rules", str(ALERTS_FILE))
    assert done.returncode == 0, done.stdout + done.stderr


def test_alerts_fire_as_their_unit_tests_say() -> None:
    done = promtool("test", "rules", str(ALERT_TESTS_FILE))
    assert done.returncode == 0, done.stdout + done.stderr


def test_every_alert_has_a_unit_test_that_fires_it(rules: list[dict[str, Any]]) -> None:
    tests = yaml.safe_load(ALERT_TESTS_FILE.read_text(encoding="utf-8"))["tests"]
    fired = {
        case["alertname"]
        for test in tests
        for case in test.get("alert_rule_test", [])
        if case.get("exp_alerts")
    }
    assert fired == {rule["alert"] for rule in rules}


def test_a_wrong_expectation_fails_the_promtool_tests(tmp_path: Path) -> None:
    """The same tests against rules whose freshness objective is 60 s instead of 30 s."""
    (tmp_path / "alerts.yml").write_text(
        ALERTS_FILE.read_text(encoding="utf-8").replace(") > 30\n", ") > 60\n"), encoding="utf-8"
    )
    (tmp_path / "alerts.test.yml").write_text(
        ALERT_TESTS_FILE.read_text(encoding="utf-8"), encoding="utf-8"
    )
    done = promtool("test", "rules", str(tmp_path / "alerts.test.yml"))
    assert done.returncode != 0
    assert "RlExportFreshnessSlow" in done.stdout + done.stderr
