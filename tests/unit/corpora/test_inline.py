"""Commits that hold their lines (``inline``): one object per commit, and every reader of the
corpora reads the same records as from commits that name a data object."""

from __future__ import annotations

import asyncio
from typing import Any

from hypothesis import given, settings

from rl_export.corpora.commits import follow_chain, read_shard
from rl_export.corpora.compacted import read_compaction
from rl_export.corpora.compaction import compact, expire
from rl_export.corpora.layout import CorpusRef
from rl_export.corpora.reader import CorpusReader
from rl_export.corpora.store import MemoryStore
from rl_export.corpora.verify import verify
from rl_export.export.latest import LatestView
from rl_export.formats.specs import DEFAULT_CORPORA
from rl_export.model.codec import loads
from rl_export.model.snapshots import encode_snapshot
from tests.unit.corpora.test_sink import ORG, PROJECT, STREAM, make_sink
from tests.unit.web.test_fresh import ACTIONS, snapshots

INLINE = 64 * 1024


async def build(actions: list[tuple[str, str]], inline: int, flush_every: int = 3) -> MemoryStore:
    store = MemoryStore()
    sink, _ = make_sink(store, inline_max_bytes=inline)
    for offset, snapshot in enumerate(snapshots(actions)):
        await sink.handle(offset, encode_snapshot(snapshot)[0], None)
        if offset % flush_every == flush_every - 1:
            await sink.flush()
    await sink.flush()
    return store


async def views(store: MemoryStore) -> dict[str, Any]:
    """What every reader makes of the corpora: the reader (every line), the latest view, a
    compaction's records, and shards verify."""
    out: dict[str, Any] = {}
    for spec in DEFAULT_CORPORA:
        ref = CorpusRef(ORG, PROJECT, spec.name)
        out[f"{spec.name} lines"] = [r async for r in CorpusReader(store, ref).records()]
        view = LatestView(store, ref)
        if await view.exists():
            await view.open()
            out[f"{spec.name} latest"] = [loads(line) async for batch in view.lines()
                                          for line in batch]  # fmt: skip
        made = await compact(store, ref, writer="t")
        out[f"{spec.name} compacted"] = (
            None if made is None else list(await read_compaction(store, ref, made))
        )
    report = await verify(store)
    out["verify"] = (report.ok, report.problems)
    return out


@settings(max_examples=30, deadline=None)
@given(actions=ACTIONS)
def test_readers_read_the_same_corpora_whether_commits_hold_their_lines(
    actions: list[tuple[str, str]],
) -> None:
    async def run() -> None:
        named, held = await build(actions, 0), await build(actions, INLINE)
        assert await views(held) == await views(named)
        assert (await views(held))["verify"] == (True, [])
        data = [k for k in held.objects if "/data/" in k]
        assert data == []  # every commit held its lines: no data object was written
        commits = [k for k in held.objects if "/_manifest/" in k]
        assert len(commits) == len([k for k in named.objects if "/_manifest/" in k])

    asyncio.run(run())


async def test_a_commit_over_the_bound_names_a_data_object_and_expiry_keeps_its_order() -> None:
    actions = [(f"tr-{n}", "evaluated") for n in range(6)]
    store = await build(actions, inline=600, flush_every=1)  # one trace's lines fit, not two
    traces = CorpusRef(ORG, PROJECT, "traces")
    commits = await follow_chain(store, traces, STREAM, 0)
    assert {c.inline is None for c in commits} == {True, False}  # both kinds in one chain
    for commit in commits:
        assert len(await read_shard(store, traces, commit)) == commit.records
        if commit.inline is not None:
            assert commit.shard == traces.relative(traces.manifest_key(STREAM, commit.from_offset))
    before = (await views(store))["traces latest"]
    # A newer generation, then expiry with no retention: the covered commits go, each data
    # object before its commit; a commit holding its lines has nothing before it.
    sink, _ = make_sink(store, inline_max_bytes=600)
    await sink.handle(100, encode_snapshot(snapshots([("tr-9", "completed")])[0])[0], None)
    await sink.flush()
    await compact(store, traces, writer="t")
    deleted = await expire(store, traces, keep_generations=1, retention_s=0, now=2e9)
    named = [c for c in commits if c.inline is None]
    held = [c for c in commits if c.inline is not None]
    for commit in named:
        key = traces.manifest_key(STREAM, commit.from_offset)
        assert deleted.index(traces.key(commit.shard)) < deleted.index(key)
    assert {traces.manifest_key(STREAM, c.from_offset) for c in held} <= set(deleted)
    assert (await verify(store)).ok
    after = (await views(store))["traces latest"]
    assert [r["trace_id"] for r in after] == [r["trace_id"] for r in before] + ["tr-9"]
