"""Attachments through the running service (DESIGN.md section 10): a trace of a project of its
own plants URIs at the host's files, the services' own ports, the metadata address and the
store's own prefix (another org's shard); a zip export through the API fetches none of them
(nothing is allowed by default) and its manifest names no path or host."""

from __future__ import annotations

import asyncio
import io
import json
import zipfile
from datetime import UTC, datetime

import httpx

from rl_export.corpora.store import open_store
from rl_export.web.tokens import TokenStore
from tests.integration.web.conftest import Stack
from tests.integration.webproc import wait_for
from tests.integration.workers import publish
from tests.records import trace_events

PROJECT = "attach"


def planted(stack: Stack) -> list[dict[str, object]]:
    port = stack.web.base.rsplit(":", 1)[1]
    store = stack.settings.store_url.rstrip("/")
    uris = {
        "environ": "file:///proc/self/environ",
        "metrics": f"http://127.0.0.1:{port}/metrics",
        "loopback-https": f"https://127.0.0.1:{port}/metrics",
        "by-name": f"https://localhost:{port}/metrics",
        "ipv6-loopback": f"https://[::1]:{port}/metrics",
        "metadata": "https://169.254.169.254/latest/meta-data/iam/security-credentials/",
        "private": "https://10.0.0.1/x",
        "mapped": "https://[::ffff:127.0.0.1]/x",
        "other-org-shard": f"{store}/acme/bot/evaluator/data/trajectories-0/x.jsonl",
        "tokens": f"{store}/_tokens/0123456789ab.json",
    }
    return [{"name": name, "uri": uri, "content_type": "text/plain", "size": 1}
            for name, uri in uris.items()]  # fmt: skip


async def project_token(stack: Stack) -> str:
    store = open_store(stack.settings.store_url)
    try:
        _, token = await TokenStore(store).create("acme", PROJECT, "zed", ("export",),
                                                  datetime.now(UTC))  # fmt: skip
    finally:
        await store.close()
    return token


def test_a_zip_export_fetches_no_planted_attachment(stack: Stack) -> None:
    events = trace_events(1, score=0.9, passed=True, attachments=planted(stack))
    for event in events:
        event.update(project=PROJECT, trace_id="att-001")
    asyncio.run(publish(stack.settings, events))
    token = asyncio.run(project_token(stack))
    params = {"source": "evaluator", "format": "zip"}
    with stack.web.client(token, project=PROJECT) as api:
        # The export reads the corpora, not the index (so the index's per-corpus metrics,
        # which other tests count, never see this project): asked until the sink committed.
        def exported() -> list[httpx.Response]:
            answer = api.get("export", params=params)
            return [answer] if answer.status_code != 404 else []

        (response,) = wait_for("the planted trace's export", exported, timeout_s=120)
        assert response.status_code == 200, response.text
    with zipfile.ZipFile(io.BytesIO(response.content)) as archive:
        names = archive.namelist()
        manifest = json.loads(archive.read("files/manifest.json"))
    assert [n for n in names if n.startswith("files/")] == ["files/manifest.json"]
    assert "files/errors.json" not in names
    assert {m["name"]: m["status"] for m in manifest} == {
        a["name"]: "not_allowed" for a in planted(stack)
    }
    text = json.dumps(manifest)
    for detail in ("127.0.0.1", "169.254", "proc", "_tokens", "localhost"):
        assert detail not in text
    assert json.loads(response.headers["x-rl-export-redactions"]) == {"secrets": 0}
