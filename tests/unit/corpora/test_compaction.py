from __future__ import annotations

import hashlib
from datetime import UTC, datetime
from typing import Any

import pytest

from rl_export.corpora import compaction as compaction_module
from rl_export.corpora.commits import Commit, decode_shard, encode_shard, follow_chain, read_shard
from rl_export.corpora.compacted import Compaction, latest_compaction, read_compaction
from rl_export.corpora.compaction import compact, compact_all, expire
from rl_export.corpora.layout import SCHEMA_VERSION, Compression, CorpusRef
from rl_export.corpora.store import MemoryStore
from rl_export.model.codec import dumps, loads

REF = CorpusRef("acme", "bot", "human")
TOPIC = "trajectories"
P0, P1 = f"{TOPIC}-0", f"{TOPIC}-1"
T0 = 1_700_000_000.0


def rec(trace: str, revision: int, **extra: Any) -> dict[str, Any]:
    return {
        "trace_id": trace,
        "revision": revision,
        "updated_at": f"2024-01-01T00:00:{revision:02d}Z",
        **extra,
    }


def tomb(trace: str, revision: int) -> dict[str, Any]:
    return rec(trace, revision, deleted=True)


def iso(at: float) -> str:
    return datetime.fromtimestamp(at, UTC).isoformat().replace("+00:00", "Z")


class Chains:
    """Writes shards and commits exactly as a sink does: data object, then create-only commit."""

    def __init__(self, store: MemoryStore, ref: CorpusRef = REF) -> None:
        self.store = store
        self.ref = ref
        self.heads: dict[int, int] = {}

    async def add(
        self,
        partition: int,
        rows: list[dict[str, Any]],
        *,
        span: int | None = None,
        compression: Compression = "none",
    ) -> Commit:
        """Commit ``rows`` covering ``span`` offsets (default: one per row) of the partition."""
        stream = self.ref.stream(TOPIC, partition)
        start = self.heads.get(partition, 0)
        shard = encode_shard(rows, compression)
        data_key = self.ref.data_key(stream, start, shard.sha256, compression)
        await self.store.put(data_key, shard.data)
        commit = Commit(
            topic=TOPIC,
            partition=partition,
            from_offset=start,
            last_offset=start + (span or len(rows)) - 1,
            shard=self.ref.relative(data_key),
            records=shard.records,
            bytes=len(shard.data),
            sha256=shard.sha256,
            compression=compression,
            schema_version=SCHEMA_VERSION,
            min_updated_at=shard.min_updated_at,
            max_updated_at=shard.max_updated_at,
            writer="test-sink",
            created_at="2024-01-01T00:00:00Z",
        )
        await self.store.put_if_absent(
            self.ref.manifest_key(stream, start), dumps(commit.model_dump(mode="json"))
        )
        self.heads[partition] = commit.last_offset + 1
        return commit


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """Compactions are stamped T0, T0 + 100, T0 + 200, ... (the list holds the next times)."""
    times = [T0 + 100 * n for n in range(20)]
    monkeypatch.setattr(compaction_module, "utc_now", lambda: iso(times.pop(0)))
    return times


def by_trace(rows: Any) -> dict[str, dict[str, Any]]:
    return {r["trace_id"]: r for r in rows}


async def read_as_reader(store: MemoryStore, base: Compaction | None) -> dict[str, dict[str, Any]]:
    """What a reader sees: base records, then every chain from the base positions (latest wins)."""
    held: dict[str, dict[str, Any]] = {}

    def apply(rows: Any) -> None:
        for row in rows:
            current = held.get(row["trace_id"])
            if current is None or row["revision"] >= current["revision"]:
                held[row["trace_id"]] = row

    positions = base.positions if base else {}
    if base is not None:
        apply(await read_compaction(store, REF, base))
    for stream in (P0, P1):
        for commit in await follow_chain(store, REF, stream, positions.get(stream, 0)):
            apply(await read_shard(store, REF, commit))
    return {t: r for t, r in held.items() if not r.get("deleted")}


async def first_chains(chains: Chains) -> None:
    await chains.add(0, [rec("a", 1), rec("b", 1), rec("f", 2), rec("g", 1, v="old")])
    await chains.add(0, [rec("a", 2), rec("c", 1), rec("f", 1), rec("g", 1, v="new")], span=6)
    await chains.add(1, [rec("d", 1), rec("e", 1)])
    await chains.add(1, [tomb("d", 2)])


async def test_first_compaction_keeps_latest_revision_per_trace(clock: list[float]) -> None:
    store = MemoryStore()
    await first_chains(Chains(store))

    result = await compact(store, REF, writer="compactor-1")

    assert result is not None
    assert result.generation == 1
    assert result.positions == {P0: 10, P1: 3}
    assert result.records == 6
    assert (result.writer, result.schema_version, result.created_at) == (
        "compactor-1",
        SCHEMA_VERSION,
        iso(T0),
    )
    rows = list(await read_compaction(store, REF, result))
    assert [r["trace_id"] for r in rows] == ["a", "b", "c", "e", "f", "g"]  # sorted
    held = by_trace(rows)
    assert held["a"]["revision"] == 2
    assert held["f"]["revision"] == 2  # an older revision read later does not win
    assert held["g"]["v"] == "new"  # equal revisions: the one read later wins
    assert "d" not in held  # tombstoned
    assert all(not r.get("deleted") for r in rows)
    stored = loads(store.objects[REF.compaction_key(1)])
    assert Compaction.model_validate(stored) == result
    assert await latest_compaction(store, REF) == result
    for part in result.parts:
        assert part["shard"].startswith("_compacted/00000000000000000001/part-00000-")
        data = store.objects[REF.key(part["shard"])]
        assert (part["bytes"], part["sha256"]) == (len(data), hashlib.sha256(data).hexdigest())
        assert part["compression"] == "none"


async def test_second_compaction_builds_on_the_first(clock: list[float]) -> None:
    store = MemoryStore()
    chains = Chains(store)
    await first_chains(chains)
    first = await compact(store, REF, writer="w")
    assert first is not None
    # The base covers partition 0's first shard: a compactor that re-read it would fail.
    first_shard = sorted(k for k in store.objects if k.startswith(f"{REF.root}/data/{P0}/"))[0]
    store.objects[first_shard] = b"not what the commit says\n"
    await chains.add(0, [tomb("b", 2), rec("a", 3, v="re-revised")])

    second = await compact(store, REF, writer="w")

    assert second is not None
    assert second.generation == 2
    assert second.positions == {P0: 12, P1: 3}  # partition 1 did not advance: base position
    held = by_trace(await read_compaction(store, REF, second))
    assert sorted(held) == ["a", "c", "e", "f", "g"]
    assert held["a"] == rec("a", 3, v="re-revised")
    assert second.records == 5
    assert all(p["shard"].startswith("_compacted/00000000000000000002/") for p in second.parts)


async def test_nothing_new_writes_no_generation(clock: list[float]) -> None:
    store = MemoryStore()
    assert await compact(store, REF, writer="w") is None
    assert store.objects == {}

    await first_chains(Chains(store))
    assert await compact(store, REF, writer="w") is not None
    before = dict(store.objects)

    assert await compact(store, REF, writer="w") is None
    assert store.objects == before


async def test_a_tail_of_fewer_commits_than_min_commits_waits(clock: list[float]) -> None:
    store = MemoryStore()
    chains = Chains(store)
    await first_chains(chains)  # four commits over two chains
    assert await compact(store, REF, writer="w", min_commits=5) is None
    assert not [k for k in store.objects if "_compacted/" in k]  # nothing written
    first = await compact(store, REF, writer="w", min_commits=4)
    assert first is not None
    # After it, only what is new counts: one commit is not enough for two, two are.
    await chains.add(0, [rec("a", 4)])
    assert await compact(store, REF, writer="w", min_commits=2) is None
    await chains.add(1, [rec("e", 2)])
    second = await compact(store, REF, writer="w", min_commits=2)
    assert second is not None
    held = by_trace(await read_compaction(store, REF, second))
    assert (held["a"]["revision"], held["e"]["revision"]) == (4, 2)


class RacingStore(MemoryStore):
    """Another compactor creates the generation between our read and our create-only write."""

    def __init__(self) -> None:
        super().__init__()
        self.winner: bytes | None = None

    async def put_if_absent(self, key: str, data: bytes) -> None:
        if key.endswith("/_compaction.json") and self.winner is None:
            winner = Compaction.model_validate(loads(data)).model_copy(
                update={"writer": "the-winner"}
            )
            self.winner = dumps(winner.model_dump(mode="json"))
            await super().put_if_absent(key, self.winner)
        await super().put_if_absent(key, data)


async def test_losing_the_create_only_race_returns_none(clock: list[float]) -> None:
    store = RacingStore()
    await first_chains(Chains(store))

    assert await compact(store, REF, writer="loser") is None

    assert store.winner is not None
    assert store.objects[REF.compaction_key(1)] == store.winner
    latest = await latest_compaction(store, REF)
    assert latest is not None
    assert latest.writer == "the-winner"


async def test_gzip_parts_are_byte_identical_on_retry(clock: list[float]) -> None:
    store = MemoryStore()
    await first_chains(Chains(store))
    first = await compact(store, REF, writer="w", compression="gzip")
    assert first is not None
    parts = {p["shard"]: store.objects[REF.key(p["shard"])] for p in first.parts}
    del store.objects[REF.compaction_key(1)]  # the first attempt "crashed" before its manifest

    retry = await compact(store, REF, writer="w", compression="gzip")

    assert retry is not None
    assert retry.parts == first.parts
    assert {p["shard"]: store.objects[REF.key(p["shard"])] for p in retry.parts} == parts
    for shard, data in parts.items():
        assert shard.endswith(".jsonl.gz")
        assert data[4:8] == b"\x00\x00\x00\x00"  # gzip header mtime
        rows = decode_shard(data, "gzip")
        assert [r["trace_id"] for r in rows] == ["a", "b", "c", "e", "f", "g"]


async def test_parts_split_at_max_part_records(clock: list[float]) -> None:
    store = MemoryStore()
    chains = Chains(store)
    await chains.add(0, [rec(t, 1) for t in "edcba"])

    result = await compact(store, REF, writer="w", max_part_records=2)

    assert result is not None
    assert [p["records"] for p in result.parts] == [2, 2, 1]
    names = [p["shard"].rsplit("/", 1)[1] for p in result.parts]
    assert [n[: len("part-00000")] for n in names] == ["part-00000", "part-00001", "part-00002"]
    for part, name in zip(result.parts, names, strict=True):
        assert name == f"{name[:10]}-{part['sha256'][:16]}.jsonl"
    assert [r["trace_id"] for r in await read_compaction(store, REF, result)] == list("abcde")
    assert result.records == 5


async def test_compact_all_compacts_every_corpus_with_news(clock: list[float]) -> None:
    store = MemoryStore()
    other = CorpusRef("acme", "bot", "evaluator")
    await Chains(store).add(0, [rec("a", 1)])
    await Chains(store, other).add(0, [rec("b", 1)])

    written = await compact_all(store, "acme/", writer="w")
    assert sorted(c.records for c in written) == [1, 1]
    assert await latest_compaction(store, other) is not None
    assert await compact_all(store, writer="w") == []


class RecordingStore(MemoryStore):
    def __init__(self) -> None:
        super().__init__()
        self.deletes: list[str] = []

    async def delete(self, key: str) -> None:
        self.deletes.append(key)
        await super().delete(key)


async def three_generations(store: RecordingStore) -> tuple[list[Compaction], list[Commit]]:
    """gen 1 covers commits[0:2], gen 2 commits[0:4], gen 3 commits[0:6]; commits[6] is new."""
    chains = Chains(store)
    commits = []
    generations = []
    for step in range(3):
        commits.append(await chains.add(0, [rec("a", step + 1), rec(f"x{step}", 1)]))
        commits.append(await chains.add(1, [rec(f"y{step}", 1), tomb("y0", step + 2)]))
        generation = await compact(store, REF, writer="w")
        assert generation is not None
        generations.append(generation)
    commits.append(await chains.add(0, [rec("a", 9)]))
    return generations, commits


async def test_expire_deletes_only_what_is_covered_and_old_enough(clock: list[float]) -> None:
    store = RecordingStore()
    (g1, g2, g3), commits = await three_generations(store)
    # A losing compactor's leftover part in generation 1, a losing sink's data object at a
    # covered offset, and a sink's uncommitted data object at the tail.
    leftover_part = f"{REF.compacted_prefix()}00000000000000000001/part-00000-ffff.jsonl"
    loser_data = REF.data_key(P0, 0, "e" * 64, "none")
    tail_data = REF.data_key(P0, 7, "d" * 64, "none")
    for key in (leftover_part, loser_data, tail_data):
        store.objects[key] = b"{}\n"
    expected_views = [await read_as_reader(store, g) for g in (g2, g3)]

    # Too early: generation 1 is not older than the retention yet.
    assert await expire(store, REF, retention_s=50, now=T0 + 49) == []
    assert store.deletes == []

    deleted = await expire(store, REF, retention_s=50, now=T0 + 100 + 50)

    covered = commits[0:2]  # generation 1's positions: P0 -> 2, P1 -> 2
    data_keys = {REF.key(c.shard) for c in covered} | {loser_data}
    commit_keys = {REF.manifest_key(c.stream, c.from_offset) for c in covered}
    sidecars = {REF.key(p["index"]["key"]) for p in g1.parts}  # beside each part
    assert len(sidecars) == len(g1.parts)
    gen1_keys = (
        {REF.key(p["shard"]) for p in g1.parts}
        | sidecars
        | {
            leftover_part,
            REF.compaction_key(1),
        }
    )
    assert set(deleted) == data_keys | commit_keys | gen1_keys
    assert deleted == store.deletes
    assert len(deleted) == len(set(deleted))
    for commit in covered:  # data before its commit
        assert deleted.index(REF.key(commit.shard)) < deleted.index(
            REF.manifest_key(commit.stream, commit.from_offset)
        )
    assert deleted[-1] == REF.compaction_key(1)  # a generation's manifest goes last
    assert tail_data in store.objects
    for commit in commits[2:]:
        assert REF.key(commit.shard) in store.objects
        assert REF.manifest_key(commit.stream, commit.from_offset) in store.objects

    # A reader starting from either kept compaction still sees everything it saw before.
    assert [await read_as_reader(store, g) for g in (g2, g3)] == expected_views
    assert await latest_compaction(store, REF) == g3
    # Nothing else is old enough: a second run deletes nothing.
    assert await expire(store, REF, retention_s=50, now=T0 + 150) == []


async def test_expire_waits_for_the_successor_before_dropping_a_generation(
    clock: list[float],
) -> None:
    store = RecordingStore()
    (g1, _g2, _g3), commits = await three_generations(store)

    # Generation 1 is old enough, generation 2 (its successor) is not.
    deleted = await expire(store, REF, retention_s=50, now=T0 + 60)

    assert REF.compaction_key(1) in store.objects
    assert all(REF.key(p["shard"]) in store.objects for p in g1.parts)
    assert set(deleted) == {REF.key(c.shard) for c in commits[0:2]} | {
        REF.manifest_key(c.stream, c.from_offset) for c in commits[0:2]
    }


async def test_expire_keeps_what_the_oldest_kept_generation_needs(clock: list[float]) -> None:
    store = RecordingStore()
    (g1, g2, g3), commits = await three_generations(store)
    now = T0 + 1000

    # Keeping three generations keeps everything.
    assert await expire(store, REF, keep_generations=3, retention_s=50, now=now) == []
    # Keeping one: generation 2 covers commits[0:4]; nothing at or past its positions goes.
    view = await read_as_reader(store, g3)
    deleted = await expire(store, REF, keep_generations=1, retention_s=50, now=now)

    for commit in commits:
        key = REF.manifest_key(commit.stream, commit.from_offset)
        needed = commit.last_offset >= g2.positions[commit.stream]
        assert (key in store.objects) == needed, key
        assert (key in deleted) != needed, key
    old_folders = [f"{REF.compacted_prefix()}{g.generation:020d}/" for g in (g1, g2)]
    assert not [k for k in store.objects if k.startswith(tuple(old_folders))]
    assert all(REF.key(p["shard"]) in store.objects for p in g3.parts)
    assert await read_as_reader(store, g3) == view
