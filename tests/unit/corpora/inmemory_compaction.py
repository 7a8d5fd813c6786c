"""The in-memory compaction as it was before it streamed (steps 1 to 5, no table): every
record parsed and held, a dict per trace. The streamed one must write the same generation,
byte for byte (test_compaction_streamed.py)."""

from __future__ import annotations

import gzip
from collections.abc import Iterable
from typing import Any

from rl_export.corpora.commits import encode_shard, read_chain
from rl_export.corpora.compacted import (
    Compaction,
    encode_holdings,
    latest_compaction,
    read_compaction,
    read_tombstones,
)
from rl_export.corpora.compaction import (
    _described,
    _generation_folders,
    _iso,
    _sha,
    _streams,
    generation_prefix,
    part_key,
)
from rl_export.corpora.erasures import erased_traces
from rl_export.corpora.layout import SCHEMA_VERSION, Compression, CorpusRef
from rl_export.corpora.sidecar import index_row, line_lengths, write_sidecar
from rl_export.corpora.store import ObjectStore
from rl_export.model.codec import dumps, dumps_lines
from rl_export.model.errors import ObjectExistsError
from rl_export.model.partitioning import Partitioner, partition_for


class Latest:
    def __init__(self) -> None:
        self._rows: dict[str, dict[str, Any]] = {}

    def apply(self, rows: Iterable[dict[str, Any]], deleted_at: str | None = None) -> None:
        for row in rows:
            current = self._rows.get(row["trace_id"])
            if current is None or row["revision"] >= current["revision"]:
                if row.get("deleted") and deleted_at is not None and "deleted_at" not in row:
                    row = {**row, "deleted_at": deleted_at}  # noqa: PLW2901
                self._rows[row["trace_id"]] = row

    def records(self) -> list[dict[str, Any]]:
        return [self._rows[t] for t in sorted(self._rows) if not self._rows[t].get("deleted")]

    def current(self, trace_ids: Iterable[str]) -> list[dict[str, Any]]:
        return [self._rows[t] for t in sorted(set(trace_ids)) if t in self._rows]

    def tombstones(self, since: str) -> list[dict[str, Any]]:
        return [
            row
            for t in sorted(self._rows)
            if (row := self._rows[t]).get("deleted") and row.get("deleted_at", "") >= since
        ]


async def compact_in_memory(
    store: ObjectStore,
    ref: CorpusRef,
    *,
    writer: str,
    created_at: str,
    now: float,
    compression: Compression = "none",
    max_part_records: int = 100_000,
    partitioning: tuple[Partitioner, int] | None = None,
    tombstone_retention_s: float = 7 * 86400.0,
    sidecars: bool = True,
) -> tuple[Compaction, list[dict[str, Any]]] | None:
    """The generation, and the table's changes (the latest row of each touched trace)."""
    folders = await _generation_folders(store, ref)
    base = await latest_compaction(store, ref)
    latest = Latest()
    positions: dict[str, int] = dict(base.positions) if base else {}
    new: list[tuple[str, list[dict[str, Any]]]] = []
    for stream in await _streams(store, ref):
        for commit, rows in await read_chain(store, ref, stream, positions.get(stream, 0)):
            new.append((commit.created_at, rows))
            positions[stream] = commit.last_offset + 1
    if not new:
        return None
    if base is not None:
        latest.apply(list(await read_compaction(store, ref, base)))
        latest.apply(await read_tombstones(store, ref, base))
    for at, rows in new:
        latest.apply(rows, deleted_at=at)
    generation = max((g for g, keys in folders.items() if ref.compaction_key(g) in keys), default=0)
    generation = max(generation, base.generation if base else 0) + 1

    records = latest.records()
    erased = await erased_traces(store, ref.org, ref.project)
    if erased:
        records = [r for r in records if r["trace_id"] not in erased]
    parts: list[dict[str, Any]] = []
    for n, at in enumerate(range(0, len(records), max_part_records)):
        part_rows = records[at : at + max_part_records]
        shard = encode_shard(part_rows, compression)
        key = part_key(ref, generation, n, shard.sha256, compression)
        await store.put(key, shard.data)
        described = _described(ref, key, shard.data, shard.records, compression)
        if sidecars and compression == "none":
            index = await write_sidecar(store, key, [index_row(r) for r in part_rows],
                                        line_lengths(shard.data), shard.sha256,
                                        relative=ref.relative)  # fmt: skip
            if index is not None:
                described["index"] = index.model_dump(mode="json")
        parts.append(described)
    kept = latest.tombstones(since=_iso(now - tombstone_retention_s))
    tombstones = None
    if kept:
        data = gzip.compress(dumps_lines(kept), compresslevel=6, mtime=0)
        key = f"{generation_prefix(ref, generation)}tombstones-{_sha(data)[:16]}.jsonl.gz"
        await store.put(key, data)
        tombstones = _described(ref, key, data, len(kept), "gzip")
    holdings = None
    if partitioning is not None:
        partitioner, count = partitioning
        by_partition: list[list[tuple[str, int]]] = [[] for _ in range(count)]
        for row in records:
            by_partition[partition_for(row["trace_id"].encode(), count, partitioner)].append(
                (row["trace_id"], row["revision"])
            )
        folder = f"{generation_prefix(ref, generation)}holdings/{partitioner}-{count}/"
        described_holdings = []
        for partition, entries in enumerate(by_partition):
            data = encode_holdings(entries)
            key = f"{folder}{partition:05d}-{_sha(data)[:16]}.json.gz"
            await store.put(key, data)
            described_holdings.append(
                {"partition": partition} | _described(ref, key, data, len(entries), "gzip")
            )
        holdings = {"partitioner": partitioner, "partitions": count, "parts": described_holdings}
    compaction = Compaction(
        generation=generation,
        positions=dict(sorted(positions.items())),
        parts=parts,
        records=len(records),
        schema_version=SCHEMA_VERSION,
        created_at=created_at,
        writer=writer,
        tombstones=tombstones,
        holdings=holdings,
    )
    try:
        await store.put_if_absent(
            ref.compaction_key(generation),
            dumps(compaction.model_dump(mode="json", exclude_none=True)),
        )
    except ObjectExistsError:
        return None
    touched = {row["trace_id"] for _, rows in new for row in rows}
    return compaction, latest.current(touched)
