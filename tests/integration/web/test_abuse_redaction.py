"""Abuse: secrets planted wherever free text can sit (DESIGN.md sections 4 and 10; issue 53) come
out of no output path with the default redaction: a metadata key after ``agent_version``, a
``thinking`` part, ``reasoning_content``, ``refusal``, an ``image_url`` with ``user:password@``,
attachment URIs with ``sig=`` and ``user:pw@``, unknown extra fields, tool arguments. Paths: the
command line's export, ``GET export``, the preview (``GET records``), an export job, queue and
claim items of a label token, and ``rl_export.hf``; the structural fields stay as they were."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from datetime import UTC, datetime
from typing import Any

import httpx
import pytest

from rl_export.corpora.store import open_store
from rl_export.hf import corpus_dataset
from rl_export.web.tokens import TokenStore
from tests.factories import event
from tests.harness.workers import settings_env
from tests.integration.web.conftest import Stack
from tests.integration.webproc import wait_for
from tests.integration.workers import publish

pytestmark = pytest.mark.integration

PROJECT = "abuse-redact"
TRACE = f"{PROJECT}-tr-1"
# One synthetic credential per place, so that a leak says where it came from.
PLANTED = {
    "metadata after agent_version": "sk-proj-" + "Qm7vXr2LpT9sWz4NbK8dHf3Gj6YcUe1A" * 2,
    "thinking part": "ghp_" + "Vb4Nx8Lq2Wr6Tz0Mk3Hs7Jd9Fp1Gc5Ya8UeQ",
    "reasoning_content": "glpat-" + "Hq3Zr8Lm2Xw6Ts9Kd4Fb",
    "refusal": "xoxb-" + "482910573920-5839201947382-" + "Qa8Wz3Ls9Xk2Mp7Tn4Vb6Hd",
    "image_url password": "Tr0ub4dorPw9xQ",
    "attachment SAS signature": "Yk3Nq8Zr2Lw6Tx9Mb4Hd7Jf1Gs5Vc0Pa8Ue3Ri6Qo%3D",
    "attachment URI password": "S3cretPw0rd9xZ",
    "unknown extra field": "sk-ant-api03-" + "Lq8Zr3Nx2Wm6Ts9Kd4Fb7Hj1Gp5Yc0Ue" * 3 + "AA",
    "tool arguments": "Zk29fj3KdQ8vLp2m!x",
}


def planted_events() -> list[dict[str, Any]]:
    p = PLANTED
    image = f"https://bob:{p['image_url password']}@img.example.com/a.png"
    messages = [
        {"role": "system", "content": "You are a careful agent."},
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "What is in this picture?"},
                {"type": "image_url", "image_url": {"url": image}},
            ],
        },
        {
            "role": "assistant",
            "content": [{"type": "thinking", "thinking": f"I could use {p['thinking part']} here",
                         "signature": "c2lnbmF0dXJl"}],
            "reasoning_content": f"The deploy token is {p['reasoning_content']} apparently",
            "tool_calls": [{"id": "call_1", "type": "function", "function": {
                "name": "login", "arguments": json.dumps({"user": "ops",
                                                          "password": p["tool arguments"]})}}],
            "x_debug": {"note": f"anthropic {p['unknown extra field']}"},
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "logged in"},
        {"role": "assistant", "content": None,
         "refusal": f"I will not post {p['refusal']} to the channel."},
    ]  # fmt: skip
    attachments = [
        {"name": "log.txt", "content_type": "text/plain", "size": 3,
         "uri": "https://acct.blob.core.windows.net/c/log.txt?sv=2024-11-04&se=2026-02-01"
                f"&sr=b&sp=r&sig={p['attachment SAS signature']}"},
        {"name": "dump.txt", "content_type": "text/plain", "size": 3,
         "uri": f"sftp://deploy:{p['attachment URI password']}@files.example.com/dump.txt"},
    ]  # fmt: skip
    metadata = {"deploy": "prod", "agent_version": "v3",
                "OPENAI_API_KEY": p["metadata after agent_version"]}  # fmt: skip
    base = {"org": "acme", "project": PROJECT, "trace_id": TRACE}
    return [
        event("trace.completed", f"{TRACE}-c", "2026-01-01T00:00:00Z", **base,
              agent_version="v3", scenario="password_reset", messages=messages,
              attachments=attachments, metadata=metadata),
        event("evaluation.finished", f"{TRACE}-e", "2026-01-01T00:00:01Z", **base),
    ]  # fmt: skip


def leaks(text: str) -> list[str]:
    """Where the planted credentials a response shows came from."""
    return [place for place, value in PLANTED.items() if value in text]


@pytest.fixture(scope="module")
def tokens(stack: Stack) -> dict[str, str]:
    async def made() -> dict[str, str]:
        store = open_store(stack.settings.store_url)
        out: dict[str, str] = {}
        try:
            for subject, scopes in (("lead", ("admin",)), ("exporter", ("export",)),
                                    ("labeler", ("label",))):  # fmt: skip
                _, out[subject] = await TokenStore(store).create(
                    "acme", PROJECT, f"redact-{subject}", scopes, datetime.now(UTC)
                )
        finally:
            await store.close()
        return out

    asyncio.run(publish(stack.settings, planted_events()))
    found = asyncio.run(made())
    with stack.web.client(found["lead"], project=PROJECT) as lead:
        wait_for("the planted trace in the index", lambda: lead.get(
            "stats", params={"source": "evaluator"}).json().get("records") == 1, 120)  # fmt: skip
    return found


def check(text: str, *, structural: bool = True) -> None:
    assert leaks(text) == [], leaks(text)
    assert "[REDACTED:SECRETS]" in text
    if structural:  # the trace id, the version and the scenario stay as they were
        assert TRACE in text
        assert "password_reset" in text


def test_the_command_line_export(stack: Stack, tokens: dict[str, str]) -> None:
    for source, fmt in (("evaluator", "trajectory"), ("traces", "trajectory"),
                        ("evaluator", "messages"), ("evaluator", "csv")):  # fmt: skip
        result = subprocess.run(
            [sys.executable, "-m", "rl_export.cli", "export", "--store", stack.settings.store_url,
             "--org", "acme", "--project", PROJECT, "--source", source, "--format", fmt,
             "-o", "-"],
            capture_output=True, text=True, timeout=120, check=False,
            env=settings_env(stack.settings),
        )  # fmt: skip
        assert result.returncode == 0, result.stderr
        check(result.stdout, structural=fmt != "messages")
        assert "secrets" in result.stderr  # the summary counts them


def test_get_export_and_the_preview(stack: Stack, tokens: dict[str, str]) -> None:
    with stack.web.client(tokens["exporter"], project=PROJECT) as api:
        for fmt in ("trajectory", "messages", "executions", "json"):
            response = api.get("export", params={"source": "evaluator", "format": fmt})
            assert response.status_code == 200, response.text
            check(response.text, structural=fmt not in ("messages",))
            counted = json.loads(response.headers["x-rl-export-redactions"])["secrets"]
            assert counted >= (len(PLANTED) if fmt == "trajectory" else 1), (fmt, counted)
        for fmt in ("trajectory", "prompt_completion"):
            preview = api.get("records", params={"source": "evaluator", "format": fmt})
            assert preview.status_code == 200, preview.text
            check(preview.text, structural=fmt == "trajectory")


def test_an_export_job(stack: Stack, tokens: dict[str, str]) -> None:
    with stack.web.client(tokens["exporter"], project=PROJECT) as api:
        job = api.post("exports", json={"source": "evaluator", "format": "trajectory"})
        assert job.status_code == 202, job.text

        def finished() -> dict[str, Any] | None:
            status: dict[str, Any] = api.get(f"exports/{job.json()['id']}").json()
            return status if status["status"] != "processing" else None

        done = wait_for("the job", finished, 120)
        assert done["status"] == "ready", done
        download = httpx.get(str(api.base_url.join(done["download"])), headers=api.headers)
        assert download.status_code == 200
        check(download.text)


def test_queue_and_claim_items(stack: Stack, tokens: dict[str, str]) -> None:
    with stack.web.client(tokens["labeler"], project=PROJECT) as labeler:
        queue = labeler.get("queue")
        assert queue.status_code == 200, queue.text
        claim = labeler.post("queue/claim", json={"limit": 1})
        assert claim.status_code == 200, claim.text
    for answer in (queue, claim):
        assert [i["trace_id"] for i in answer.json()["items"]] == [TRACE]
        check(answer.text)


def test_rl_export_hf(stack: Stack, tokens: dict[str, str]) -> None:
    for fmt in ("trajectory", "messages", "rl_prompts"):
        rows = list(corpus_dataset(stack.settings.store_url, "acme", PROJECT, "evaluator",
                                   format=fmt, redact="secrets"))  # fmt: skip
        assert len(rows) == 1
        check(json.dumps(rows), structural=fmt == "trajectory")
