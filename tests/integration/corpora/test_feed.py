"""The change feed with a real worker: every chain commit in the store is announced on the
commits topic, keyed by its corpus, at least once."""

from __future__ import annotations

import json
from typing import Any

from rl_export.corpora.commits import follow_chain
from rl_export.corpora.layout import list_corpora
from rl_export.corpora.store import open_store
from rl_export.runtime.settings import Settings
from tests.integration.corpora.test_sink import wait_for_corpora, workload
from tests.integration.workers import TopicReader, WorkerProcess, publish


async def committed(settings: Settings) -> set[tuple[str, str, int]]:
    """(corpus key, chain, offset after it) of every commit in the store."""
    store = open_store(settings.store_url)
    found = set()
    try:
        for ref in await list_corpora(store):
            for chain in await store.folders(ref.manifest_root()):
                for commit in await follow_chain(store, ref, chain, 0):
                    found.add((ref.root, chain, commit.last_offset + 1))
    finally:
        await store.close()
    return found


def announced(records: list[Any]) -> set[tuple[str, str, int]]:
    """(key, chain, offset after it) of every chain commit's message."""
    out = set()
    for record in records:
        message = json.loads(record.value)
        if message["kind"] == "commit":
            ((chain, end),) = message["position"]["chains"].items()
            out.add((record.key.decode(), chain, end))
    return out


async def test_every_commit_is_announced_on_the_commits_topic(settings: Settings) -> None:
    events = workload(40, seed=5)
    await publish(settings, events)
    with WorkerProcess(settings, "w1").start():
        await wait_for_corpora(settings, events)
        in_store = await committed(settings)
        reader = TopicReader(settings, settings.topic_commits)
        records = await reader.read_until(lambda got: in_store <= announced(got), 60)
    assert in_store
    assert in_store <= announced(records)
    for record in records:
        message = json.loads(record.value)
        assert record.key.decode() == f"{message['org']}/{message['project']}/{message['corpus']}"
        assert message["records"] >= message["new_records"] >= 0
        assert message["delta_version"] is None or message["kind"] == "compaction"
