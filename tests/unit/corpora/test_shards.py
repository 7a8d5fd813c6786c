"""``rl-export shards``: ls, cat, tail, and verify finding every kind of damage precisely.

Each damage test starts from a clean corpus, breaks exactly one thing, and checks that
``verify`` names it in one line, and nothing else.
"""

from __future__ import annotations

import asyncio
from typing import Any

from rl_export.corpora.layout import CorpusRef
from rl_export.corpora.shards import cat, ls, tail
from rl_export.corpora.store import MemoryStore
from rl_export.corpora.verify import verify
from rl_export.model.codec import loads
from tests.unit.corpora.test_reader import (
    REF,
    TOPIC,
    commit_shard,
    record,
    tombstone,
    write_compaction,
)

S0 = f"{TOPIC}-0"
OTHER = CorpusRef("acme", "bot", "evaluator")


async def clean(store: MemoryStore) -> None:
    """Two corpora, three chains, gzip and plain shards, a compaction: all consistent."""
    await commit_shard(store, REF, TOPIC, 0, 0, 4, [record("a", 1), record("b", 1)])
    await commit_shard(store, REF, TOPIC, 0, 5, 9, [record("a", 2)], "gzip")
    await commit_shard(store, REF, TOPIC, 1, 0, 2, [record("c", 1), tombstone("c", 2)])
    await write_compaction(store, REF, 1, {S0: 5}, [record("a", 1), record("b", 1)])
    await commit_shard(store, OTHER, TOPIC, 0, 0, 9, [record("a", 1)])


def problems_with(report_problems: list[str], *needles: str) -> None:
    """Exactly one problem, and it contains every needle."""
    assert len(report_problems) == 1, report_problems
    for needle in needles:
        assert needle in report_problems[0], (needle, report_problems[0])


def manifest(partition: int, from_offset: int, ref: CorpusRef = REF) -> str:
    return ref.manifest_key(f"{TOPIC}-{partition}", from_offset)


async def shard_key(store: MemoryStore, partition: int, from_offset: int) -> str:
    commit: dict[str, Any] = loads(await store.get(manifest(partition, from_offset)))
    return REF.key(commit["shard"])


# --- verify ---------------------------------------------------------------------------------


async def test_verify_passes_a_clean_store_and_counts_what_it_checked() -> None:
    store = MemoryStore()
    await clean(store)
    report = await verify(store)
    assert report.ok, report.problems
    assert (report.corpora, report.commits, report.records) == (2, 4, 6)
    assert (report.compactions, report.compacted_records, report.orphans) == (1, 2, 0)
    assert report.summary().startswith("ok: 2 corpora, 4 commits, 6 records")


async def test_verify_only_looks_under_the_prefix() -> None:
    store = MemoryStore()
    await clean(store)
    await store.put(manifest(0, 0, OTHER), b"not json")
    report = await verify(store, "acme/bot/human/")
    assert report.ok, report.problems
    assert (report.corpora, report.commits) == (1, 3)


async def test_verify_detects_a_gap() -> None:
    store = MemoryStore()
    await clean(store)
    await commit_shard(store, REF, TOPIC, 0, 12, 20, [record("d", 1)])
    report = await verify(store)
    problems_with(report.problems, "gap", manifest(0, 12), "offsets 10..11", manifest(0, 5))


async def test_verify_detects_an_overlap() -> None:
    store = MemoryStore()
    await clean(store)
    await commit_shard(store, REF, TOPIC, 0, 7, 12, [record("d", 1)])
    report = await verify(store)
    problems_with(report.problems, "overlaps", manifest(0, 7), manifest(0, 5))


async def test_verify_detects_a_chain_that_does_not_start_at_zero() -> None:
    store = MemoryStore()
    await commit_shard(store, REF, TOPIC, 3, 4, 9, [record("a", 1)])
    report = await verify(store)
    problems_with(report.problems, manifest(3, 4), "starts at offset 4", "0..3")


async def test_verify_accepts_a_chain_whose_start_a_compaction_covers() -> None:
    store = MemoryStore()
    await clean(store)
    # Expiry removed the first commit of partition 0: the compaction reaches offset 5.
    key = await shard_key(store, 0, 0)
    await store.delete(key)
    await store.delete(manifest(0, 0))
    report = await verify(store)
    assert report.ok, report.problems


async def test_verify_detects_compaction_positions_off_a_commit_boundary() -> None:
    store = MemoryStore()
    await clean(store)
    await write_compaction(store, REF, 2, {S0: 7}, [record("a", 2), record("b", 1)])
    report = await verify(store)
    problems_with(report.problems, REF.compaction_key(2), "position 7", "not a commit boundary")


async def test_verify_detects_a_bad_checksum() -> None:
    store = MemoryStore()
    await clean(store)
    key = await shard_key(store, 0, 0)
    store.objects[key] = store.objects[key].replace(b'"a"', b'"z"')
    report = await verify(store)
    problems_with(report.problems, key, "sha256", manifest(0, 0))


async def test_verify_detects_a_wrong_record_count() -> None:
    store = MemoryStore()
    await clean(store)
    await commit_shard(store, REF, TOPIC, 0, 10, 12, [record("d", 1)], overrides={"records": 3})
    report = await verify(store)
    problems_with(report.problems, "1 records", "says 3", manifest(0, 10))


async def test_verify_detects_a_wrong_byte_size() -> None:
    store = MemoryStore()
    await clean(store)
    await commit_shard(store, REF, TOPIC, 0, 10, 12, [record("d", 1)], overrides={"bytes": 1})
    report = await verify(store)
    problems_with(report.problems, "bytes", "says 1", manifest(0, 10))


async def test_verify_detects_a_missing_shard() -> None:
    store = MemoryStore()
    await clean(store)
    key = await shard_key(store, 1, 0)
    await store.delete(key)
    report = await verify(store)
    problems_with(report.problems, key, "missing", manifest(1, 0))


async def test_verify_detects_a_repeated_trace_revision_across_chains() -> None:
    store = MemoryStore()
    await clean(store)
    await commit_shard(store, REF, TOPIC, 1, 3, 5, [record("d", 1), record("b", 1)])
    report = await verify(store)
    problems_with(report.problems, "'b'", "revision 1", manifest(0, 0), manifest(1, 3))


async def test_verify_detects_a_repeated_trace_revision_within_a_shard() -> None:
    store = MemoryStore()
    await clean(store)
    await commit_shard(store, REF, TOPIC, 1, 3, 5, [record("d", 1), record("d", 1)])
    report = await verify(store)
    problems_with(report.problems, "'d'", f"twice in {manifest(1, 3)}")


async def test_verify_does_not_count_compaction_parts_as_repeats() -> None:
    store = MemoryStore()
    await clean(store)  # the compaction holds (a, 1) and (b, 1), like the first shard
    report = await verify(store)
    assert report.ok, report.problems


async def test_verify_detects_an_unreadable_commit() -> None:
    store = MemoryStore()
    await clean(store)
    await store.put(manifest(0, 10), b'{"topic": "trajectories", "partition": 0')
    report = await verify(store)
    problems_with(report.problems, manifest(0, 10), "unreadable commit")
    # Its offsets are unknown: no gap or overlap is claimed after it.
    await commit_shard(store, REF, TOPIC, 0, 30, 31, [record("e", 1)])
    report = await verify(store)
    problems_with(report.problems, manifest(0, 10), "unreadable commit")


async def test_verify_detects_a_commit_that_contradicts_its_name() -> None:
    store = MemoryStore()
    await clean(store)
    await commit_shard(store, REF, TOPIC, 0, 10, 12, [record("d", 1)], overrides={"partition": 1})
    report = await verify(store)
    assert len(report.problems) >= 1
    assert all(manifest(0, 10) in p for p in report.problems), report.problems
    assert any("trajectories-1" in p for p in report.problems)


async def test_verify_detects_a_corrupt_compaction_part() -> None:
    store = MemoryStore()
    await clean(store)
    compaction = await write_compaction(store, REF, 2, {S0: 10}, [record("a", 2), record("b", 1)])
    key = REF.key(compaction.parts[0]["shard"])
    store.objects[key] = store.objects[key].replace(b'"b"', b'"y"')
    report = await verify(store)
    problems_with(report.problems, key, "sha256", REF.compaction_key(2))


async def test_verify_counts_orphans_without_failing() -> None:
    store = MemoryStore()
    await clean(store)
    # A sink that crashed after its data upload, and a compactor that lost its race.
    await store.put(REF.data_key(S0, 10, "f" * 64, "none"), b'{"trace_id":"x"}\n')
    await store.put(f"{REF.compacted_prefix()}{2:020d}/part-00000-{'e' * 16}.jsonl", b"")
    report = await verify(store)
    assert report.ok, report.problems
    assert report.orphans == 2
    assert report.summary().endswith("2 orphans")


# --- ls, cat, tail --------------------------------------------------------------------------


async def test_ls_prints_one_line_per_corpus_and_chain() -> None:
    store = MemoryStore()
    await clean(store)
    lines = await ls(store)
    assert len(lines) == 3
    evaluator0, human0, human1 = lines  # by corpus root, then numeric partition
    assert human0.startswith(f"acme/bot/human {S0} commits=2 offsets=0..9 records=3 bytes=")
    assert human0.endswith(" compaction=1")
    assert human1.startswith(f"acme/bot/human {TOPIC}-1 commits=1 offsets=0..2 records=2 ")
    assert evaluator0.startswith(f"acme/bot/evaluator {S0} commits=1 offsets=0..9 records=1 ")
    assert evaluator0.endswith(" compaction=-")
    assert await ls(store, "acme/bot/evaluator/") == [evaluator0]


async def test_cat_writes_json_lines_and_can_keep_the_latest_revision() -> None:
    store = MemoryStore()
    await clean(store)
    lines = [line async for line in cat(store, REF, latest_only=False)]
    assert all(line.endswith(b"\n") and line.count(b"\n") == 1 for line in lines)
    # From the compaction (a 1, b 1), then offsets 5.. of partition 0, then partition 1.
    rows = [loads(line) for line in lines]
    assert [(r["trace_id"], r["revision"]) for r in rows] == [
        ("a", 1), ("b", 1), ("a", 2), ("c", 1), ("c", 2),
    ]  # fmt: skip
    latest = [loads(line) async for line in cat(store, REF, latest_only=True)]
    assert sorted((r["trace_id"], r["revision"]) for r in latest) == [("a", 2), ("b", 1)]


async def test_tail_prints_only_new_records_until_stopped() -> None:
    store = MemoryStore()
    await clean(store)
    stop = asyncio.Event()

    async def writer() -> None:
        await asyncio.sleep(0.05)
        await commit_shard(store, REF, TOPIC, 1, 3, 3, [record("new", 1)])
        stop.set()

    async with asyncio.timeout(10):
        task = asyncio.create_task(writer())
        lines = [line async for line in tail(store, REF, stop=stop, poll_interval_s=0.01)]
        await task
    assert [loads(line)["trace_id"] for line in lines] == ["new"]
