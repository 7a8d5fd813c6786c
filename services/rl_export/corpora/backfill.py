"""Backfill: a corpus added later starts with the history of every trajectory that matches it.

Where history lives: the ``traces`` corpus holds every trace's latest snapshot (its records
have ``reward_source``, ``reward`` and ``passed`` null, but keep the rubric means, the label
count, the pass threshold and the evaluation's results, from which the join's rules give
the rewards again: :func:`~rl_export.stream.join.snapshot_from_record`), and compaction
keeps it for as long as the store does; ``trajectories`` keeps 7 days of snapshots, so it
cannot seed a corpus added later.

How a new corpus's chain is seeded (:func:`seed_chain`, called by the sink's
:class:`~rl_export.corpora.chain.ChainWriter` when it loads its chain; the steps match):

1. A chain is new when, loaded, its head is 0: no commit on this stream and no compaction
   position for it. Then read the seed corpus (``traces``) on the same stream: its latest
   compaction (only the traces of this partition) and its chain's commits after it, up to
   its head ``H``. ``H == 0`` means no history: nothing to do.
2. Pass 1: per trace, which object holds its latest line (revision; a tombstone wins an
   equal revision): an index of this partition's traces, no records.
3. Pass 2: each trace's latest live record becomes its snapshot, then this corpus's row
   (:meth:`CorpusSpec.record_for`, redacted as the spec asks: :meth:`CorpusSpec.scrub`): the
   row the corpus would hold had it existed from the start. What the corpus already holds
   goes through the writer's own keep rule (its compaction may hold rows of this partition
   from other chains).
4. One commit covering offsets ``0 .. H-1`` of the stream, data first, then create-only,
   with ``"backfill": {"from": <seed corpus>, "records": n}`` in it. A writer that loses
   the race reloads the winner's chain. After it, the writer goes on from ``H``: records at
   lower offsets are in the seed, and a revision the seed holds is a repeat. So every
   ``(trace_id, revision)`` is in the corpus once, and a crash before the commit leaves only
   an orphan data object: the next load seeds again.

The seed is one object (atomic: a crash never leaves half a seed in a chain); it holds this
partition's matching history, so its size is the corpus's size divided by the partitions.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

import orjson

from rl_export.corpora.chainstate import ChainState, load_chain_state
from rl_export.corpora.commits import (
    Commit,
    Part,
    block_lines,
    check_count,
    commit_part,
    encode_lines,
    follow_chain,
    object_blocks,
)
from rl_export.corpora.compacted import latest_compaction
from rl_export.corpora.identity import block_identities
from rl_export.corpora.layout import SCHEMA_VERSION, Compression, CorpusRef, parse_stream, utc_now
from rl_export.corpora.rubrics import RubricVersions
from rl_export.corpora.store import ObjectStore
from rl_export.formats.specs import CorpusSpec
from rl_export.model.codec import dumps_line
from rl_export.model.errors import ObjectExistsError
from rl_export.model.records import tombstone
from rl_export.runtime.metrics import SinkMetrics
from rl_export.stream.humans import record_versions
from rl_export.stream.join import snapshot_from_record

log = logging.getLogger(__name__)

Keep = Callable[[ChainState, str, int, bool], bool]
"""The writer's rule: (state, trace_id, revision, deleted) -> write it (and hold it)."""


async def _segments(
    store: ObjectStore, seed: CorpusRef, stream: str
) -> tuple[list[list[Part]], int, bool]:
    """The seed corpus's objects on a stream (the compaction's parts, then each commit's
    shard), the head ``H`` they reach, and whether the first segment is a compaction (which
    holds every partition's traces)."""
    compaction = await latest_compaction(store, seed)
    segments: list[list[Part]] = []
    position = 0
    if compaction is not None:
        position = compaction.positions.get(stream, 0)
        segments.append(
            [
                Part(seed.key(p["shard"]), p["sha256"], p["records"], p["compression"])
                for p in compaction.parts
            ]
        )
    for commit in await follow_chain(store, seed, stream, position):
        segments.append([commit_part(seed, commit)])
        position = commit.last_offset + 1
    return segments, position, compaction is not None


async def seed_chain(
    store: ObjectStore,
    ref: CorpusRef,
    spec: CorpusSpec,
    seed: CorpusRef,
    state: ChainState,
    *,
    stream: str,
    belongs: Callable[[str], bool],
    keep: Keep,
    compression: Compression,
    writer: str,
    metrics: SinkMetrics | None = None,
) -> ChainState:
    """Seed a new chain (``state.head == 0``) from the seed corpus; return its state."""
    if state.head != 0 or ref == seed:
        return state
    segments, head, compacted = await _segments(store, seed, stream)
    if head == 0:
        return state  # the seed corpus has no history on this stream either

    # 2. Where each trace's latest line is.
    latest: dict[str, tuple[int, bool, int]] = {}
    for number, parts in enumerate(segments):
        for part in parts:
            count = 0
            async for block in object_blocks(store, part):
                for trace_id, revision, deleted in block_identities(*block):
                    count += 1
                    if number == 0 and compacted and not belongs(trace_id):
                        continue  # another partition's trace
                    current = latest.get(trace_id)
                    if (
                        current is None
                        or revision > current[0]
                        or (revision == current[0] and deleted)
                    ):
                        latest[trace_id] = (revision, deleted, number)
            check_count(part, count)

    # 3. Each latest live record, as this corpus's row.
    rubrics = RubricVersions(store)
    lines: list[bytes] = []
    stamps: list[str] = []
    for number, parts in enumerate(segments):
        for part in parts:
            async for block in object_blocks(store, part, verify=False):  # verified above
                identities = block_identities(*block)
                for line, (trace_id, revision, deleted) in zip(
                    block_lines(block), identities, strict=True
                ):
                    if deleted or latest.get(trace_id) != (revision, False, number):
                        continue
                    record: dict[str, Any] = orjson.loads(line)
                    for version in record_versions(record):  # labels of rubric versions > 0
                        await rubrics.get(record["org"], record["project"], version)
                    snapshot = snapshot_from_record(record, rubrics.known)
                    row = spec.record_for(snapshot)
                    if not keep(state, trace_id, revision, row is None):
                        continue
                    if row is None:
                        lines.append(dumps_line(tombstone(snapshot, spec.source)))
                    else:
                        scrubbed, counts = spec.scrub(dumps_line(row))  # as the stream would
                        if metrics is not None:
                            for kind, n in counts.items():
                                metrics.redactions.labels(kind).inc(n)
                        lines.append(scrubbed)
                        stamps.append(record["updated_at"])
                    del latest[trace_id]  # once, even if a line repeats in a part

    # 4. One commit covering 0 .. H-1, data first, create-only.
    shard = encode_lines(lines, stamps, compression)
    topic, partition = parse_stream(stream)
    data_key = ref.data_key(stream, 0, shard.sha256, shard.compression)
    await store.put(data_key, shard.data)
    index = None
    if compression == "none" and spec.format == "trajectory":
        from rl_export.corpora.sidecar import line_rows, write_sidecar  # pyarrow: on use

        rows = await asyncio.to_thread(line_rows, lines)
        index = await write_sidecar(store, data_key, rows, [len(line) for line in lines],
                                    shard.sha256, relative=ref.relative)  # fmt: skip
    commit = Commit(
        topic=topic,
        partition=partition,
        from_offset=0,
        last_offset=head - 1,
        shard=ref.relative(data_key),
        records=shard.records,
        bytes=len(shard.data),
        sha256=shard.sha256,
        compression=shard.compression,
        schema_version=SCHEMA_VERSION,
        min_updated_at=shard.min_updated_at,
        max_updated_at=shard.max_updated_at,
        writer=writer,
        created_at=utc_now(),
        backfill={"from": seed.corpus, "records": shard.records},  # type: ignore[call-arg]
        index=index,
    )
    try:
        await store.put_if_absent(ref.manifest_key(stream, 0), commit.to_json())
    except ObjectExistsError:
        log.warning("%s %s: another writer started the chain first", ref.root, stream)
        return await load_chain_state(store, ref, stream, belongs=belongs)
    if metrics is not None:
        metrics.backfilled.labels(spec.name).inc(shard.records)
        metrics.commits.labels(spec.name).inc()
    log.info("%s %s: seeded with %d records from %s (offsets 0..%d)", ref.root, stream,
             shard.records, seed.root, head - 1)  # fmt: skip
    state.head = head
    return state
