"""A corpus added to a running deployment gets its history, exactly once, while the stream goes
on: real workers, the real broker, the real store."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from rl_export.corpora.layout import CorpusRef
from rl_export.corpora.reader import CorpusReader
from rl_export.corpora.store import open_store
from rl_export.formats.specs import DEFAULT_CORPORA, CorpusSpec
from rl_export.runtime.settings import Settings
from tests.integration.corpora.test_sink import (
    ORG,
    PROJECT,
    assert_verified,
    wait_for_corpora,
    workload,
)
from tests.integration.workers import WorkerProcess, expected_final, publish

ADDED = (
    CorpusSpec(name="sft", source="evaluator", format="messages", filter={"passed": True}),
    CorpusSpec(name="kto", source="human", format="kto"),
)


def expected(events: list[dict[str, Any]], spec: CorpusSpec) -> dict[str, dict[str, Any]]:
    out = {}
    for trace_id, snap in expected_final(events).items():
        if snap["org"] != ORG or snap["project"] != PROJECT:
            continue
        row = spec.record_for(snap)
        if row is not None and not row.get("deleted"):
            out[trace_id] = row
    return out


async def view(settings: Settings, name: str) -> dict[str, dict[str, Any]]:
    store = open_store(settings.store_url)
    try:
        reader = CorpusReader(store, CorpusRef(ORG, PROJECT, name))
        return {r["trace_id"]: r async for r in reader.records(latest_only=True)}
    finally:
        await store.close()


async def wait_for_views(
    settings: Settings, want: dict[str, dict[str, dict[str, Any]]], timeout_s: float = 60
) -> dict[str, dict[str, dict[str, Any]]]:
    """Poll the named corpora's latest views until they are ``want`` (or the time is up)."""
    got: dict[str, dict[str, dict[str, Any]]] = {}
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        got = {name: await view(settings, name) for name in want}
        if got == want:
            break
        await asyncio.sleep(1.0)
    return got


async def test_a_corpus_added_later_has_its_history(settings: Settings) -> None:
    settings = settings.model_copy(update={"shard_max_age_s": 1.0})
    events = workload(120, seed=31)
    half = len(events) // 2
    before, after = events[:half], events[half:]
    await publish(settings, before)
    with WorkerProcess(settings, "w1").start():
        await wait_for_corpora(settings, before)

    grown = settings.model_copy(update={"corpora": (*DEFAULT_CORPORA, *ADDED)})
    with WorkerProcess(grown, "w2").start() as worker:
        await publish(grown, after)  # the stream goes on while the new corpora are seeded
        await wait_for_corpora(grown, events)
        want = {spec.name: expected(events, spec) for spec in ADDED}
        got = await wait_for_views(grown, want)
        seeded = worker.metric("rl_export_sink_backfilled_records_total", corpus="sft")
    assert got == want
    assert want["sft"]
    assert want["kto"]
    # History really came from the seed: traces passed before the corpus existed are there.
    assert seeded > 0
    assert set(expected(before, ADDED[0])) & set(got["sft"])
    await assert_verified(grown)  # no gap, no overlap, no (trace_id, revision) twice


async def test_a_corpus_added_on_an_idle_stream_is_seeded_when_its_partitions_are_assigned(
    settings: Settings,
) -> None:
    # Issue 33: the chain writer used to seed only when an event of the project reached the
    # partition; a corpus added on a quiet weekend stayed empty.
    settings = settings.model_copy(update={"shard_max_age_s": 1.0})
    events = workload(80, seed=37)
    await publish(settings, events)
    with WorkerProcess(settings, "w1").start():
        await wait_for_corpora(settings, events)

    grown = settings.model_copy(update={"corpora": (*DEFAULT_CORPORA, *ADDED)})
    want = {spec.name: expected(events, spec) for spec in ADDED}
    assert want["sft"]
    assert want["kto"]
    with WorkerProcess(grown, "w2").start() as worker:  # and not one event more
        got = await wait_for_views(grown, want, timeout_s=45)
        seeded = worker.metric("rl_export_sink_backfilled_records_total", corpus="kto")
    assert got == want
    assert seeded >= len(want["kto"])  # and the tombstones of deleted traces
    await assert_verified(grown)
