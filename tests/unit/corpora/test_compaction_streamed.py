"""The streamed compaction writes what the in-memory one wrote, byte for byte, in memory
that does not grow with the corpus (issue 58)."""

from __future__ import annotations

import random
import tracemalloc
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest

from rl_export.corpora import compaction as compaction_module
from rl_export.corpora import compactmerge
from rl_export.corpora.commits import Commit, encode_shard
from rl_export.corpora.compaction import compact
from rl_export.corpora.erasures import record_erasures
from rl_export.corpora.layout import SCHEMA_VERSION, Compression, CorpusRef
from rl_export.corpora.store import LocalStore, MemoryStore, ObjectStore
from rl_export.corpora.table import TableCommit, TableSync
from rl_export.model.codec import dumps
from rl_export.model.partitioning import PARTITIONERS
from tests.unit.corpora.inmemory_compaction import compact_in_memory
from tests.unit.corpora.test_compaction import REF, T0, TOPIC, iso

CREATED = iso(T0)


class Seen(TableSync):
    """A table that keeps what compaction gives it (no Delta)."""

    changes: list[Mapping[str, Any]]
    records: list[Mapping[str, Any]]

    async def update(  # type: ignore[override]
        self, store: ObjectStore, ref: CorpusRef, *, applies_to: int, generation: int,
        positions: Mapping[str, int], changes: Sequence[Mapping[str, Any]],
        records: Callable[[], Iterable[Mapping[str, Any]]] | None,
        fields: Sequence[str] | None = None, rewrite: bool = False,
    ) -> TableCommit | None:  # fmt: skip
        self.changes = list(changes)
        self.records = [] if records is None else list(records())
        return None


async def add(  # noqa: PLR0917
    store: ObjectStore,
    heads: dict[int, int],
    partition: int,
    rows: list[dict[str, Any]],
    created_at: str,
    compression: Compression,
) -> None:
    """A shard and its commit, as a sink writes them, stamped ``created_at``."""
    stream = REF.stream(TOPIC, partition)
    start = heads.get(partition, 0)
    shard = encode_shard(rows, compression)
    key = REF.data_key(stream, start, shard.sha256, compression)
    await store.put(key, shard.data)
    commit = Commit(
        topic=TOPIC, partition=partition, from_offset=start,
        last_offset=start + max(len(rows), 1) - 1, shard=REF.relative(key),
        records=shard.records, bytes=len(shard.data), sha256=shard.sha256,
        compression=compression, schema_version=SCHEMA_VERSION,
        min_updated_at=shard.min_updated_at, max_updated_at=shard.max_updated_at,
        writer="test-sink", created_at=created_at,
    )  # fmt: skip
    await store.put_if_absent(REF.manifest_key(stream, start), commit.to_json())
    heads[partition] = commit.last_offset + 1


def random_row(rng: random.Random, traces: list[str]) -> dict[str, Any]:
    trace = rng.choice(traces)
    revision = rng.randint(1, 4)  # few revisions: equal ones are common
    if rng.random() < 0.25:
        row: dict[str, Any] = {"trace_id": trace, "revision": revision, "deleted": True}
        if rng.random() < 0.3:
            row["deleted_at"] = iso(T0 + rng.uniform(0, 20 * 86400))
        return row
    row = {"trace_id": trace, "revision": revision,
           "updated_at": iso(T0 + rng.randint(0, 10**6)), "reward": rng.random()}  # fmt: skip
    if rng.random() < 0.5:
        row["messages"] = [{"role": "user", "content": rng.choice(["hi", "é\u2028x", "a\nb"])}]
    if rng.random() < 0.3:
        row["human_labels"] = [{"labeler": "ann", "score": rng.randint(0, 5)}]
    if rng.random() < 0.2:
        row[f"extra{rng.randint(0, 2)}"] = {"k": rng.random()}
    return row


async def snapshot(store: MemoryStore) -> dict[str, bytes]:
    return {key: await store.get(key) for key in await store.list("")}


@pytest.mark.parametrize("seed", range(40))
async def test_the_streamed_compaction_writes_what_the_in_memory_one_wrote(
    seed: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    rng = random.Random(seed)
    monkeypatch.setattr(compaction_module, "utc_now", lambda: CREATED)
    # Sidecar rows converted a few at a time, or a part's at once: the same sidecar.
    monkeypatch.setattr(compactmerge, "SIDECAR_BATCH_ROWS", rng.choice([1, 2, 3, 4096]))
    traces = [f"t{k:02d}" for k in range(rng.randint(1, 14))] + ["té", "t\u2028"]
    streamed, reference = MemoryStore(), MemoryStore()
    heads: dict[int, int] = {}
    compression: Compression = rng.choice(["none", "none", "gzip"])
    partitioning = (rng.choice(PARTITIONERS), rng.randint(1, 3)) if rng.random() < 0.7 else None
    max_part_records = rng.randint(1, 5)
    now = T0 + 10 * 86400  # the retention (7 days) keeps about half the tombstones
    for _ in range(rng.randint(1, 4)):
        for _ in range(rng.randint(0, 5)):
            rows = [random_row(rng, traces) for _ in range(rng.randint(0, 8))]
            at = iso(T0 + rng.uniform(0, 20 * 86400))
            partition, shard_compression = rng.randint(0, 2), rng.choice(["none", "gzip"])
            for store in (streamed, reference):
                await add(store, dict(heads), partition, rows, at, shard_compression)
            heads[partition] = heads.get(partition, 0) + max(len(rows), 1)
        if rng.random() < 0.3:
            erased = [(rng.randint(0, 99), rng.choice(traces), 9)]
            for store in (streamed, reference):
                await record_erasures(store, REF.org, REF.project, f"{TOPIC}-0", erased)
        options: dict[str, Any] = {
            "compression": compression, "max_part_records": max_part_records,
            "partitioning": partitioning, "now": now,
        }  # fmt: skip
        seen = Seen()
        made = await compact(streamed, REF, writer="w", table=seen, **options)
        expected = await compact_in_memory(reference, REF, writer="w", created_at=CREATED,
                                           **options)  # fmt: skip
        assert (made is None) == (expected is None)
        assert await snapshot(streamed) == await snapshot(reference)
        if expected is not None:
            generation, changes = expected
            assert made == generation
            assert seen.changes == changes
            assert [dumps(r) for r in seen.records] == [
                dumps(r) for r in await records_of(reference, generation.generation)
            ]


async def records_of(store: MemoryStore, generation: int) -> list[dict[str, Any]]:
    from rl_export.corpora.compacted import Compaction, read_compaction

    compaction = Compaction.model_validate_json(await store.get(REF.compaction_key(generation)))
    return list(await read_compaction(store, REF, compaction))


async def test_many_changes_rewrite_the_table_to_the_generation_s_records(
    tmp_path: Path,
) -> None:
    """Past ``merge_bytes`` the table is overwritten from the generation, not merged into:
    the rows are the generation's records either way, and each write names its generation."""
    from deltalake import DeltaTable

    from rl_export.corpora.compacted import latest_compaction, read_compaction
    from tests.tablecheck import differences

    rng = random.Random(7)
    traces = [f"t{k:03d}" for k in range(60)]
    # Distinct revisions: a MERGE keeps a row whose revision it already has.
    rounds = [[{**random_row(rng, traces), "revision": n + 1} for _ in range(40)]
              for n in range(3)]  # fmt: skip
    for merge_bytes in (1 << 40, 0):  # merged every time; rewritten every time
        root = tmp_path / str(merge_bytes)
        store = LocalStore(root)
        heads: dict[int, int] = {}
        sync = TableSync(merge_bytes=merge_bytes)
        for n, rows in enumerate(rounds):
            await add(store, heads, n % 2, rows, iso(T0 + n), "none")
            await compact(store, REF, writer="w", table=sync, max_part_records=7)
            assert sync.error is None
            assert sync.written is not None
            table = DeltaTable(str(root / REF.root / "_table"))
            assert table.transaction_version("rl-export") == n + 1
            base = await latest_compaction(store, REF)
            assert base is not None
            records = list(await read_compaction(store, REF, base))
            rows_now = table.to_pyarrow_table().to_pylist()
            columns = [c for c in rows_now[0] if c in {k for r in records for k in r}]
            assert differences(rows_now, records, columns) == [], (merge_bytes, n)


async def test_memory_does_not_grow_with_the_corpus(tmp_path: Path) -> None:
    """The peak of Python's allocations while compacting N records of 4 KB (half of them in
    the base, a tenth of those re-scored) does not grow with N: 10x the records, well under
    two and a half times the peak."""

    async def peak(n: int) -> int:
        store = LocalStore(tmp_path / str(n))
        heads: dict[int, int] = {}
        pad, notes = "x" * 3000, "y" * 1000

        def row(k: int, revision: int) -> dict[str, Any]:
            # The sidecar keeps ``evaluation`` while its part is written.
            return {"trace_id": f"t{k:07d}", "revision": revision, "messages": pad,
                    "evaluation": {"notes": notes, "k": k}}  # fmt: skip

        for at in range(0, n // 2, 100):
            await add(store, heads, 0, [row(k, 1) for k in range(at, at + 100)], CREATED, "none")
        await compact(store, REF, writer="w", max_part_records=500)
        for at in range(n // 2, n, 100):  # commits of 100: a few are read ahead
            await add(store, heads, 1, [row(k, 1) for k in range(at, at + 100)], CREATED, "none")
        await add(store, heads, 1, [row(k, 2) for k in range(0, n // 2, 10)], CREATED, "none")
        tracemalloc.start()
        try:
            made = await compact(store, REF, writer="w", max_part_records=500)
            assert made is not None
            assert made.records == n
            return tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()

    small, large = await peak(2_000), await peak(20_000)
    # What grows is the index of the new lines' winners (a few hundred bytes a trace); the
    # records held at once (a part, a few commits) do not. The in-memory compaction's peak
    # was above the records' size: 80 MB at 20,000.
    assert large < 2.5 * small, (small, large)
    assert large < 40 << 20, large


def test_compaction_ends_on_a_loop_whose_pool_has_one_thread() -> None:
    """The walk waits in its own thread for the loop to store each part, and storing one
    takes a thread of the loop's pool: with the walk in that pool, a pool of one (or of as
    many as there are compactions at once) waited forever."""
    import asyncio
    import concurrent.futures

    async def main() -> None:
        asyncio.get_running_loop().set_default_executor(
            concurrent.futures.ThreadPoolExecutor(max_workers=1)
        )
        store, heads = MemoryStore(), {}
        rows = [{"trace_id": f"t{k}", "revision": 1, "reward": 0.5} for k in range(5)]
        await add(store, heads, 0, rows, CREATED, "none")
        made = await asyncio.wait_for(compact(store, REF, writer="w", max_part_records=1), 30)
        assert made is not None
        assert len(made.parts) == 5

    asyncio.run(main())
