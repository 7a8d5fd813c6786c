"""What a compaction wrote (docs/concepts/corpora.md): its record, parts, tombstones and
holdings.

A generation ``_compacted/<generation:020d>/`` holds the latest revision per trace up to its
positions in parts sorted by ``trace_id``, the tombstones it keeps for writers, and per
partition a holdings index (trace ids and revisions); ``_compaction.json``, written last,
names them. The compactor that writes them is :mod:`rl_export.corpora.compaction`.
"""

from __future__ import annotations

import asyncio
import gzip
import hashlib
import logging
from collections.abc import Iterator
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from rl_export.corpora.commits import ChainError, Part, SidecarRef
from rl_export.corpora.layout import CorpusRef
from rl_export.corpora.store import ObjectStore
from rl_export.model.codec import dumps, iter_lines, loads
from rl_export.model.errors import ObjectNotFoundError

log = logging.getLogger(__name__)


def compaction_part(ref: CorpusRef, part: dict[str, Any]) -> Part:
    """One of a compaction's ``parts`` as a :class:`Part` (KeyError or TypeError when it lacks
    a field; a malformed sidecar reference is dropped, logged: the part is then read whole)."""
    found = part.get("index")
    index = None
    if found is not None:
        try:
            index = SidecarRef.model_validate(found)
        except ValueError:
            log.warning("a compaction part's index reference is malformed: %r", found)
    return Part(ref.key(part["shard"]), part["sha256"], part["records"],
                part.get("compression", "none"), part.get("bytes"), index)  # fmt: skip


class Compaction(BaseModel):
    """A generation of a corpus: the latest revision per trace up to ``positions``.

    ``parts`` hold the live records. ``tombstones`` (one object of tombstone rows, each
    with the ``deleted_at`` of the commit it came from) and ``holdings`` (per partition of
    the writers' partitioning: the trace ids and revisions of the parts) are for writers;
    generations written before them have neither.
    """

    model_config = ConfigDict(frozen=True, extra="allow")

    generation: int = Field(ge=1)
    positions: dict[str, int]  # "<topic>-<partition>" -> next from_offset after it
    parts: list[dict[str, Any]]  # [{shard, records, bytes, sha256, compression}]
    records: int = Field(ge=0)
    schema_version: int
    created_at: str
    writer: str
    tombstones: dict[str, Any] | None = None  # {shard, records, bytes, sha256, compression}
    holdings: dict[str, Any] | None = None  # {partitioner, partitions, parts: [{partition, ...}]}

    def holdings_part(self, partitioning: tuple[str, int] | None, partition: int) -> Any:
        """The holdings index part of ``partition`` if written for ``partitioning``."""
        if partitioning is None or self.holdings is None:
            return None
        partitioner, partitions = partitioning
        if (self.holdings.get("partitioner"), self.holdings.get("partitions")) != (
            partitioner, partitions,
        ):  # fmt: skip
            return None
        for part in self.holdings.get("parts", []):
            if part.get("partition") == partition:
                return part
        return None


async def latest_compaction(store: ObjectStore, ref: CorpusRef) -> Compaction | None:
    """The newest generation with a readable ``_compaction.json``, or None."""
    generations = set()
    prefix = ref.compacted_prefix()
    for key in await store.list(prefix):
        head = key[len(prefix) :].split("/", 1)[0]
        if head.isdigit() and key.endswith("/_compaction.json"):
            generations.add(int(head))
    for generation in sorted(generations, reverse=True):
        try:
            data = await store.get(ref.compaction_key(generation))
            return Compaction.model_validate(loads(data))
        except (ObjectNotFoundError, ValueError):
            continue
    return None


async def read_object(store: ObjectStore, ref: CorpusRef, part: dict[str, Any]) -> bytes:
    """A compaction object (``{shard, sha256, compression}``), checksum verified, decompressed."""
    key = ref.key(part["shard"])
    data = await store.get(key)
    if hashlib.sha256(data).hexdigest() != part["sha256"]:
        raise ChainError(f"{key}: sha256 does not match its compaction")
    try:
        return gzip.decompress(data) if part.get("compression") == "gzip" else data
    except (OSError, EOFError) as exc:
        raise ChainError(f"{key}: unreadable ({exc})") from None


async def read_compaction(
    store: ObjectStore, ref: CorpusRef, compaction: Compaction
) -> Iterator[dict[str, Any]]:
    """The records of a compaction, checksums verified."""
    rows: list[dict[str, Any]] = []
    for part in compaction.parts:
        key = ref.key(part["shard"])
        raw = await read_object(store, ref, part)
        try:  # a large part: parsed in a thread, the event loop keeps its turn
            part_rows = await asyncio.to_thread(_parse_lines, raw)
        except ValueError as exc:
            raise ChainError(f"{key}: unreadable compaction part ({exc})") from None
        if len(part_rows) != part["records"]:
            raise ChainError(
                f"{key}: {len(part_rows)} records, its compaction says {part['records']}"
            )
        rows.extend(part_rows)
    return iter(rows)


def _parse_lines(data: bytes) -> list[dict[str, Any]]:
    return list(iter_lines(data))


async def read_tombstones(
    store: ObjectStore, ref: CorpusRef, compaction: Compaction
) -> list[dict[str, Any]]:
    """The tombstones a compaction keeps (rows with ``deleted_at``); none if it has none."""
    if compaction.tombstones is None:
        return []
    try:
        return list(iter_lines(await read_object(store, ref, compaction.tombstones)))
    except ValueError as exc:
        raise ChainError(f"{compaction.tombstones['shard']}: unreadable ({exc})") from None


def encode_holdings(entries: list[tuple[str, int]]) -> bytes:
    """A holdings index part: the trace ids and revisions of one partition, gzipped JSON."""
    body = {"trace_id": [t for t, _ in entries], "revision": [r for _, r in entries]}
    return gzip.compress(dumps(body), compresslevel=6, mtime=0)


async def read_holdings(
    store: ObjectStore, ref: CorpusRef, part: dict[str, Any]
) -> tuple[list[str], list[int]]:
    """A holdings index part: (trace ids, revisions)."""
    try:
        body = loads(await read_object(store, ref, part))
        traces, revisions = body["trace_id"], body["revision"]
    except (ValueError, KeyError, TypeError) as exc:
        raise ChainError(f"{part.get('shard')}: unreadable holdings ({exc})") from None
    if len(traces) != len(revisions) or len(traces) != part.get("records"):
        raise ChainError(f"{part.get('shard')}: holdings do not match their compaction")
    return traces, revisions
