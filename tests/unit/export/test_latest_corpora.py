"""The latest view against the reader's, on corpora built line by line: ids with escapes and
unicode, tombstones, revisions across the compaction and chains, gzip objects, lines cut
by small read chunks, every spill size, both ways of looking traces up in the compaction;
and corrupted objects, which must fail with a clear error."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rl_export.corpora import commits as commit_objects
from rl_export.corpora.commits import ChainError, Commit, SidecarRef, encode_lines, sidecar_key
from rl_export.corpora.compacted import Compaction
from rl_export.corpora.compaction import part_key
from rl_export.corpora.layout import SCHEMA_VERSION, Compression, CorpusRef
from rl_export.corpora.reader import CorpusReader
from rl_export.corpora.sidecar import build_sidecar, index_row, make_ref
from rl_export.corpora.store import MemoryStore
from rl_export.export.latest import LatestView
from rl_export.model.codec import dumps, loads

REF = CorpusRef("acme", "bot", "evaluator")
IDS = (
    "a",
    "b",
    "tr-001",
    "tr-002",
    'we"ird',
    "back\\slash",
    "line\u2028sep",
    "caf\u00e9",
    "\U0001f600",
    "{brace}",
    "[bracket]",
    "x" * 600,
    "tab\there",
)


def record(trace_id: str, revision: int, kind: str = "record") -> dict[str, Any]:
    """A line as the project writes it (``record``, ``tombstone``, a corpus row of another
    format, ``row``) or in another key order (``other``, which is parsed in full)."""
    if kind == "tombstone":
        return {"trace_id": trace_id, "org": "acme", "project": "bot",
                "reward_source": "evaluator", "revision": revision, "deleted": True}  # fmt: skip
    if kind == "row":
        return {"trace_id": trace_id, "revision": revision, "messages": [{"role": "user"}]}
    if kind == "other":
        return {"revision": revision, "trace_id": trace_id, "note": 'ends "deleted":true}'}
    return {
        "trace_id": trace_id, "org": "acme", "project": "bot", "reward_source": "evaluator",
        "revision": revision, "reward": 0.5, "passed": True,
        "messages": [{"role": "user", "content": f"about {trace_id} \u2028 {{x}}"}],
    }  # fmt: skip


def _line(row: dict[str, Any]) -> bytes:
    return dumps(row) + b"\n"


async def write_sidecar(
    store: MemoryStore, key: str, rows: list[dict[str, Any]], shard_sha256: str
) -> SidecarRef:
    """The sidecar of an uncompressed object of ``rows``, as the sink writes it."""
    sidecar = build_sidecar([index_row(r) for r in rows], [len(_line(r)) for r in rows],
                            shard_sha256)  # fmt: skip
    ref = make_ref(REF.relative(sidecar_key(key)), sidecar, len(rows))
    await store.put(sidecar_key(key), sidecar)
    return ref


async def write_commit(
    store: MemoryStore,
    stream: str,
    offset: int,
    rows: list[dict[str, Any]],
    gzip: bool,
    *,
    sidecars: bool = False,
) -> int:
    compression: Compression = "gzip" if gzip else "none"
    shard = encode_lines([_line(r) for r in rows], [], compression)
    topic, _, partition = stream.rpartition("-")
    key = REF.data_key(stream, offset, shard.sha256, compression)
    await store.put(key, shard.data)
    index = await write_sidecar(store, key, rows, shard.sha256) if sidecars and not gzip else None
    commit = Commit(
        topic=topic, partition=int(partition), from_offset=offset,
        last_offset=offset + len(rows) - 1, shard=REF.relative(key), records=len(rows),
        bytes=len(shard.data), sha256=shard.sha256, compression=compression,
        schema_version=SCHEMA_VERSION, min_updated_at=None, max_updated_at=None,
        writer="test", created_at="2026-01-01T00:00:00Z", index=index,
    )  # fmt: skip
    await store.put(REF.manifest_key(stream, offset), commit.to_json())
    return offset + len(rows)


async def write_compaction(
    store: MemoryStore,
    rows: list[dict[str, Any]],
    positions: dict[str, int],
    part_size: int,
    gzip: bool,
    *,
    sidecars: bool = False,
) -> None:
    compression: Compression = "gzip" if gzip else "none"
    parts = []
    for n, start in enumerate(range(0, len(rows), part_size)):
        chunk = rows[start : start + part_size]
        shard = encode_lines([_line(r) for r in chunk], [], compression)
        key = part_key(REF, 1, n, shard.sha256, compression)
        await store.put(key, shard.data)
        parts.append({"shard": REF.relative(key), "records": len(chunk),
                      "bytes": len(shard.data), "sha256": shard.sha256,
                      "compression": compression})  # fmt: skip
        if sidecars and not gzip:
            index = await write_sidecar(store, key, chunk, shard.sha256)
            parts[-1]["index"] = index.model_dump(mode="json")
    compaction = Compaction(
        generation=1, positions=positions, parts=parts, records=len(rows),
        schema_version=SCHEMA_VERSION, created_at="2026-01-01T00:00:00Z", writer="test",
    )  # fmt: skip
    await store.put(REF.compaction_key(1), dumps(compaction.model_dump(mode="json")))


Story = tuple[list[dict[str, Any]] | None, dict[str, list[list[dict[str, Any]]]]]


async def build(store: MemoryStore, story: Story, *, gzip: bool, part_size: int = 3,
                sidecars: bool = False) -> None:  # fmt: skip
    """A compaction (sorted by trace_id, the ids given once) and chains of commits after it;
    each chain's first commit is covered by the compaction (so never read). With
    ``sidecars`` every uncompressed object has its index sidecar."""
    compacted, chains = story
    positions = {}
    for stream, commits in chains.items():
        offset = await write_commit(store, stream, 0, [record("covered", 99)], gzip,
                                    sidecars=sidecars)  # fmt: skip
        positions[stream] = offset
        for rows in commits:
            offset = await write_commit(store, stream, offset, rows, gzip, sidecars=sidecars)
    if compacted is not None:
        rows = sorted(compacted, key=lambda r: r["trace_id"])
        await write_compaction(store, rows, positions, part_size, gzip, sidecars=sidecars)


async def reader_latest(store: MemoryStore) -> list[dict[str, Any]]:
    return [r async for r in CorpusReader(store, REF).records(latest_only=True)]


async def view_rows(view: LatestView) -> list[dict[str, Any]]:
    await view.open()
    rows = [loads(line) async for batch in view.lines() for line in batch]
    assert view.total == len(rows)
    return rows


def by_id(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return sorted(rows, key=lambda r: r["trace_id"])


lines_ = st.tuples(
    st.sampled_from(IDS),
    st.integers(1, 4),
    st.sampled_from(["record", "record", "record", "tombstone", "row", "other"]),
).map(lambda t: record(*t))
compactions = st.one_of(
    st.none(),
    st.lists(
        st.tuples(st.sampled_from(IDS), st.integers(1, 4),
                  st.sampled_from(["record", "record", "row", "other", "tombstone"])),
        unique_by=lambda t: t[0], max_size=len(IDS),
    ).map(lambda ts: [record(*t) for t in ts]),
)  # fmt: skip
stories = st.tuples(
    compactions,
    st.dictionaries(
        st.sampled_from(["t-0", "t-1", "t-2"]),
        st.lists(st.lists(lines_, min_size=1, max_size=5), max_size=4),
        max_size=3,
    ),
)


@settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    story=stories,
    gzip=st.booleans(),
    spill_at=st.sampled_from([1, 2, 3, 5, 200_000]),
    lookup_share=st.sampled_from([1, 10**9]),
    chunk=st.sampled_from([7, 64, 300, commit_objects.READ_CHUNK]),
    sidecars=st.booleans(),
)
def test_the_view_is_the_readers_latest_view(  # noqa: PLR0917 - hypothesis gives them
    story: Story, gzip: bool, spill_at: int, lookup_share: int, chunk: int, sidecars: bool
) -> None:
    async def run() -> None:
        store = MemoryStore()
        await build(store, story, gzip=gzip, sidecars=sidecars)
        if story[0] is None and not story[1]:
            return  # no corpus at all
        expected = await reader_latest(store)
        view = LatestView(store, REF, spill_at=spill_at, lookup_share=lookup_share)
        rows = await view_rows(view)
        assert by_id(rows) == by_id(expected)
        assert len({r["trace_id"] for r in rows}) == len(rows)
        assert view.sidecars_refused == 0
        if sidecars and not gzip:  # every object it read was read through its sidecar
            assert view.sidecars_read == len(view.tail) + len(view.compaction_parts)
        else:
            assert view.sidecars_read == 0

    saved = commit_objects.READ_CHUNK
    commit_objects.READ_CHUNK = chunk  # blocks of a few lines, lines cut across reads
    try:
        asyncio.run(run())
    finally:
        commit_objects.READ_CHUNK = saved


async def test_binary_search_and_a_scan_agree_on_a_large_compaction() -> None:
    """Many compaction lines per block, a few tail traces in them: looked up one by one
    (binary search) or every line's key read; both give the reader's view."""
    compacted = [record(f"tr-{n:05d}", 2) for n in range(0, 3000)]
    tail = [record(f"tr-{n:05d}", r) for n, r in ((17, 3), (18, 1), (1500, 2), (2999, 9))]
    tail += [record("tr-00600", 2, "tombstone"), record("tr-99999", 1), record("tr-00000", 5)]
    store = MemoryStore()
    await build(store, (compacted, {"t-0": [tail[:3], tail[3:]]}), gzip=False, part_size=1000)
    expected = by_id(await reader_latest(store))
    assert len(expected) == 3000
    searched = LatestView(store, REF, spill_at=2)
    assert by_id(await view_rows(searched)) == expected
    assert searched.looked_up > 0
    assert searched.scanned_blocks == 0
    scanned = LatestView(store, REF, lookup_share=10**9)
    assert by_id(await view_rows(scanned)) == expected
    assert scanned.scanned_blocks > 0
    ids = {r["trace_id"]: r["revision"] for r in expected}
    assert ids["tr-00017"] == 3  # the tail's later revision
    assert ids["tr-00018"] == 2  # the compaction's, newer than the tail's
    assert "tr-00600" not in ids  # deleted after the compaction


async def test_runs_that_interleave_and_repeat_traces_merge_to_one_line_each() -> None:
    rows = [record(f"id-{(n * 7919) % 500:03d}", 1 + n % 3) for n in range(1500)]
    rows += [record("id-007", 1, "tombstone"), record("id-008", 9, "tombstone")]
    store = MemoryStore()
    await build(store, (None, {"t-0": [rows[i : i + 100] for i in range(0, len(rows), 100)]}),
                gzip=True)  # fmt: skip
    expected = by_id(await reader_latest(store))
    for spill_at in (1, 7, 64, 499, 200_000):
        view = LatestView(store, REF, spill_at=spill_at)
        assert by_id(await view_rows(view)) == expected, spill_at
        assert (view.runs > 0) == (spill_at < 500)


async def corrupt(store: MemoryStore, prefix: str, old: bytes, new: bytes) -> None:
    key = next(k for k in sorted(store.objects) if k.startswith(f"{REF.root}/{prefix}"))
    assert old in store.objects[key]
    store.objects[key] = store.objects[key].replace(old, new, 1)


@pytest.mark.parametrize("where", ["data/", "_compacted/"])
async def test_a_corrupted_object_fails_the_view_naming_it(where: str) -> None:
    store = MemoryStore()
    compacted = [record(f"c-{n}", 1) for n in range(5)]
    await build(store, (compacted, {"t-0": [[record("t", 1), record("u", 2)]]}), gzip=False)
    prefix = f"_compacted/{1:020d}/part-" if where == "_compacted/" else f"data/t-0/{1:020d}"
    await corrupt(store, prefix, b'"reward":0.5', b'"reward":0.6')
    with pytest.raises(ChainError, match=f"{REF.root}/{where}.*sha256"):
        await LatestView(store, REF).open()


async def test_a_compaction_out_of_order_fails_the_view() -> None:
    store = MemoryStore()
    await build(store, ([], {"t-0": [[record("t", 1)]]}), gzip=False)
    rows = [record("b", 1), record("a", 1)]  # not sorted
    await write_compaction(store, rows, {"t-0": 1}, 5, False)
    layout_chunk = commit_objects.READ_CHUNK
    try:
        commit_objects.READ_CHUNK = 10  # one line a block: checked where blocks meet
        with pytest.raises(ChainError, match="not sorted by trace_id"):
            await LatestView(store, REF).open()
    finally:
        commit_objects.READ_CHUNK = layout_chunk
    with pytest.raises(ChainError, match="not sorted by trace_id"):  # one block: its edges
        await LatestView(store, REF).open()
    # Inside a block the order is checked where every key is read (a tail trace in range).
    await write_compaction(store, [record("a", 1), record("c", 1), record("b", 1),
                                   record("d", 1)], {"t-0": 1}, 5, False)  # fmt: skip
    await write_commit(store, "t-0", 1, [record("b", 2)], False)
    with pytest.raises(ChainError, match="not sorted by trace_id"):
        await LatestView(store, REF, lookup_share=10**9).open()


async def test_an_object_with_more_lines_than_its_commit_says_fails() -> None:
    store = MemoryStore()
    await build(store, (None, {"t-0": [[record("t", 1, "tombstone"), record("u", 2)]]}),
                gzip=False)  # fmt: skip
    key = next(k for k in sorted(store.objects) if "/_manifest/t-0/" in k and k.endswith(
        f"{1:020d}.json"))  # fmt: skip
    commit = loads(store.objects[key])
    commit["records"] = 1
    store.objects[key] = dumps(commit)
    with pytest.raises(ChainError, match="record"):
        await LatestView(store, REF).open()


async def test_a_line_that_is_not_a_record_fails_naming_the_object() -> None:
    store = MemoryStore()
    await build(store, (None, {"t-0": [[record("t", 1)]]}), gzip=False)
    shard = encode_lines([b"[1, 2]\n"], [], "none")
    key = REF.data_key("t-0", 2, shard.sha256, "none")
    await store.put(key, shard.data)
    commit = Commit(
        topic="t", partition=0, from_offset=2, last_offset=2, shard=REF.relative(key),
        records=1, bytes=len(shard.data), sha256=shard.sha256, compression="none",
        schema_version=SCHEMA_VERSION, min_updated_at=None, max_updated_at=None,
        writer="test", created_at="2026-01-01T00:00:00Z",
    )  # fmt: skip
    await store.put(REF.manifest_key("t-0", 2), dumps(commit.model_dump(mode="json")))
    with pytest.raises(ChainError, match=f"{key}: not a JSON object"):
        await LatestView(store, REF).open()
