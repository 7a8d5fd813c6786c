"""Abuse: deletion wins wherever the trace came from (DESIGN.md sections 3 and 5). Traces of
a project of their own are backfilled with ``rl-export replay`` (the worker's join never saw
them) and a version is pinned; then one is deleted through Kafka and another by a second
replay whose file holds only its deletion. Both are gone from every read: ``rl-export
export`` (and the export and stats code it runs, for every corpus), the API's export and
stats, the Hugging Face dataset, the pinned version of each, and after ``shards compact``
(its tombstones past their retention); and replaying the original file again brings neither
back."""

from __future__ import annotations

import asyncio
import io
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest

from rl_export.corpora.layout import CorpusRef
from rl_export.corpora.store import open_store
from rl_export.export import stats, write_export
from rl_export.export.versions import pinned
from rl_export.hf import corpus_dataset
from tests.factories import event
from tests.harness.workers import settings_env
from tests.integration.web.conftest import Stack
from tests.integration.web.test_team import RUBRIC, make_tokens, project_events
from tests.integration.webproc import wait_for
from tests.integration.workers import publish

pytestmark = pytest.mark.integration

PROJECT = "abuse-erase"
SOURCES = ("traces", "evaluator", "human")
STREAMED, REPLAYED, KEPT = (f"{PROJECT}-tr-{n:03d}" for n in range(3))


def cli(stack: Stack, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(
        [sys.executable, "-m", "rl_export.cli", *args], capture_output=True, text=True,
        timeout=180, check=False, env=settings_env(stack.settings, **env),
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    return result


def replay(stack: Stack, folder: Path, run: str, events: list[dict[str, Any]]) -> str:
    path = folder / f"{run}.jsonl"
    path.write_bytes(b"".join(orjson.dumps(e) + b"\n" for e in events))
    return cli(stack, "replay", str(path), "--store", stack.settings.store_url,
               "--run-id", run).stdout  # fmt: skip


def deletion(trace_id: str) -> dict[str, Any]:
    return event("trace.deleted", f"{trace_id}-gone", "2026-01-02T00:00:00Z", org="acme",
                 project=PROJECT, trace_id=trace_id)  # fmt: skip


def exported(stack: Stack, source: str, *extra: str) -> set[str]:
    """The trace ids of ``rl-export export`` of a source (the store, read directly)."""
    out = cli(stack, "export", "--store", stack.settings.store_url, "--org", "acme",
              "--project", PROJECT, "--source", source, "--format", "trajectory",
              "--redact", "none", *extra, "-o", "-").stdout  # fmt: skip
    return {json.loads(line)["trace_id"] for line in out.splitlines()}


async def library_reads(stack: Stack, source: str) -> dict[str, Any]:
    """What the export and stats functions (the commands' own code, in this process: a
    command costs seconds to start) read of a source, at the latest and at version v1."""
    store = open_store(stack.settings.store_url)
    ref = CorpusRef("acme", PROJECT, source)
    seen: dict[str, Any] = {}
    try:
        at = (await pinned(store, ref, "v1", None)).at
        for name, position in (("", None), (" --version v1", at)):
            out = io.BytesIO()
            await write_export(store, ref, format="trajectory", out=out, redact="none",
                               at=position)  # fmt: skip
            seen[f"export {source}{name}"] = {
                json.loads(line)["trace_id"] for line in out.getvalue().splitlines()
            }
            seen[f"stats {source}{name}"] = (await stats(store, ref, at=position))["records"]
    finally:
        await store.close()
    return seen


def everywhere(stack: Stack, api: httpx.Client) -> dict[str, Any]:
    """What every read shows of the project: trace ids (or counts) per source and read."""
    seen: dict[str, Any] = {
        "cli export evaluator": exported(stack, "evaluator"),
        "cli export evaluator --version v1": exported(stack, "evaluator", "--version", "v1"),
    }
    for source in SOURCES:
        seen |= asyncio.run(library_reads(stack, source))
        for version in (None, "v1"):
            params = {"source": source, "format": "trajectory"}
            if version is not None:
                params["version"] = version
            answer = api.get("export", params=params)
            assert answer.status_code == 200, answer.text
            rows = {json.loads(line)["trace_id"] for line in answer.text.splitlines()}
            seen[f"GET export {source} version={version}"] = rows
        seen[f"GET stats {source}"] = api.get("stats", params={"source": source}).json()["records"]
        rows = list(corpus_dataset(stack.settings.store_url, "acme", PROJECT, source))
        seen[f"hf {source}"] = {r["trace_id"] for r in rows}
        pinned_rows = corpus_dataset(stack.settings.store_url, "acme", PROJECT, source,
                                     version="v1")  # fmt: skip
        seen[f"hf {source} version=v1"] = {r["trace_id"] for r in pinned_rows}
    return seen


def only(kept: set[str], seen: dict[str, Any]) -> dict[str, Any]:
    """The reads that show anything but ``kept`` (counts: anything but its size)."""
    return {
        read: value
        for read, value in seen.items()
        if value != (len(kept) if isinstance(value, int) else kept)
    }


@pytest.mark.timeout(600)  # four rounds of every read, and eight commands
def test_a_deleted_trace_is_gone_from_every_read_wherever_it_came_from(
    stack: Stack, tmp_path: Path
) -> None:
    backfill = project_events(PROJECT, 3, labels=(RUBRIC,))
    replay(stack, tmp_path, "erase-backfill", backfill)
    tokens = asyncio.run(make_tokens(stack, PROJECT, ["lead"]))
    everything = {STREAMED, REPLAYED, KEPT}
    for source in SOURCES:
        cli(stack, "versions", "create", "v1", "--store", stack.settings.store_url, "--org",
            "acme", "--project", PROJECT, "--corpus", source)  # fmt: skip
    with stack.web.client(tokens["lead"], project=PROJECT) as api:
        wait_for("the backfill in the index", lambda: all(
            api.get("stats", params={"source": s}).json().get("records") == 3
            for s in SOURCES), 120)  # fmt: skip
        assert only(everything, everywhere(stack, api)) == {}  # every read sees all three

        # One deleted through Kafka (the worker's join has no state for it), one by a second
        # replay whose file holds nothing but its deletion.
        asyncio.run(publish(stack.settings, [deletion(STREAMED)]))
        replay(stack, tmp_path, "erase-second", [deletion(REPLAYED)])
        wait_for("both deletions in the index", lambda: all(
            api.get("stats", params={"source": s}).json().get("records") == 1
            for s in SOURCES), 120)  # fmt: skip
        assert only({KEPT}, everywhere(stack, api)) == {}

        # Compacted, the tombstones past their retention: gone still, and the log stays.
        cli(stack, "shards", "compact", "--store", stack.settings.store_url, "--prefix",
            f"acme/{PROJECT}/", RL_EXPORT_TOMBSTONE_RETENTION_S="0.001")  # fmt: skip
        assert only({KEPT}, everywhere(stack, api)) == {}

        # The original backfill again: neither comes back, and nothing is written for them.
        again = replay(stack, tmp_path, "erase-rebackfill", backfill)
        written = [line for line in again.splitlines() if line.startswith("  corpus ")]
        assert all(line.endswith(": 0 records") for line in written), again
        assert only({KEPT}, everywhere(stack, api)) == {}
    cli(stack, "shards", "verify", "--store", stack.settings.store_url, "--prefix",
        f"acme/{PROJECT}/")  # fmt: skip
