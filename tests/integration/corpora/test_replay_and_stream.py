"""Replay after the stream, and the stream after a replay, into the same corpora.

``replay`` writes chains of its own (``replay-<run id>-<p>``) beside the stream's. Writers
load what the corpus holds from every chain of their partition and from the latest
compaction (its holdings index and tombstones), so neither writes a ``(trace_id, revision)``
the other wrote, ``shards verify`` passes, and a deleted trace stays deleted.
"""

from __future__ import annotations

from typing import Any

import orjson

from rl_export.corpora.commits import read_chain
from rl_export.corpora.compaction import compact_all
from rl_export.corpora.layout import list_corpora
from rl_export.corpora.replay import ReplayReport, replay
from rl_export.corpora.store import open_store
from rl_export.corpora.verify import verify
from rl_export.runtime.settings import Settings
from tests.factories import event
from tests.harness.reads import wait_caught_up
from tests.integration.corpora.test_sink import merged_view, wait_for_corpora, workload
from tests.integration.workers import WorkerProcess, expected_corpora, publish


async def replay_events(settings: Settings, events: list[dict[str, Any]], run: str) -> ReplayReport:
    store = open_store(settings.store_url)
    try:
        lines = [(f"{run}.jsonl:{n}", orjson.dumps(e)) for n, e in enumerate(events, 1)]
        return await replay(settings, store, lines, run_id=run)
    finally:
        await store.close()


async def check(settings: Settings, events: list[dict[str, Any]]) -> None:
    store = open_store(settings.store_url)
    try:
        report = await verify(store)
        view = await merged_view(store)
    finally:
        await store.close()
    assert report.ok, report.problems
    assert view == expected_corpora(events)


def doomed() -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """A trace's first events, and its deletion."""
    base = {"trace_id": "tr-doomed", "org": "acme", "project": "support-bot"}
    before = [
        event("trace.completed", "d-1", "2026-01-01T00:00:00Z", **base),
        event("label.submitted", "d-2", "2026-01-01T00:00:01Z", **base, labeler="ana"),
    ]
    return before, event("trace.deleted", "d-3", "2026-01-01T00:00:09Z", **base)


async def test_a_replay_over_events_already_streamed_writes_no_repeat(settings: Settings) -> None:
    local = settings.model_copy(update={"shard_max_age_s": 0.5})
    before, deletion = doomed()
    events = [*workload(60, seed=91), *before, deletion]
    with WorkerProcess(local, "w1").start():
        await publish(local, events)
        await wait_for_corpora(local, events)
    store = open_store(local.store_url)
    try:  # the deletion is now only in the compaction's tombstones, not in its parts
        assert await compact_all(store, writer="t", partitioning=("murmur2", local.partitions))
    finally:
        await store.close()

    await replay_events(local, events, "backfill-1")
    # Every record was there already. Only a tombstone may be new: its revision depends on
    # the order the events came in (events after a deletion count, but emit nothing).
    assert [r for r in await written_by(local, "backfill-1") if not r.get("deleted")] == []
    older = await replay_events(local, before, "older-export-1")  # without the deletion
    assert sum(older.records.values()) == 0  # the deletion hides them
    await check(local, events)


async def written_by(settings: Settings, run: str) -> list[dict[str, Any]]:
    """Every record a replay's chains hold, in every corpus."""
    store = open_store(settings.store_url)
    rows: list[dict[str, Any]] = []
    try:
        for ref in await list_corpora(store):
            for chain in await store.folders(ref.manifest_root()):
                if chain.startswith(f"replay-{run}-"):
                    rows += [r for _, shard in await read_chain(store, ref, chain, 0)
                             for r in shard]  # fmt: skip
    finally:
        await store.close()
    return rows


async def test_the_stream_over_events_already_replayed_writes_no_repeat(
    settings: Settings,
) -> None:
    local = settings.model_copy(update={"shard_max_age_s": 0.5})
    before, deletion = doomed()
    events = [*workload(60, seed=92), *before, deletion]
    first = await replay_events(local, events, "backfill-1")
    assert sum(first.records.values()) > 0
    await check(local, events)
    with WorkerProcess(local, "w1").start():
        await publish(local, events)
        for group, topics in ((local.app_id, local.input_topics),
                              (local.sink_group, [local.topic_trajectories])):  # fmt: skip
            left = await wait_caught_up(local.kafka_bootstrap, group, topics, timeout_s=120)
            assert left == 0, f"{group}: {left} records left"
    await check(local, events)
