"""Raw access (DESIGN.md section 10) against the running service: a read that redacts less
than the project's default needs the ``raw`` scope, which ``admin`` does not imply, on the
preview, the direct export and jobs; with it the read is served and audited, and
``rl-export audit`` lists the entry. Jobs belong to their subject: another subject, and an
admin for a raw job, are told there is no such job; a raw job's download needs ``raw``
again and is audited with the job's id."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import pytest

from rl_export.corpora.store import open_store
from rl_export.web.tokens import TokenStore
from tests.harness.workers import settings_env
from tests.integration.web.conftest import Stack
from tests.integration.webproc import wait_for

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
    assert [(e["route"], e["kinds"], e["rows"], e["job"]) for e in entries] == [
        ("records", [], len(preview.json()["items"]), None),
        ("export", ["email"], rows, None),
        ("exports", [], None, job.json()["id"]),  # a job's entry names it
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


def finished(api: httpx.Client, job_id: str) -> dict[str, Any]:
    def done() -> dict[str, Any] | None:
        status: dict[str, Any] = api.get(f"exports/{job_id}").json()
        return status if status["status"] != "processing" else None

    found: dict[str, Any] = wait_for("the job to finish", done, every_s=0.1)
    assert found["status"] == "ready", found
    return found


def export_only_token(stack: Stack, subject: str) -> str:
    """A token of ``subject`` with the export scope only (the same person, less access)."""

    async def create() -> str:
        store = open_store(stack.settings.store_url)
        try:
            _, token = await TokenStore(store).create(
                "acme", "bot", subject, ("export",), datetime.now(UTC)
            )
        finally:
            await store.close()
        return token

    return asyncio.run(create())


def test_a_raw_job_is_its_subjects_alone_and_each_download_is_audited(
    stack: Stack, raw: httpx.Client
) -> None:
    since = (datetime.now(UTC) - timedelta(seconds=1)).isoformat()
    body = {"source": "evaluator", "format": "trajectory", "redact": "none",
            "filters": {"scenario": "trip"}}  # fmt: skip
    started = raw.post("exports", json=body)
    assert started.status_code == 202, started.text
    job_id = started.json()["id"]
    done = finished(raw, job_id)
    # Another subject, and an admin (a raw job is not theirs to see), get 404 everywhere.
    for name in ("export", "admin"):
        with client(stack, name) as other:
            for path in (f"exports/{job_id}", f"exports/{job_id}/download"):
                answer = other.get(path)
                assert answer.status_code == 404, (name, path, answer.text)
                assert KEY not in answer.text
            listed = other.get("exports")
            assert listed.status_code == 200, listed.text
            assert job_id not in listed.text
    # The same subject with a token without raw: the status, but not the file.
    with stack.web.client(export_only_token(stack, "rae")) as rae_plain:
        assert rae_plain.get(f"exports/{job_id}").status_code == 200
        refused = rae_plain.get(f"exports/{job_id}/download")
        assert refused.status_code == 403, refused.text
        assert refused.json()["error"] == "raw_required"
        assert KEY not in refused.text
    # Its subject with raw downloads it, twice: each download is audited with the job's id.
    for _ in range(2):
        got = raw.get(f"exports/{job_id}/download")
        assert got.status_code == 200, got.text
        assert KEY in got.text
    assert job_id in [item["id"] for item in raw.get("exports").json()["items"]]
    assert (done["subject"], done["raw"]) == ("rae", True)
    entries = [e for e in audit_lines(stack, "--since", since) if e["job"] == job_id]
    assert [(e["route"], e["subject"], e["rows"]) for e in entries] == [
        ("exports", "rae", None),
        ("exports/download", "rae", done["records"]),
        ("exports/download", "rae", done["records"]),
    ]


def test_a_job_is_seen_by_its_subject_and_admins_not_by_other_subjects(stack: Stack) -> None:
    with client(stack, "export") as cy:
        started = cy.post("exports", json={"source": "evaluator", "format": "trajectory"})
        assert started.status_code == 202, started.text
        job_id = started.json()["id"]
        done = finished(cy, job_id)
        mine = cy.get(f"exports/{job_id}/download")
        assert mine.status_code == 200, mine.text
    with client(stack, "labeler") as dee:  # another subject with the export scope
        for path in (f"exports/{job_id}", f"exports/{job_id}/download"):
            assert dee.get(path).status_code == 404, path
        assert job_id not in [item["id"] for item in dee.get("exports").json()["items"]]
    with client(stack, "export") as cy:
        assert (done["subject"], done["raw"]) == ("cy", False)
        assert job_id in [item["id"] for item in cy.get("exports").json()["items"]]
    with client(stack, "admin") as ana:  # an admin of the project sees every job not raw
        assert ana.get(f"exports/{job_id}").json()["subject"] == "cy"
        theirs = ana.get(f"exports/{job_id}/download")
        assert theirs.status_code == 200, theirs.text
        assert theirs.content == mine.content
        listed = ana.get("exports").json()["items"]
        assert job_id in [item["id"] for item in listed]
        assert all(not item["raw"] or item["subject"] == "ana" for item in listed)
    with stack.web.client(stack.tokens["other"], project="other") as elsewhere:
        assert elsewhere.get(f"exports/{job_id}").status_code == 404  # another project's
