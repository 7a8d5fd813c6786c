"""With the defaults, a quiet project's new trace waits in the sink (quiet chains wait up to
``RL_EXPORT_CORPUS_MAX_AGE_S``) but is in its Label queue and its stats within seconds: the
web service reads it from the trajectories topic (web/fresh.py)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from datetime import UTC, datetime

import pytest

from rl_export.corpora.layout import CorpusRef
from rl_export.corpora.store import open_store
from rl_export.local.broker import LocalKafka
from rl_export.local.seaweed import LocalS3
from rl_export.runtime.settings import Settings
from rl_export.web.tokens import TokenStore
from tests.integration.web.conftest import stack_settings
from tests.integration.webproc import WebProcess, wait_for
from tests.integration.workers import WorkerProcess, publish
from tests.records import trace_events

DEFAULTS = Settings.model_fields


@pytest.fixture(scope="module")
def quiet(
    kafka: LocalKafka, s3: LocalS3, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[Settings, WebProcess]]:
    settings = stack_settings(
        kafka, s3, tmp_path_factory.mktemp("quiet"),
        corpus_max_age_s=DEFAULTS["corpus_max_age_s"].default,
        compaction_min_commits=DEFAULTS["compaction_min_commits"].default,
    )  # fmt: skip
    worker = WorkerProcess(settings, "worker").start()
    try:
        web = WebProcess(settings, "web").start()
        try:
            yield settings, web
        finally:
            web.stop()
    finally:
        worker.stop()


async def label_token(settings: Settings) -> str:
    store = open_store(settings.store_url)
    try:
        _, token = await TokenStore(store).create("acme", "quiet", "ivy", ("label", "export"),
                                                  datetime.now(UTC))  # fmt: skip
    finally:
        await store.close()
    return token


async def committed(settings: Settings, corpus: str) -> list[str]:
    store = open_store(settings.store_url)
    try:
        return await store.list(CorpusRef("acme", "quiet", corpus).manifest_root())
    finally:
        await store.close()


def test_a_quiet_project_s_new_trace_is_in_its_queue_within_seconds(
    quiet: tuple[Settings, WebProcess],
) -> None:
    settings, web = quiet
    assert settings.corpus_max_age_s > 10  # the default: the corpus waits, the page does not
    token = asyncio.run(label_token(settings))
    with web.client(token, project="quiet") as api:
        assert api.get("queue").status_code == 200  # the project's corpora are followed now
        events = [dict(e, project="quiet") for e in trace_events(1, score=0.8, passed=True)]
        asyncio.run(publish(settings, events[:1]))  # the trace, not yet evaluated
        sent = time.monotonic()

        def queued() -> bool:
            items = api.get("queue", params={"limit": 10}).json()["items"]
            return any(item["trace_id"] == "tr-001" for item in items)

        wait_for("the new trace in the Label queue", queued, timeout_s=30, every_s=0.1)
        seen = time.monotonic() - sent
        stats = api.get("stats", params={"source": "traces"}).json()
        assert stats["records"] == 1
        # The sink holds the quiet chain's one line: the store has no commit of it yet.
        assert asyncio.run(committed(settings, "traces")) == []
    # Within the web's poll and a Kafka round trip; generous on a busy test machine (the
    # bench measures the 2 s p99 on a quiet one: make bench-tenants).
    assert seen < 10, seen
