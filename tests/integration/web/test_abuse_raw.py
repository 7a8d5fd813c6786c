"""Raw access (DESIGN.md section 10) against the running service: a read that redacts less
than the project's default needs the ``raw`` scope, which ``admin`` does not imply, on the
preview, the direct export and jobs; with it the read is served and audited, and
``rl-export audit`` lists the entry."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import httpx
import pytest

from tests.harness.workers import settings_env
from tests.integration.web.conftest import Stack

KEY = "AKIAIOSFODNN7EXAMPLE"  # a secret of the seeded trip traces
WEAKER = ("none", "email", "pii")  # none of them covers the default, secrets


def client(stack: Stack, name: str) -> httpx.Client:
    return stack.web.client(stack.tokens[name])


@pytest.fixture
def raw(stack: Stack) -> Iterator[httpx.Client]:
    with client(stack, "raw") as api:
        yield api


def audit_lines(stack: Stack, *extra: str) -> list[dict[str, object]]:
    result = subprocess.run(
        [sys.executable, "-m", "rl_export.cli", "audit", "--org", "acme", "--project", "bot",
         *extra],
        capture_output=True, text=True, timeout=60, check=False, env=settings_env(stack.settings),
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    return [json.loads(line) for line in result.stdout.splitlines()]


def test_weaker_redaction_without_raw_is_a_403_for_every_token(stack: Stack) -> None:
    params = {"source": "evaluator", "scenario": "trip"}
    for name in ("admin", "export"):
        with client(stack, name) as api:
            for redact in WEAKER:
                job = {"source": "evaluator", "format": "trajectory", "redact": redact}
                asks = (
                    api.get("records", params=params | {"redact": redact}),
                    api.get("export", params=params | {"redact": redact}),
                    api.post("exports", json=job),
                )
                for response in asks:
                    assert response.status_code == 403, (name, redact, response.text)
                    body = response.json()
                    assert body["error"] == "raw_required"
                    assert "raw scope" in body["detail"]
                    assert KEY not in response.text
            # The default, or more than it, needs nothing more.
            more = api.get("records", params=params | {"redact": "secrets,email"})
            assert more.status_code == 200, more.text
            assert KEY not in more.text


def test_raw_reads_are_served_and_audited(stack: Stack, raw: httpx.Client) -> None:
    since = (datetime.now(UTC) - timedelta(seconds=1)).isoformat()
    params = {"source": "evaluator", "scenario": "trip"}
    preview = raw.get("records", params=params | {"redact": "none", "limit": 5})
    assert preview.status_code == 200, preview.text
    assert KEY in preview.text
    export = raw.get("export", params=params | {"redact": "email", "format": "trajectory"})
    assert export.status_code == 200, export.text
    assert KEY in export.text
    rows = len(export.text.splitlines())
    job = raw.post("exports", json={"source": "evaluator", "format": "trajectory",
                                    "redact": "none", "filters": {"scenario": "trip"}})  # fmt: skip
    assert job.status_code == 202, job.text
    entries = [e for e in audit_lines(stack, "--since", since) if e["subject"] == "rae"]
    assert [(e["route"], e["kinds"], e["rows"]) for e in entries] == [
        ("records", [], len(preview.json()["items"])),
        ("export", ["email"], rows),
        ("exports", [], None),
    ]
    for entry in entries:
        assert entry["token_id"] == stack.token_ids["raw"]
        assert entry["filters"]["scenario"] == "trip"
    # --since in the future lists nothing; a bad one is a one-line error.
    assert audit_lines(stack, "--since", "2999-01-01T00:00:00Z") == []
    bad = subprocess.run(
        [sys.executable, "-m", "rl_export.cli", "audit", "--org", "acme", "--project", "bot",
         "--since", "yesterday"],
        capture_output=True, text=True, timeout=60, check=False, env=settings_env(stack.settings),
    )  # fmt: skip
    assert bad.returncode != 0
    assert "Traceback" not in bad.stderr
    assert "--since" in bad.stderr
    # The metric counts them.
    metrics = stack.web.metrics()
    assert 'rl_export_raw_reads_total{route="records"}' in metrics
