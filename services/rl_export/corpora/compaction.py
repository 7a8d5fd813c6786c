"""Compaction: the latest revision per trace, with the chain positions it covers
(docs/concepts/corpora.md).

How a generation is made (:func:`compact`):

1. Read the latest compaction (generation ``g``; none means ``g = 0`` and empty positions).
2. For every chain of the corpus, follow the commits from the base position and read their
   shards (checksums verified), one commit at a time. A later revision of a trace replaces an
   earlier one; on equal revisions the one read later wins (the base's records are read
   first, then the tombstones it keeps, then the chains); a tombstone hides the trace, and
   so does the project's erasure log (:mod:`rl_export.corpora.erasures`: a deleted trace,
   whichever chain its records are on, and whatever was written while a writer did not know
   of the deletion). Of the new lines only the winners' revisions and places stay in memory,
   their bytes in a spill file (:class:`~rl_export.corpora.compactmerge.Winners`).
3. Nothing new since the base: stop, no new generation.
4. Write the surviving records, sorted by ``trace_id``, as part objects under
   ``_compacted/<g+1>/``, named by content hash so two compactors never overwrite each
   other's parts (gzip with ``mtime=0``, so a retry writes the same bytes): the base's parts,
   already sorted, are read line by line and merged with the sorted winners, and each part is
   stored as soon as it holds ``max_part_records``
   (:class:`~rl_export.corpora.compactmerge.Walk`). Memory is bounded by a part and an index
   of a few hundred bytes per new trace, not by the corpus. Beside the parts, for the writers
   (:func:`rl_export.corpora.chainstate.load_chain_state`): the tombstones younger than the
   tombstone retention (the parts leave deletions out; a writer must still know them, or an
   older revision written later on another chain would bring the trace back), and, when the
   partitioning is given, a holdings index per partition (the parts' trace ids and
   revisions), so a writer starting up reads its partition's index, not the parts.
5. Create ``_compacted/<g+1>/_compaction.json`` create-only. Whoever creates it first wins;
   a loser leaves the winner alone, and its parts are harmless leftovers.
6. With a :class:`~rl_export.corpora.table.TableSync`, the winner brings the corpus's open
   table (``_table/``, Delta Lake) to the new generation (:mod:`rl_export.corpora.table`): a
   MERGE of the traces that changed since the base; when their bytes pass
   :data:`~rl_export.corpora.table.MERGE_BYTES`, an overwrite of the table from the new
   generation's parts (kept as local files until then), streamed in batches.

The spill file and the part files are in a folder of the system's temporary directory
(``TMPDIR``), removed when compaction ends, also on an error: it needs about the new lines'
bytes and, with a table, the generation's.

:func:`expire` removes what no reader starting from one of the newest compactions needs:
data objects, then commits, covered by an old enough compaction, then the folders of
generations older than the kept ones; never what a pinned version
(:mod:`rl_export.corpora.versions`) needs: its generation's folder and every commit from that
generation's positions on.
"""

from __future__ import annotations

import asyncio
import gzip
import hashlib
import itertools
import shutil
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from rl_export.corpora.commits import (
    ChainError,
    chain_keys,
    check_lines,
    iter_chain_lines,
    object_blocks,
    read_commit,
)
from rl_export.corpora.compacted import (
    Compaction,
    compaction_part,
    encode_holdings,
    latest_compaction,
    read_tombstones,
)
from rl_export.corpora.compactmerge import PartFile, Walk, Winners, read_part_files
from rl_export.corpora.erasures import erased_traces
from rl_export.corpora.layout import (
    OFFSET_WIDTH,
    SCHEMA_VERSION,
    Compression,
    CorpusRef,
    list_corpora,
    utc_now,
)
from rl_export.corpora.store import ObjectStore
from rl_export.corpora.table import TableSync, locate, read_generation
from rl_export.corpora.versions import list_versions
from rl_export.model.codec import dumps, loads
from rl_export.model.errors import ObjectExistsError, ObjectNotFoundError
from rl_export.model.partitioning import Partitioner

# --- layout helpers -------------------------------------------------------------------------


def generation_prefix(ref: CorpusRef, generation: int) -> str:
    return f"{ref.compacted_prefix()}{generation:0{OFFSET_WIDTH}d}/"


def part_key(ref: CorpusRef, generation: int, n: int, sha256: str, compression: Compression) -> str:
    suffix = ".jsonl.gz" if compression == "gzip" else ".jsonl"
    return f"{generation_prefix(ref, generation)}part-{n:05d}-{sha256[:16]}{suffix}"


async def _generation_folders(store: ObjectStore, ref: CorpusRef) -> dict[int, list[str]]:
    """Every ``_compacted/<generation>/`` folder and its keys."""
    prefix = ref.compacted_prefix()
    folders: dict[int, list[str]] = {}
    for key in await store.list(prefix):
        head = key[len(prefix) :].split("/", 1)[0]
        if head.isdigit():
            folders.setdefault(int(head), []).append(key)
    return folders


async def _compactions(
    store: ObjectStore, ref: CorpusRef, folders: dict[int, list[str]]
) -> list[Compaction]:
    """Every readable compaction of a corpus, oldest first."""
    out = []
    for generation, keys in sorted(folders.items()):
        key = ref.compaction_key(generation)
        if key not in keys:
            continue
        try:
            out.append(Compaction.model_validate(loads(await store.get(key))))
        except (ObjectNotFoundError, ValueError):
            continue
    return out


async def _streams(store: ObjectStore, ref: CorpusRef) -> list[str]:
    prefix = f"{ref.root}/_manifest/"
    return sorted({key[len(prefix) :].split("/", 1)[0] for key in await store.list(prefix)})


def _timestamp(created_at: str) -> float:
    return datetime.fromisoformat(created_at).timestamp()


# --- compaction -----------------------------------------------------------------------------


async def compact(
    store: ObjectStore,
    ref: CorpusRef,
    *,
    writer: str,
    compression: Compression = "none",
    max_part_records: int = 100_000,
    partitioning: tuple[Partitioner, int] | None = None,
    tombstone_retention_s: float = 7 * 86400.0,
    now: float | None = None,
    sidecars: bool = True,
    min_commits: int = 1,
    table: TableSync | None = None,
) -> Compaction | None:
    """Write the next generation of a corpus; None when nothing is new or another won.

    ``partitioning`` (partitioner, partition count: the sink's) adds the holdings index;
    ``sidecars`` an index sidecar beside each uncompressed part (:mod:`.sidecar`);
    ``min_commits``: None too while the chains hold fewer commits after the base (counted
    from their listings, nothing read): a generation rewrites the whole corpus, about ten
    objects, which a quiet corpus's few new lines do not pay for; ``table``: keep the
    corpus's open table (step 6; ``table.written`` says what was written).
    """
    # 1. The base: the latest readable compaction.
    folders = await _generation_folders(store, ref)
    base = await latest_compaction(store, ref)
    positions: dict[str, int] = dict(base.positions) if base else {}
    streams = await _streams(store, ref)
    if min_commits > 1:
        tail = 0
        for stream in streams:
            tail += len(await chain_keys(store, ref, stream, positions.get(stream, 0)))
        if tail < min_commits:
            return None
    if max_part_records < 1:
        raise ValueError(f"max_part_records must be at least 1, got {max_part_records}")

    folder = tempfile.mkdtemp(prefix="rl-export-compaction-")
    try:
        return await _compact(
            store, ref, folder, base=base, folders=folders, positions=positions,
            streams=streams, writer=writer,
            compression=compression, max_part_records=max_part_records,
            partitioning=partitioning, tombstone_retention_s=tombstone_retention_s, now=now,
            sidecars=sidecars, table=table,
        )  # fmt: skip
    finally:
        await asyncio.to_thread(shutil.rmtree, folder, True)


async def _compact(
    store: ObjectStore,
    ref: CorpusRef,
    folder: str,
    *,
    base: Compaction | None,
    folders: dict[int, list[str]],
    positions: dict[str, int],
    streams: list[str],
    writer: str,
    compression: Compression,
    max_part_records: int,
    partitioning: tuple[Partitioner, int] | None,
    tombstone_retention_s: float,
    now: float | None,
    sidecars: bool,
    table: TableSync | None,
) -> Compaction | None:
    # 2. Every chain after the base, a commit at a time: the winners' bytes spilled to
    # ``folder``, an index of them kept (read before the base's records: when nothing is new,
    # those are never read). The CPU-bound steps run in a thread, so the worker's event loop
    # (its consumers' heartbeats, /healthz) keeps its turn while a large corpus is compacted.
    winners = Winners(folder)
    walker: ThreadPoolExecutor | None = None
    try:
        commits = 0
        for stream in streams:
            async for commit, data in iter_chain_lines(store, ref, stream,
                                                       positions.get(stream, 0)):  # fmt: skip
                where = ref.key(commit.shard)
                count = await asyncio.to_thread(winners.add_commit, commit, data, where)
                check_lines(ref, commit, count)
                positions[stream] = commit.last_offset + 1
                commits += 1

        # 3. Nothing new.
        if not commits:
            if table is not None and table.catch_up and base is not None:
                await _catch_up(store, ref, base, table, folder)
            return None
        if base is not None:
            await asyncio.to_thread(
                winners.add_base_tombstones, await read_tombstones(store, ref, base)
            )

        # A generation whose _compaction.json is unreadable still holds its name: skip past
        # it, or every later attempt would lose the create-only write to it.
        generation = max(
            (g for g, keys in folders.items() if ref.compaction_key(g) in keys), default=0
        )
        generation = max(generation, base.generation if base else 0) + 1

        # 4. Parts first (the base's records merged with the winners, a part written as soon
        # as it is full), tombstones and holdings beside them ...
        touched, touched_bytes = winners.touched()
        rewrite = table is not None and table.rewrites(touched, touched_bytes)
        clock = time.time() if now is None else now
        parts: list[dict[str, Any]] = []
        files: list[Path] = []
        loop = asyncio.get_running_loop()

        async def upload(part: PartFile) -> None:
            parts.append(await _put_part(store, ref, generation, part, compression))
            files.append(part.path)
            if table is None:
                await asyncio.to_thread(part.path.unlink)

        def on_part(part: PartFile) -> None:
            """In the walk's thread: the part stored before the walk goes on (a long run of
            new traces between two base records makes many parts in one call)."""
            asyncio.run_coroutine_threadsafe(upload(part), loop).result()

        # The walk has a thread of its own: it waits there for the loop to store a part,
        # and storing one takes threads of the loop's pool (files, gzip), which a walk in
        # that pool could hold, the last of them on a loop with few (found by a test that
        # had left its session's loop one thread).
        walker = own = ThreadPoolExecutor(1, thread_name_prefix="rl-export-compaction")

        async def walking(step: Callable[..., Any], *args: Any) -> Any:
            return await loop.run_in_executor(own, step, *args)

        walk = Walk(
            winners, folder, max_part_records,
            erased=await erased_traces(store, ref.org, ref.project),
            since=_iso(clock - tombstone_retention_s),
            sidecars=sidecars and compression == "none", partitioning=partitioning,
            changes_wanted=table is not None, tombstones_only=rewrite, on_part=on_part,
        )  # fmt: skip
        if base is not None:
            for described in base.parts:
                part = compaction_part(ref, described)
                count = 0
                async for data, start, end in object_blocks(store, part):
                    count += await walking(walk.base_block, data, start, end, part.key)
                if count != described["records"]:
                    raise ChainError(
                        f"{part.key}: {count} records, its compaction says {described['records']}"
                    )
        await walking(walk.finish)
    finally:
        winners.close()
        if walker is not None:
            walker.shutdown(wait=False)

    tombstones = None
    if walk.tombstones:
        data = await asyncio.to_thread(
            gzip.compress, b"".join(walk.tombstones), compresslevel=6, mtime=0
        )
        key = f"{generation_prefix(ref, generation)}tombstones-{_sha(data)[:16]}.jsonl.gz"
        await store.put(key, data)
        tombstones = _described(ref, key, data, len(walk.tombstones), "gzip")
    holdings = None
    if partitioning is not None:
        holdings = await _write_holdings(store, ref, generation, walk.holdings, partitioning)

    # 5. ... then the create-only manifest of the generation.
    compaction = Compaction(
        generation=generation,
        positions=dict(sorted(positions.items())),
        parts=parts,
        records=walk.records,
        schema_version=SCHEMA_VERSION,
        created_at=utc_now(),
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

    # 6. The open table, from the traces the new lines touched (many: rewritten from the
    # generation's parts, which are still in ``folder``).
    if table is not None:
        await table.update(
            store, ref, applies_to=base.generation if base else 0, generation=generation,
            positions=compaction.positions, changes=walk.changes,
            records=lambda: read_part_files(files), fields=list(walk.fields), rewrite=rewrite,
        )  # fmt: skip
    return compaction


async def _put_part(
    store: ObjectStore, ref: CorpusRef, generation: int, part: PartFile, compression: Compression
) -> dict[str, Any]:
    """Store one part of the generation (and its sidecar); its entry in ``parts``."""
    if compression == "gzip":
        raw = await asyncio.to_thread(part.path.read_bytes)
        data = await asyncio.to_thread(gzip.compress, raw, compresslevel=6, mtime=0)
        del raw
        sha256 = _sha(data)
        key = part_key(ref, generation, part.n, sha256, compression)
        await store.put(key, data)
        size = len(data)
        del data
    else:
        sha256 = part.sha256
        key = part_key(ref, generation, part.n, sha256, compression)
        await store.put_file(key, part.path)
        size = sum(part.lengths)
    described: dict[str, Any] = {
        "shard": ref.relative(key),
        "records": part.records,
        "bytes": size,
        "sha256": sha256,
        "compression": compression,
    }
    if part.index is not None:
        from rl_export.corpora.sidecar import write_sidecar_from  # pyarrow: on use

        index = await write_sidecar_from(store, key, part.index, part.lengths, sha256,
                                         relative=ref.relative)  # fmt: skip
        if index is not None:
            described["index"] = index.model_dump(mode="json")
    return described


async def _catch_up(
    store: ObjectStore, ref: CorpusRef, base: Compaction, table: TableSync, folder: str
) -> None:
    """Nothing is new, but the table may be behind the latest generation: bring it there
    from the generation's records (a table that is there costs one read of its log). The
    parts are copied to ``folder`` first (checksums verified), then read from there."""
    location = await asyncio.to_thread(locate, store, ref)
    if location is None or await asyncio.to_thread(read_generation, location) == base.generation:
        return
    files = []
    for n, described in enumerate(base.parts):
        part = compaction_part(ref, described)
        path = Path(folder) / f"base-{n:05d}.jsonl"
        count = 0
        with path.open("wb") as f:
            async for data, start, end in object_blocks(store, part):
                count += data.count(b"\n", start, end)
                await asyncio.to_thread(f.write, data[start:end])
        if count != described["records"]:
            raise ChainError(
                f"{part.key}: {count} records, its compaction says {described['records']}"
            )
        files.append(path)
    await table.update(
        store, ref, applies_to=-1, generation=base.generation, positions=base.positions,
        changes=(), records=lambda: read_part_files(files),
    )  # fmt: skip


async def _write_holdings(
    store: ObjectStore,
    ref: CorpusRef,
    generation: int,
    by_partition: list[list[tuple[str, int]]],
    partitioning: tuple[Partitioner, int],
) -> dict[str, Any]:
    partitioner, count = partitioning
    folder = f"{generation_prefix(ref, generation)}holdings/{partitioner}-{count}/"
    described = []
    for partition, entries in enumerate(by_partition):
        data = encode_holdings(entries)
        key = f"{folder}{partition:05d}-{_sha(data)[:16]}.json.gz"
        await store.put(key, data)
        described.append(
            {"partition": partition} | _described(ref, key, data, len(entries), "gzip")
        )
    return {"partitioner": partitioner, "partitions": count, "parts": described}


def _described(
    ref: CorpusRef, key: str, data: bytes, records: int, compression: Compression
) -> dict[str, Any]:
    return {
        "shard": ref.relative(key),
        "records": records,
        "bytes": len(data),
        "sha256": _sha(data),
        "compression": compression,
    }


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _iso(at: float) -> str:
    return datetime.fromtimestamp(at, UTC).isoformat().replace("+00:00", "Z")


async def compact_all(
    store: ObjectStore,
    prefix: str = "",
    *,
    writer: str,
    compression: Compression = "none",
    max_part_records: int = 100_000,
    partitioning: tuple[Partitioner, int] | None = None,
    tombstone_retention_s: float = 7 * 86400.0,
    sidecars: bool = True,
    table: TableSync | None = None,
) -> list[Compaction]:
    """Compact every corpus under ``prefix``; the generations written."""
    written = []
    for ref in await list_corpora(store, prefix):
        compaction = await compact(
            store,
            ref,
            writer=writer,
            compression=compression,
            max_part_records=max_part_records,
            partitioning=partitioning,
            tombstone_retention_s=tombstone_retention_s,
            sidecars=sidecars,
            table=table,
        )
        if compaction is not None:
            written.append(compaction)
    return written


# --- expiry ---------------------------------------------------------------------------------


async def expire(
    store: ObjectStore,
    ref: CorpusRef,
    *,
    keep_generations: int = 2,
    retention_s: float,
    now: float,
) -> list[str]:
    """Delete what no reader starting from the newest ``keep_generations`` compactions needs.

    A commit (and its data) goes when a compaction older than the kept ones, created more
    than ``retention_s`` ago, covers it; never when it reaches the oldest kept generation's
    position. Data objects go before their commits, so a crash leaves a commit to retry from,
    never data that nothing names. A generation older than the kept ones goes (parts first,
    ``_compaction.json`` last) once the generation after it is older than ``retention_s``.
    A live version keeps its generation and the commits its view reads (from its
    generation's positions on; all of a chain when it has no generation).
    Returns the keys deleted, in order.
    """
    if keep_generations < 1:
        raise ValueError(f"keep_generations must be at least 1, got {keep_generations}")
    folders = await _generation_folders(store, ref)
    compactions = await _compactions(store, ref, folders)
    if len(compactions) <= keep_generations:
        return []
    kept = compactions[-keep_generations:]
    old = compactions[:-keep_generations]
    cutoff = now - retention_s
    deleted: list[str] = []

    # Per stream: the highest position an old enough compaction covers, capped at what the
    # oldest kept generations still need.
    bounds: dict[str, int] = {}
    for compaction in old:
        if _timestamp(compaction.created_at) > cutoff:
            continue
        for stream, position in compaction.positions.items():
            bounds[stream] = max(bounds.get(stream, 0), position)
    # What the versions read: the tail from their generation's positions, and the generation.
    by_generation = {c.generation: c for c in compactions}
    pinned: set[int] = set()
    floors: list[dict[str, int]] = []
    for version in await list_versions(store, ref):
        if version.generation is None:
            floors.append({})  # reads every chain from offset 0
            continue
        pinned.add(version.generation)
        base = by_generation.get(version.generation)
        floors.append({} if base is None else dict(base.positions))
    for stream, bound in list(bounds.items()):
        bounds[stream] = min(
            [bound, *(k.positions.get(stream, 0) for k in kept),
             *(floor.get(stream, 0) for floor in floors)]
        )  # fmt: skip

    for stream, bound in sorted(bounds.items()):
        covered = []
        for from_offset, key in await chain_keys(store, ref, stream):
            if from_offset >= bound:
                break
            try:
                commit = await read_commit(store, key)
            except ObjectNotFoundError:
                continue
            if commit.last_offset < bound:  # (a commit holding its lines has no data object)
                covered.append((from_offset, key, None if commit.inline is not None else (
                    ref.key(commit.shard))))  # fmt: skip
        if not covered:
            continue
        # Data first: the commit's shard, and any object a losing writer left at its offset
        # (that offset's commit is taken for good, so nothing can ever name those).
        starts = {f"{from_offset:0{OFFSET_WIDTH}d}-" for from_offset, _, _ in covered}
        leftovers = {
            key
            for key in await store.list(f"{ref.root}/data/{stream}/")
            if key.rsplit("/", 1)[-1][: OFFSET_WIDTH + 1] in starts
        }
        for key in sorted(leftovers | {shard for _, _, shard in covered if shard is not None}):
            await store.delete(key)
            deleted.append(key)
        for _, key, _ in covered:
            await store.delete(key)
            deleted.append(key)

    # Generations older than the kept ones, once their successor has aged past retention
    # (a reader who started from one had until then to finish reading it).
    # A folder without a readable _compaction.json below the kept ones is a losing or
    # crashed compactor's leftover, which no reader picks (a newer generation exists).
    ages = {
        c.generation: max(_timestamp(c.created_at), _timestamp(n.created_at))
        for c, n in itertools.pairwise(compactions)
    }
    for generation, keys in sorted(folders.items()):
        if generation >= kept[0].generation:
            break
        if generation in pinned:
            continue
        if ages.get(generation, cutoff) > cutoff:
            continue
        manifest = ref.compaction_key(generation)
        for key in [k for k in keys if k != manifest] + [k for k in keys if k == manifest]:
            await store.delete(key)
            deleted.append(key)
    return deleted
