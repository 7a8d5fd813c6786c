"""The corpus reader (DESIGN.md section 5): chains in order, cursors, latest revisions,
compactions, following new commits, and refusing shards that do not match their commits.

Corpora are built in the store exactly as the sink and compaction write them: the data
object first, then the commit (or ``_compaction.json``) naming it.
"""

from __future__ import annotations

import asyncio
import hashlib
from pathlib import Path
from typing import Any

import pytest

from rl_export.corpora.commits import ChainError, Commit, encode_shard
from rl_export.corpora.compacted import Compaction
from rl_export.corpora.layout import SCHEMA_VERSION, Compression, CorpusRef
from rl_export.corpora.reader import CorpusReader, dump_cursor, end_cursor, load_cursor
from rl_export.corpora.store import LocalStore, MemoryStore, ObjectStore
from rl_export.model.codec import dumps, loads

REF = CorpusRef("acme", "bot", "human")
TOPIC = "trajectories"
S0, S1 = f"{TOPIC}-0", f"{TOPIC}-1"


def record(trace_id: str, revision: int, **fields: Any) -> dict[str, Any]:
    return {
        "trace_id": trace_id,
        "org": "acme",
        "project": "bot",
        "reward_source": "human",
        "revision": revision,
        "reward": 0.6,
        "updated_at": f"2026-01-01T00:00:{revision:02d}Z",
        **fields,
    }


def tombstone(trace_id: str, revision: int) -> dict[str, Any]:
    return {
        "trace_id": trace_id,
        "org": "acme",
        "project": "bot",
        "reward_source": "human",
        "revision": revision,
        "deleted": True,
    }


async def commit_shard(  # noqa: PLR0917 - the argument order mirrors the commit's fields
    store: ObjectStore,
    ref: CorpusRef,
    topic: str,
    partition: int,
    from_offset: int,
    last_offset: int,
    records: list[dict[str, Any]],
    compression: Compression = "none",
    overrides: dict[str, Any] | None = None,
) -> Commit:
    """Write a shard then its commit, as the sink does; ``overrides`` bend the commit."""
    stream = ref.stream(topic, partition)
    shard = encode_shard(records, compression)
    data_key = ref.data_key(stream, from_offset, shard.sha256, compression)
    await store.put(data_key, shard.data)
    fields: dict[str, Any] = {
        "topic": topic,
        "partition": partition,
        "from_offset": from_offset,
        "last_offset": last_offset,
        "shard": ref.relative(data_key),
        "records": shard.records,
        "bytes": len(shard.data),
        "sha256": shard.sha256,
        "compression": compression,
        "schema_version": SCHEMA_VERSION,
        "min_updated_at": shard.min_updated_at,
        "max_updated_at": shard.max_updated_at,
        "writer": "test",
        "created_at": "2026-01-01T00:00:00Z",
    }
    fields.update(overrides or {})
    await store.put_if_absent(ref.manifest_key(stream, from_offset), dumps(fields))
    return Commit.model_validate(fields)


async def write_compaction(
    store: ObjectStore,
    ref: CorpusRef,
    generation: int,
    positions: dict[str, int],
    records: list[dict[str, Any]],
    *,
    compression: Compression = "none",
) -> Compaction:
    """Write one part then ``_compaction.json``, as compaction does."""
    return await write_parts(store, ref, generation, positions, [records], compression=compression)


async def write_parts(
    store: ObjectStore,
    ref: CorpusRef,
    generation: int,
    positions: dict[str, int],
    parts: list[list[dict[str, Any]]],
    *,
    compression: Compression = "none",
    drop: str | None = None,
) -> Compaction:
    """Write each part then ``_compaction.json``; ``drop`` leaves that field out of a part."""
    entries = []
    for number, records in enumerate(parts):
        shard = encode_shard(records, compression)
        suffix = ".jsonl.gz" if compression == "gzip" else ".jsonl"
        key = (f"{ref.compacted_prefix()}{generation:020d}/"
               f"part-{number:05d}-{shard.sha256[:16]}{suffix}")  # fmt: skip
        await store.put(key, shard.data)
        entry = {
            "shard": ref.relative(key),
            "records": shard.records,
            "bytes": len(shard.data),
            "sha256": shard.sha256,
            "compression": compression,
        }
        entries.append({k: v for k, v in entry.items() if k != drop})
    compaction = Compaction(
        generation=generation,
        positions=positions,
        parts=entries,
        records=sum(len(records) for records in parts),
        schema_version=SCHEMA_VERSION,
        created_at="2026-01-01T00:00:00Z",
        writer="test",
    )
    await store.put_if_absent(
        ref.compaction_key(generation), dumps(compaction.model_dump(mode="json"))
    )
    return compaction


async def collect(reader: CorpusReader, cursor: dict[str, int] | None = None,
                  **kwargs: Any) -> list[dict[str, Any]]:  # fmt: skip
    return [row async for row in reader.records(cursor, **kwargs)]


def ids(rows: list[dict[str, Any]]) -> list[tuple[str, int]]:
    return [(row["trace_id"], row["revision"]) for row in rows]


async def two_partitions(store: ObjectStore) -> list[tuple[str, int]]:
    """Partitions 2 and 10 (numeric order differs from text order); returns the read order."""
    await commit_shard(store, REF, TOPIC, 10, 0, 3, [record("k", 1), record("l", 1)])
    await commit_shard(store, REF, TOPIC, 2, 0, 4, [record("a", 1), record("b", 1)])
    await commit_shard(store, REF, TOPIC, 2, 5, 9, [record("c", 1)], "gzip")
    await commit_shard(store, REF, TOPIC, 2, 10, 12, [])  # an empty shard still moves on
    await commit_shard(store, REF, TOPIC, 10, 4, 6, [record("m", 1), record("k", 2)])
    return [("a", 1), ("b", 1), ("c", 1), ("k", 1), ("l", 1), ("m", 1), ("k", 2)]


@pytest.fixture(params=["memory", "local"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> ObjectStore:
    if request.param == "memory":
        return MemoryStore()
    return LocalStore(tmp_path / "store")


# --- reading --------------------------------------------------------------------------------


async def test_reads_each_chain_in_order_and_ends_at_their_heads(store: ObjectStore) -> None:
    expected = await two_partitions(store)
    reader = CorpusReader(store, REF)
    assert ids(await collect(reader)) == expected
    assert reader.cursor == {f"{TOPIC}-2": 13, f"{TOPIC}-10": 7}
    # Nothing new: reading again from the cursor yields nothing and keeps it.
    assert await collect(reader, reader.cursor) == []
    assert reader.cursor == {f"{TOPIC}-2": 13, f"{TOPIC}-10": 7}


async def test_records_come_back_exactly_as_written() -> None:
    store = MemoryStore()
    rows = [record("a", 1, text="line\u2028break é"), tombstone("b", 2)]
    await commit_shard(store, REF, TOPIC, 0, 0, 1, rows, "gzip")
    assert await collect(CorpusReader(store, REF)) == rows


async def test_a_saved_cursor_resumes_with_no_repeat_and_no_gap(store: ObjectStore) -> None:
    expected = await two_partitions(store)
    # Stop after every possible number of records, including mid-shard.
    for taken in range(len(expected) + 1):
        reader = CorpusReader(store, REF)
        first: list[tuple[str, int]] = []
        if taken:
            async for row in reader.records():
                first.append((row["trace_id"], row["revision"]))
                if len(first) == taken:
                    break
        saved = dump_cursor(reader.cursor)
        rest = ids(await collect(CorpusReader(store, REF), load_cursor(saved)))
        assert first + rest == expected, (taken, saved)


async def test_a_cursor_at_a_shard_boundary_is_just_the_stream_offsets() -> None:
    store = MemoryStore()
    await commit_shard(store, REF, TOPIC, 0, 0, 4, [record("a", 1), record("b", 1)])
    await commit_shard(store, REF, TOPIC, 0, 5, 9, [record("c", 1)])
    reader = CorpusReader(store, REF)
    cursors = [reader.cursor async for _ in reader.records()]
    assert cursors == [{S0: 0, f"{S0}/skip": 1}, {S0: 5}, {S0: 10}]


async def test_latest_only_keeps_the_latest_revision_and_honours_tombstones() -> None:
    store = MemoryStore()
    await commit_shard(store, REF, TOPIC, 0, 0, 9, [
        record("re-revised", 1), record("deleted", 1), record("back", 1), record("kept", 1),
        record("re-revised", 3),
    ])  # fmt: skip
    await commit_shard(store, REF, TOPIC, 0, 10, 19, [
        tombstone("deleted", 2), tombstone("back", 2), tombstone("only-tombstone", 5),
    ])  # fmt: skip
    await commit_shard(store, REF, TOPIC, 1, 0, 9, [
        record("re-revised", 2),  # read later but older: hidden by revision 3
        record("back", 4),  # matches again after its tombstone
        record("deleted", 1),  # a replayed old revision stays hidden by the tombstone
    ])  # fmt: skip
    reader = CorpusReader(store, REF)
    latest = ids(await collect(reader, latest_only=True))
    assert sorted(latest) == [("back", 4), ("kept", 1), ("re-revised", 3)]
    assert reader.cursor == {S0: 20, S1: 10}
    # Without latest_only every record, tombstones included, comes out.
    assert len(await collect(CorpusReader(store, REF))) == 11


async def test_latest_only_on_equal_revisions_the_tombstone_wins() -> None:
    store = MemoryStore()
    await commit_shard(store, REF, TOPIC, 0, 0, 0, [tombstone("t", 2)])
    await commit_shard(store, REF, TOPIC, 1, 0, 0, [record("t", 2)])
    assert await collect(CorpusReader(store, REF), latest_only=True) == []


async def test_starts_from_the_latest_compaction_then_follows_its_positions() -> None:
    store = MemoryStore()
    # History the compaction covers (must not be read again) ...
    await commit_shard(store, REF, TOPIC, 0, 0, 4, [record("a", 1), record("b", 1)])
    await commit_shard(store, REF, TOPIC, 0, 5, 9, [record("a", 2)])
    await write_compaction(store, REF, 1, {S0: 5}, [record("old-generation", 1)])
    await write_compaction(store, REF, 2, {S0: 10}, [record("a", 2), record("b", 1)])
    # ... then commits after its positions, and a chain it does not know at all.
    await commit_shard(store, REF, TOPIC, 0, 10, 14, [record("b", 2)])
    await commit_shard(store, REF, TOPIC, 1, 0, 3, [record("z", 1)])
    reader = CorpusReader(store, REF)
    assert ids(await collect(reader)) == [("a", 2), ("b", 1), ("b", 2), ("z", 1)]
    assert reader.cursor == {S0: 15, S1: 4}
    latest = ids(await collect(CorpusReader(store, REF), latest_only=True))
    assert sorted(latest) == [("a", 2), ("b", 2), ("z", 1)]
    # An explicit empty cursor means every chain from offset 0, no compaction.
    assert ids(await collect(CorpusReader(store, REF), {})) == [
        ("a", 1), ("b", 1), ("a", 2), ("b", 2), ("z", 1),
    ]  # fmt: skip


async def test_a_cursor_saved_inside_a_compaction_resumes_exactly() -> None:
    store = MemoryStore()
    rows = [record("a", 1), record("b", 1)]
    await write_compaction(store, REF, 3, {S0: 5}, rows, compression="gzip")
    await commit_shard(store, REF, TOPIC, 0, 5, 9, [record("c", 1)])
    reader = CorpusReader(store, REF)
    async for _ in reader.records():
        break
    saved = load_cursor(dump_cursor(reader.cursor))
    assert S0 not in saved  # the compaction's positions are not reached yet
    assert ids(await collect(CorpusReader(store, REF), saved)) == [("b", 1), ("c", 1)]


async def test_end_cursor_skips_everything_already_committed() -> None:
    store = MemoryStore()
    await two_partitions(store)
    cursor = await end_cursor(store, REF)
    assert cursor == {f"{TOPIC}-2": 13, f"{TOPIC}-10": 7}
    await commit_shard(store, REF, TOPIC, 2, 13, 13, [record("new", 1)])
    assert ids(await collect(CorpusReader(store, REF), cursor)) == [("new", 1)]


# --- following ------------------------------------------------------------------------------


async def test_follow_sees_a_commit_added_while_following() -> None:
    store = MemoryStore()
    await commit_shard(store, REF, TOPIC, 0, 0, 4, [record("a", 1)])
    reader = CorpusReader(store, REF, poll_interval_s=0.01)
    stop = asyncio.Event()
    seen: list[tuple[str, int]] = []
    got_new = asyncio.Event()
    started = asyncio.Event()

    async def writer() -> None:
        await started.wait()
        await asyncio.sleep(0.05)  # several polls find nothing new first
        await commit_shard(store, REF, TOPIC, 1, 0, 2, [record("b", 1)])
        await commit_shard(store, REF, TOPIC, 0, 5, 9, [record("a", 2)])
        await got_new.wait()  # seen by polling, before stop is set
        stop.set()

    async with asyncio.timeout(10):
        task = asyncio.create_task(writer())
        async for row in reader.follow(stop=stop):
            seen.append((row["trace_id"], row["revision"]))
            started.set()
            if len(seen) == 3:
                got_new.set()
        await task
    assert seen == [("a", 1), ("a", 2), ("b", 1)]
    assert reader.cursor == {S0: 10, S1: 3}


async def test_follow_yields_what_was_committed_before_stop_was_set() -> None:
    store = MemoryStore()
    reader = CorpusReader(store, REF, poll_interval_s=60)
    stop = asyncio.Event()

    async def writer() -> None:
        await asyncio.sleep(0.02)  # the reader is waiting out its (long) poll interval
        await commit_shard(store, REF, TOPIC, 0, 0, 0, [record("late", 1)])
        stop.set()

    async with asyncio.timeout(10):
        task = asyncio.create_task(writer())
        rows = [row async for row in reader.follow({}, stop=stop)]
        await task
    assert ids(rows) == [("late", 1)]


# --- refusing what does not match -----------------------------------------------------------


async def test_a_checksum_mismatch_raises_before_any_record_of_that_shard() -> None:
    store = MemoryStore()
    await commit_shard(store, REF, TOPIC, 0, 0, 4, [record("good", 1)])
    bad = await commit_shard(store, REF, TOPIC, 0, 5, 9, [record("x", 1), record("y", 1)])
    key = REF.key(bad.shard)
    store.objects[key] = store.objects[key].replace(b'"x"', b'"X"')
    reader = CorpusReader(store, REF)
    seen: list[str] = []

    async def consume() -> None:
        async for row in reader.records():
            seen.append(row["trace_id"])

    with pytest.raises(ChainError, match="sha256"):
        await consume()
    assert seen == ["good"]
    assert reader.cursor == {S0: 5}


async def test_a_wrong_record_count_raises() -> None:
    store = MemoryStore()
    await commit_shard(store, REF, TOPIC, 0, 0, 4, [record("a", 1)], overrides={"records": 2})
    with pytest.raises(ChainError, match="1 records, its commit says 2"):
        await collect(CorpusReader(store, REF))


async def test_a_missing_shard_raises() -> None:
    store = MemoryStore()
    commit = await commit_shard(store, REF, TOPIC, 0, 0, 4, [record("a", 1)])
    await store.delete(REF.key(commit.shard))
    with pytest.raises(ChainError, match="missing"):
        await collect(CorpusReader(store, REF))


async def test_a_gap_raises_instead_of_skipping_records() -> None:
    store = MemoryStore()
    await commit_shard(store, REF, TOPIC, 0, 0, 4, [record("a", 1)])
    await commit_shard(store, REF, TOPIC, 0, 8, 9, [record("b", 1)])
    with pytest.raises(ChainError, match="no commit at offset 5"):
        await collect(CorpusReader(store, REF))


async def test_a_commit_ending_before_it_starts_raises_instead_of_looping() -> None:
    store = MemoryStore()
    await commit_shard(store, REF, TOPIC, 0, 0, 4, [record("a", 1)])
    await commit_shard(store, REF, TOPIC, 0, 5, 5, [record("b", 1)])
    key = REF.manifest_key(S0, 5)  # a commit no sink would write: it ends before it starts
    store.objects[key] = store.objects[key].replace(b'"last_offset":5', b'"last_offset":4')
    with pytest.raises(ChainError, match="last_offset 4 < from_offset 5"):
        async with asyncio.timeout(5):
            await collect(CorpusReader(store, REF))


async def test_a_corrupt_compaction_part_raises() -> None:
    store = MemoryStore()
    compaction = await write_compaction(store, REF, 1, {S0: 0}, [record("a", 1)])
    key = REF.key(compaction.parts[0]["shard"])
    store.objects[key] = store.objects[key].replace(b'"a"', b'"b"')
    with pytest.raises(ChainError, match="sha256"):
        await collect(CorpusReader(store, REF))


# --- cursors --------------------------------------------------------------------------------


def test_cursor_round_trips_as_sorted_json() -> None:
    cursor = {S1: 3, S0: 10, f"{S0}/skip": 2}
    text = dump_cursor(cursor)
    assert text == '{"trajectories-0":10,"trajectories-0/skip":2,"trajectories-1":3}'
    assert load_cursor(text) == cursor
    assert load_cursor(text.encode()) == cursor


@pytest.mark.parametrize(
    "text",
    ["[]", '{"s-0": -1}', '{"s-0": "3"}', '{"s-0": true}', '{"s-0": 1.5}', '{"s-0/skip": 1}'],
)
def test_load_cursor_rejects_what_is_not_a_cursor(text: str) -> None:
    with pytest.raises(ValueError, match="cursor"):
        load_cursor(text)


async def test_records_rejects_a_bad_cursor() -> None:
    with pytest.raises(ValueError, match="offset"):
        await collect(CorpusReader(MemoryStore(), REF), {S0: -3})


# --- whole objects, lines unparsed (the web service's index) --------------------------------


async def objects_until_caught_up(
    reader: CorpusReader, cursor: dict[str, int] | None = None
) -> tuple[list[tuple[str, list[tuple[str, int]]]], list[dict[str, int]]]:
    """One pass of follow_objects: (key, identities) per object and the cursor after each."""
    stop = asyncio.Event()
    got: list[tuple[str, list[tuple[str, int]]]] = []
    cursors: list[dict[str, int]] = []
    async with asyncio.timeout(10):
        async for item in reader.follow_objects(cursor, stop=stop,
                                                caught_up=lambda _: stop.set()):  # fmt: skip
            rows = [loads(line) for line in item.lines]
            assert all(line.endswith(b"\n") for line in item.lines)
            got.append((item.key, ids(rows)))
            cursors.append(reader.cursor)
    return got, cursors


async def test_follow_objects_hands_out_whole_verified_objects_with_their_cursor() -> None:
    store = MemoryStore()
    await commit_shard(store, REF, TOPIC, 0, 0, 4, [record("a", 1), record("b", 1)])
    await write_compaction(store, REF, 1, {S0: 5}, [record("a", 1), record("b", 1)])
    await commit_shard(store, REF, TOPIC, 0, 5, 9, [record("a", 2)], "gzip")
    await commit_shard(store, REF, TOPIC, 1, 0, 0, [record("z", 1)])
    got, cursors = await objects_until_caught_up(CorpusReader(store, REF, poll_interval_s=0.01))
    assert [rows for _, rows in got] == [[("a", 1), ("b", 1)], [("a", 2)], [("z", 1)]]
    assert "_compacted" in got[0][0]
    assert cursors == [{S0: 5}, {S0: 10}, {S0: 10, S1: 1}]
    # Resuming from any of those cursors gives exactly the rest.
    for n, cursor in enumerate(cursors):
        rest, _ = await objects_until_caught_up(CorpusReader(store, REF), cursor)
        assert [rows for _, rows in rest] == [rows for _, rows in got[n + 1 :]]


async def test_follow_objects_honours_a_cursor_inside_an_object_and_notes_each_pass() -> None:
    store = MemoryStore()
    await commit_shard(store, REF, TOPIC, 0, 0, 4, [record("a", 1), record("b", 1)])
    reader = CorpusReader(store, REF)
    async for _ in reader.records({}):
        break  # a cursor inside the first shard: one record handed out
    rest, _ = await objects_until_caught_up(CorpusReader(store, REF), reader.cursor)
    assert [rows for _, rows in rest] == [[("b", 1)]]
    passes: list[float] = []
    stop = asyncio.Event()
    following = CorpusReader(store, REF, poll_interval_s=0.01)

    def caught_up(began: float) -> None:
        passes.append(began)
        if len(passes) == 3:
            stop.set()

    async with asyncio.timeout(10):
        items = [i async for i in following.follow_objects({}, stop=stop, caught_up=caught_up)]
    assert len(items) == 1
    assert passes == sorted(passes)
    assert len(passes) == 4  # the pass that sees stop set is the last: it is noted too


async def test_follow_objects_refuses_a_shard_that_does_not_match_its_commit() -> None:
    store = MemoryStore()
    bad = await commit_shard(store, REF, TOPIC, 0, 0, 4, [record("x", 1), record("y", 1)])
    store.objects[REF.key(bad.shard)] = store.objects[REF.key(bad.shard)].replace(b"x", b"q")
    with pytest.raises(ChainError, match="sha256"):
        await objects_until_caught_up(CorpusReader(store, REF))


async def test_records_and_objects_walk_alike_and_every_cursor_resumes_exactly() -> None:
    """Records and whole objects come from one walk: at the end of each object records()
    leaves the cursor follow_objects leaves there, and every cursor records() leaves, given
    to either, gives exactly the rest (a compaction, two chains, an empty shard)."""
    store = MemoryStore()
    await two_partitions(store)
    await write_compaction(store, REF, 1, {f"{TOPIC}-2": 5}, [record("a", 1), record("b", 1)])
    reader = CorpusReader(store, REF)
    rows: list[dict[str, Any]] = []
    cursors: list[dict[str, int]] = []
    async for row in reader.records():
        rows.append(row)
        cursors.append(reader.cursor)
    assert ids(rows) == [("a", 1), ("b", 1), ("c", 1), ("k", 1), ("l", 1), ("m", 1), ("k", 2)]
    for n, cursor in enumerate(cursors):
        assert ids(await collect(CorpusReader(store, REF), cursor)) == ids(rows[n + 1 :])
        rest, _ = await objects_until_caught_up(CorpusReader(store, REF), cursor)
        assert [r for _, obj in rest for r in obj] == ids(rows[n + 1 :])
    got, object_cursors = await objects_until_caught_up(CorpusReader(store, REF))
    assert [len(obj) for _, obj in got] == [2, 1, 0, 2, 2]
    handed = 0
    for (_, obj), cursor in zip(got, object_cursors, strict=True):
        handed += len(obj)
        if obj:
            assert cursor == cursors[handed - 1]


async def test_after_a_compactions_last_record_the_cursor_is_its_positions() -> None:
    """Even when empty parts follow it: a reader stopped there resumes from the chains, and
    does not need the compaction, which a newer one may have replaced by then."""
    store = MemoryStore()
    await commit_shard(store, REF, TOPIC, 0, 0, 4, [record("a", 1), record("b", 1)])
    await write_parts(store, REF, 1, {S0: 5}, [[], [record("a", 1)], [record("b", 1)], [], []])
    reader = CorpusReader(store, REF)
    cursors = []
    async for _ in reader.records():
        cursors.append(reader.cursor)
    assert cursors == [{"_compacted/generation": 1, "_compacted/skip": 1}, {S0: 5}]
    _, object_cursors = await objects_until_caught_up(CorpusReader(store, REF))
    assert object_cursors == [{"_compacted/generation": 1, "_compacted/skip": 1}, {S0: 5}, {S0: 5},
                              {S0: 5}]  # fmt: skip


async def test_a_line_break_inside_a_line_or_a_part_without_its_count_raises() -> None:
    store = MemoryStore()
    commit = await commit_shard(store, REF, TOPIC, 0, 0, 0, [record("a", 1)])
    # One "line" by its newlines, two records by a bare carriage return inside it.
    data = dumps(record("a", 1)) + b"\r" + dumps(record("b", 1)) + b"\n"
    await store.put(REF.key(commit.shard), data)
    fields = loads(await store.get(REF.manifest_key(S0, 0)))
    fields["sha256"] = hashlib.sha256(data).hexdigest()
    store.objects[REF.manifest_key(S0, 0)] = dumps(fields)
    with pytest.raises(ChainError, match="2 records parsed, 1 lines"):
        await collect(CorpusReader(store, REF), {})
    other = MemoryStore()
    await write_parts(other, REF, 1, {S0: 0}, [[record("a", 1)]], drop="records")
    with pytest.raises(ChainError, match="a part without 'records'"):
        await collect(CorpusReader(other, REF))
