"""Fresh lines (web/fresh.py): the trajectories topic's snapshots, as the lines the corpora
will hold, reach the index before the sink commits them."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry

from rl_export.corpora.commits import follow_chain, read_shard
from rl_export.corpora.layout import CorpusRef
from rl_export.corpora.store import LocalStore, MemoryStore
from rl_export.formats.specs import DEFAULT_CORPORA
from rl_export.index.follower import Indexer
from rl_export.index.queryindex import CorpusKey, QueryIndex
from rl_export.model.codec import dumps_line, loads
from rl_export.model.snapshots import encode_snapshot
from rl_export.runtime.metrics import WebMetrics
from rl_export.web.fresh import FreshLines
from tests.unit.corpora.test_sink import ORG, PROJECT, STREAM, Trace, make_sink
from tests.unit.index.test_follower import passes_beyond

KINDS = ["completed", "evaluated", "failed", "labelled", "retracted", "skipped", "deleted"]
ACTIONS = st.lists(
    st.tuples(st.sampled_from(["tr-a", "tr-b", "tr-c"]), st.sampled_from(KINDS)),
    min_size=1,
    max_size=14,
)


def snapshots(actions: list[tuple[str, str]]) -> list[dict[str, Any]]:
    """The join's snapshots for a story of actions (a trace's first action completes it)."""
    traces: dict[str, Trace] = {}
    out = []
    for trace_id, action in actions:
        trace = traces.get(trace_id)
        if trace is None:
            trace = traces[trace_id] = Trace(trace_id)
            out.append(trace.completed())
        if action == "deleted" and trace.state is not None and trace.state.deleted:
            continue
        out.append({"completed": trace.completed, "evaluated": trace.evaluated,
                    "failed": lambda t=trace: t.evaluated(passed=False),
                    "labelled": trace.labelled, "retracted": trace.retracted,
                    "skipped": trace.skipped, "deleted": trace.deleted}[action]())  # fmt: skip
    return out


@settings(max_examples=40, deadline=None)
@given(actions=ACTIONS)
def test_fresh_lines_are_the_lines_the_sink_commits(actions: list[tuple[str, str]]) -> None:
    """The same snapshots to the sink and to the fresh lines: every record line the sink
    commits is a fresh line, byte for byte, and back; the fresh lines' tombstones are the
    sink's deletions (a trace that stops matching leaves with the sink's tombstone)."""
    offered: dict[CorpusKey, list[bytes]] = {}
    fresh = FreshLines(DEFAULT_CORPORA, lambda k, line: bool(offered.setdefault(k, []).append(
        line) or True), keep_s=60)  # fmt: skip

    async def run() -> dict[str, list[bytes]]:
        store = MemoryStore()
        sink, _ = make_sink(store)
        for offset, snapshot in enumerate(snapshots(actions)):
            value, _headers = encode_snapshot(snapshot)
            fresh.note(value)
            await sink.handle(offset, value, None)
        await sink.flush()
        committed: dict[str, list[bytes]] = {}
        for spec in DEFAULT_CORPORA:
            ref = CorpusRef(ORG, PROJECT, spec.name)
            for commit in await follow_chain(store, ref, STREAM, 0):
                committed.setdefault(spec.name, []).extend(
                    dumps_line(r) for r in await read_shard(store, ref, commit)
                )
        return committed

    committed = asyncio.run(run())
    for spec in DEFAULT_CORPORA:
        lines = offered.get(CorpusKey(ORG, PROJECT, spec.name), [])
        records = [line for line in lines if not loads(line).get("deleted")]
        sink_lines = committed.get(spec.name, [])
        assert records == [line for line in sink_lines if not loads(line).get("deleted")]
        gone = {loads(line)["trace_id"] for line in lines if loads(line).get("deleted")}
        sink_gone = {loads(line)["trace_id"] for line in sink_lines if loads(line).get("deleted")}
        assert gone <= sink_gone
        assert fresh.recent(CorpusKey(ORG, PROJECT, spec.name)) == b"".join(lines)


def test_the_buffer_keeps_the_newest_lines_within_its_bounds() -> None:
    now = [0.0]
    fresh = FreshLines(DEFAULT_CORPORA, lambda k, line: False, keep_s=10, buffer_bytes=40_000,
                       clock=lambda: now[0])  # fmt: skip
    key = CorpusKey(ORG, PROJECT, "traces")
    for n in range(40):
        now[0] = n
        fresh.note(encode_snapshot(Trace(f"tr-{n:03d}").completed())[0])
    kept = [loads(line)["trace_id"] for line in fresh.recent(key).splitlines()]
    assert kept == [f"tr-{n:03d}" for n in range(29, 40)]  # the last 10 s (and 40 kB)
    fresh.note(b"not a snapshot")
    fresh.note(None)
    assert fresh.seen == 40


async def test_an_offered_line_is_in_the_index_after_the_next_pass(tmp_path: Path) -> None:
    """A new trace reaches the index from the topic within a pass; when the corpus commits
    the same line, the index still holds one row for it."""
    store = LocalStore(tmp_path / "store")
    sink, _ = make_sink(store)  # type: ignore[arg-type]
    old = Trace("tr-old").completed()
    await sink.handle(0, encode_snapshot(old)[0], None)
    await sink.flush()
    index = QueryIndex(tmp_path / "index", writers=1)
    indexer = Indexer(index, LocalStore(tmp_path / "store"), WebMetrics(CollectorRegistry()),
                      poll_interval_s=0.05)  # fmt: skip
    fresh = FreshLines(DEFAULT_CORPORA, indexer.offer, keep_s=60)
    indexer.recent = fresh.recent
    early = Trace("tr-early").completed()  # before the corpus is followed: from the buffer
    fresh.note(encode_snapshot(early)[0])
    indexer.start()
    try:
        followed = await indexer.ready(CorpusKey(ORG, PROJECT, "traces"), 30)
        await passes_beyond(followed, 0)
        await passes_beyond(followed, followed.passes)
        assert followed.live == 2  # tr-old from the corpus, tr-early from the buffer

        new = Trace("tr-new").completed()
        fresh.note(encode_snapshot(new)[0])
        passes = followed.passes
        await passes_beyond(followed, passes + 1)
        assert followed.live == 3

        await sink.handle(1, encode_snapshot(early)[0], None)  # the sink commits them now
        await sink.handle(2, encode_snapshot(new)[0], None)
        await sink.flush()
        await passes_beyond(followed, followed.passes + 1)
        assert followed.live == 3
        assert followed.error is None
    finally:
        indexer.stop()
        index.close()


async def test_once_the_corpus_is_read_offered_lines_go_in_at_once(tmp_path: Path) -> None:
    """After a pass over the chains, an offered line is ingested within a batch, not at the
    next pass (the index polls every 30 s here)."""
    from rl_export.formats.filters import Filters

    store = LocalStore(tmp_path / "store")
    sink, _ = make_sink(store)  # type: ignore[arg-type]
    await sink.handle(0, encode_snapshot(Trace("tr-old").completed())[0], None)
    await sink.flush()
    index = QueryIndex(tmp_path / "index", writers=1)
    indexer = Indexer(index, LocalStore(tmp_path / "store"), WebMetrics(CollectorRegistry()),
                      poll_interval_s=30)  # fmt: skip
    fresh = FreshLines(DEFAULT_CORPORA, indexer.offer, keep_s=60)
    indexer.start()
    try:
        followed = await indexer.ready(CorpusKey(ORG, PROJECT, "traces"), 30)
        await passes_beyond(followed, 0)
        assert followed.corpus_id is not None
        passes = followed.passes
        fresh.note(encode_snapshot(Trace("tr-new").completed())[0])
        deadline = asyncio.get_running_loop().time() + 5
        while index.stats(followed.corpus_id, Filters()).records < 2:
            assert asyncio.get_running_loop().time() < deadline, "not ingested within 5 s"
            await asyncio.sleep(0.05)
        assert followed.passes == passes  # no pass was needed
    finally:
        indexer.stop()
        index.close()


async def test_a_direct_export_reads_the_fresh_lines_as_a_chain_of_its_own() -> None:
    """The latest view through a FreshStore: the corpus's records, the fresh lines' new
    traces and re-scores, a fresh deletion applied, and a line the corpus also holds once."""
    from rl_export.export.latest import LatestView
    from rl_export.web.fresh import FreshStore

    store = MemoryStore()
    sink, _ = make_sink(store)
    old, same, gone = Trace("tr-old"), Trace("tr-same"), Trace("tr-gone")
    committed = [old.completed(), same.completed(), gone.completed()]
    for offset, snapshot in enumerate(committed):
        await sink.handle(offset, encode_snapshot(snapshot)[0], None)
    await sink.flush()
    offered: dict[CorpusKey, list[bytes]] = {}
    fresh = FreshLines(DEFAULT_CORPORA, lambda k, line: bool(offered.setdefault(k, []).append(
        line) or True), keep_s=60)  # fmt: skip
    for snapshot in (committed[1], old.evaluated(), Trace("tr-new").completed(), gone.deleted()):
        fresh.note(encode_snapshot(snapshot)[0])
    ref = CorpusRef(ORG, PROJECT, "traces")
    lines = fresh.recent(CorpusKey(ORG, PROJECT, "traces"))

    view = await LatestView(FreshStore(store, ref, lines), ref).open()
    rows = {r["trace_id"]: r["revision"] for batch in [b async for b in view.lines()]
            for r in map(loads, batch)}  # fmt: skip
    assert rows == {"tr-old": 2, "tr-same": 1, "tr-new": 1}
    assert await store.list(f"{ref.root}/_manifest/fresh-0/") == []  # nothing written
