"""Corpora in object storage: names, layout, commits and chains (docs/concepts/corpora.md).

A *corpus* is a named continuous export ``(reward source, format, filter)`` of one
org/project. Under the store root::

    <org>/<project>/<corpus>/data/<topic>-<partition>/<from_offset:020d>-<sha256[:16]>.jsonl[.gz]
    <org>/<project>/<corpus>/_manifest/<topic>-<partition>/<from_offset:020d>.json
    <org>/<project>/<corpus>/_compacted/<generation:020d>/part-<n:05d>-<sha256[:16]>.jsonl[.gz]
    <org>/<project>/<corpus>/_compacted/<generation:020d>/tombstones-<sha256[:16]>.jsonl.gz
    <org>/<project>/<corpus>/_compacted/<generation:020d>/holdings/<partitioner>-<partitions>/<p:05d>-<sha256[:16]>.json.gz
    <org>/<project>/<corpus>/_compacted/<generation:020d>/_compaction.json

Per corpus and ``<topic>-<partition>`` the commits form a *chain*: a commit covers
``from_offset`` .. ``last_offset`` (inclusive) of the topic, the first commit starts at 0, and
each next one starts at the previous ``last_offset + 1``. A commit is created only after its
data object, with create-only semantics, so whoever creates ``<from_offset>.json`` first wins.

What a corpus holds per trace, as its chain writers rebuild it:
:mod:`rl_export.corpora.chainstate`.
"""

from __future__ import annotations

import asyncio
import builtins
import gzip
import hashlib
import logging
import zlib
from collections.abc import AsyncIterator, Iterable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from rl_export.common.codec import dumps, dumps_lines, iter_lines, loads
from rl_export.common.errors import ObjectNotFoundError, StoreError
from rl_export.corpora.store import ObjectStore

log = logging.getLogger(__name__)

SCHEMA_VERSION = 3
"""The record schema of the objects this code writes. 2: records carry ``labels``. A compaction
copies the records it keeps as they were written, so it may hold records of version 1, which
lack ``labels``: readers treat a missing ``labels`` as unknown."""
OFFSET_WIDTH = 20
Compression = Literal["none", "gzip"]


# --- layout ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class CorpusRef:
    """Which corpus: ``<org>/<project>/<corpus>``."""

    org: str
    project: str
    corpus: str

    @property
    def root(self) -> str:
        return f"{self.org}/{self.project}/{self.corpus}"

    def stream(self, topic: str, partition: int) -> str:
        return f"{topic}-{partition}"

    def manifest_root(self) -> str:
        return f"{self.root}/_manifest/"

    def manifest_prefix(self, stream: str) -> str:
        return f"{self.root}/_manifest/{stream}/"

    def manifest_key(self, stream: str, from_offset: int) -> str:
        return f"{self.manifest_prefix(stream)}{from_offset:0{OFFSET_WIDTH}d}.json"

    def data_key(self, stream: str, from_offset: int, sha256: str, compression: Compression) -> str:
        suffix = ".jsonl.gz" if compression == "gzip" else ".jsonl"
        return f"{self.root}/data/{stream}/{from_offset:0{OFFSET_WIDTH}d}-{sha256[:16]}{suffix}"

    def compacted_prefix(self) -> str:
        return f"{self.root}/_compacted/"

    def compaction_key(self, generation: int) -> str:
        return f"{self.compacted_prefix()}{generation:0{OFFSET_WIDTH}d}/_compaction.json"

    def key(self, relative: str) -> str:
        """The store key of a path relative to the corpus folder (a commit's ``shard``)."""
        return f"{self.root}/{relative}"

    def relative(self, key: str) -> str:
        return key.removeprefix(self.root + "/")


def parse_stream(stream: str) -> tuple[str, int]:
    """Split ``<topic>-<partition>``."""
    topic, _, partition = stream.rpartition("-")
    return topic, int(partition)


async def list_corpora(store: ObjectStore, prefix: str = "") -> list[CorpusRef]:
    """Every corpus with at least one commit or compaction under ``prefix``."""
    found = set()
    for key in await store.list(prefix):
        parts = key.split("/")
        if len(parts) >= 5 and parts[3] in ("_manifest", "_compacted"):
            found.add(CorpusRef(parts[0], parts[1], parts[2]))
    return sorted(found, key=lambda r: r.root)


# --- commits --------------------------------------------------------------------------------


SIDECAR_VERSION = "1"
SIDECAR_SUFFIX = ".index.parquet"


class SidecarRef(BaseModel):
    """Where a commit's (or compaction part's) sidecar is and what it must be."""

    model_config = ConfigDict(frozen=True, extra="allow")

    key: str  # relative to the corpus folder, as a commit's ``shard``
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$")
    bytes: int = Field(ge=0)
    rows: int = Field(ge=0)
    version: str = SIDECAR_VERSION


def sidecar_key(data_key: str) -> str:
    """The sidecar's name beside its object's: ``<name>.jsonl`` -> ``<name>.index.parquet``."""
    return data_key.removesuffix(".gz").removesuffix(".jsonl") + SIDECAR_SUFFIX


class Commit(BaseModel):
    """One link of a chain: a shard covering ``from_offset`` .. ``last_offset``."""

    model_config = ConfigDict(frozen=True, extra="allow")

    topic: str
    partition: int = Field(ge=0)
    from_offset: int = Field(ge=0)
    last_offset: int = Field(ge=0)
    shard: str
    records: int = Field(ge=0)
    bytes: int = Field(ge=0)
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$")
    compression: Compression
    schema_version: int
    min_updated_at: str | None
    max_updated_at: str | None
    writer: str
    created_at: str
    index: SidecarRef | None = None  # the shard's index sidecar (rl_export.corpora.sidecar)

    @model_validator(mode="after")
    def _ordered(self) -> Commit:
        if self.last_offset < self.from_offset:
            raise ValueError(f"last_offset {self.last_offset} < from_offset {self.from_offset}")
        return self

    @property
    def stream(self) -> str:
        return f"{self.topic}-{self.partition}"

    def to_json(self) -> builtins.bytes:
        """The commit object's bytes (no ``index`` key when it has no sidecar)."""
        return dumps(self.model_dump(mode="json", exclude={"index"} if self.index is None
                                     else None))  # fmt: skip


@dataclass(frozen=True)
class Shard:
    """A shard's bytes, ready to store, with what its commit says about them."""

    data: bytes
    records: int
    sha256: str
    compression: Compression
    min_updated_at: str | None
    max_updated_at: str | None


def encode_shard(records: Iterable[dict[str, Any]], compression: Compression) -> Shard:
    """JSON Lines (gzip with mtime=0, so a retry is byte-identical), hashed as stored."""
    rows = list(records)
    stamps = [r["updated_at"] for r in rows if r.get("updated_at")]
    return _shard(dumps_lines(rows), len(rows), stamps, compression)


def encode_lines(lines: list[bytes], stamps: list[str], compression: Compression) -> Shard:
    """:func:`encode_shard` of records already encoded as JSON Lines lines.

    ``stamps`` are the records' ``updated_at`` values (tombstones have none).
    """
    return _shard(b"".join(lines), len(lines), stamps, compression)


def _shard(data: bytes, records: int, stamps: list[str], compression: Compression) -> Shard:
    if compression == "gzip":
        data = gzip.compress(data, compresslevel=6, mtime=0)
    return Shard(
        data=data,
        records=records,
        sha256=hashlib.sha256(data).hexdigest(),
        compression=compression,
        min_updated_at=min(stamps) if stamps else None,
        max_updated_at=max(stamps) if stamps else None,
    )


def decode_shard(data: bytes, compression: Compression) -> list[dict[str, Any]]:
    raw = gzip.decompress(data) if compression == "gzip" else data
    return list(iter_lines(raw))


@dataclass(frozen=True)
class Part:
    """One object of the view: a compaction part or a commit's shard."""

    key: str
    sha256: str
    records: int
    compression: Compression
    bytes: int | None = None  # stored size, where the commit or compaction says
    index: SidecarRef | None = None  # its index sidecar, key relative to the corpus


def commit_part(ref: CorpusRef, commit: Commit) -> Part:
    """A commit's shard as a :class:`Part`."""
    return Part(ref.key(commit.shard), commit.sha256, commit.records, commit.compression,
                commit.bytes, commit.index)  # fmt: skip


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


READ_CHUNK = 4 << 20
"""Bytes per read when an object is streamed (fewer thread hand-offs than the store's 1 MiB)."""


Block = tuple[bytes, int, int]
"""``(data, start, end)``: ``data[start:end]`` is whole lines, each ending with a newline."""


async def object_blocks(
    store: ObjectStore, part: Part, *, verify: bool = True
) -> AsyncIterator[Block]:
    """One object as blocks of whole lines, without copying what was read: each chunk is
    yielded in place (a block is a range of it), and only a line cut by a chunk's end is
    put together on its own.

    With ``verify`` the sha256 is checked when the object ends (ChainError); the caller
    checks the line count (:func:`check_count`), as it counts lines anyway. Without it the
    bytes are read as they are: for an object this process verified earlier (objects are
    named by their content and never rewritten).
    """
    digest = hashlib.sha256() if verify else None
    inflate = zlib.decompressobj(wbits=31) if part.compression == "gzip" else None
    rest = b""
    # Hashing runs in a thread (hashlib lets go of the GIL) while the caller works on the
    # chunk: on two cores the check costs almost no time. One update at a time, in order.
    # run_in_executor hands the work to the thread at once (a task made of to_thread would
    # start only when the caller next awaits, after it is done with the chunk).
    hashing: asyncio.Future[None] | None = None
    loop = asyncio.get_running_loop()
    try:
        async for chunk in store.chunks(part.key, READ_CHUNK):
            if digest is not None:
                if hashing is not None:
                    await hashing
                hashing = loop.run_in_executor(None, digest.update, chunk)
            data = inflate.decompress(chunk) if inflate is not None else chunk
            if not data:
                continue
            start = 0
            if rest:
                first = data.find(b"\n")
                if first < 0:
                    rest += data
                    continue
                joined = rest + data[: first + 1]
                yield joined, 0, len(joined)
                start = first + 1
            cut = data.rfind(b"\n") + 1
            if cut > start:
                yield data, start, cut
            rest = data[max(cut, start) :]
    except ObjectNotFoundError:
        raise ChainError(f"{part.key}: missing (expired while reading?)") from None
    except zlib.error as exc:
        raise ChainError(f"{part.key}: unreadable gzip ({exc})") from None
    finally:
        if hashing is not None:
            await hashing
    if inflate is not None:
        rest += inflate.flush()
    if rest:
        raise ChainError(f"{part.key}: does not end with a newline")
    if digest is not None and digest.hexdigest() != part.sha256:
        raise ChainError(f"{part.key}: sha256 {digest.hexdigest()[:16]}… does not match")


def check_count(part: Part, count: int) -> None:
    """ChainError when an object did not have the lines its commit says."""
    if count != part.records:
        raise ChainError(f"{part.key}: {count} records, {part.records} expected")


def block_lines(block: Block) -> list[bytes]:
    """The lines of a block, newline included."""
    data, start, end = block
    lines = data[start:end].split(b"\n")
    lines.pop()  # after the last newline
    return [line + b"\n" for line in lines]


def utc_now() -> str:
    return datetime.now(UTC).isoformat().replace("+00:00", "Z")


class ChainError(StoreError):
    """A commit or its shard is missing, unreadable or does not match."""


async def read_commit(store: ObjectStore, key: str) -> Commit:
    try:
        return Commit.model_validate(loads(await store.get(key)))
    except ObjectNotFoundError:
        raise
    except (ValueError, TypeError) as exc:
        raise ChainError(f"{key}: unreadable commit ({exc})") from None


async def read_shard(store: ObjectStore, ref: CorpusRef, commit: Commit) -> list[dict[str, Any]]:
    """Fetch a commit's shard, check its checksum and count, and parse it."""
    key = ref.key(commit.shard)
    data = await store.get(key)
    digest = hashlib.sha256(data).hexdigest()
    if digest != commit.sha256:
        raise ChainError(f"{key}: sha256 {digest[:16]}… does not match its commit")
    try:
        rows = decode_shard(data, commit.compression)
    except (ValueError, OSError, EOFError) as exc:
        raise ChainError(f"{key}: unreadable shard ({exc})") from None
    if len(rows) != commit.records:
        raise ChainError(f"{key}: {len(rows)} records, its commit says {commit.records}")
    return rows


async def chain_keys(
    store: ObjectStore, ref: CorpusRef, stream: str, start: int = 0
) -> list[tuple[int, str]]:
    """The commit keys of one chain from ``start`` on, as (from_offset, key), in offset order."""
    out = []
    prefix = ref.manifest_prefix(stream)
    after = ref.manifest_key(stream, start - 1) if start > 0 else ""
    for key in await store.list(prefix, after):
        name = key[len(prefix) :]
        if name.endswith(".json") and name[:-5].isdigit():
            out.append((int(name[:-5]), key))
    return sorted(out)


async def follow_chain(
    store: ObjectStore, ref: CorpusRef, stream: str, start: int, concurrency: int = 16
) -> list[Commit]:
    """The commits of a chain from ``start`` on, following from_offset -> last_offset + 1.

    Stops at the first gap (a later commit that does not continue the chain is not read).
    The commits after ``start`` are fetched concurrently, then followed.
    """
    keys = await chain_keys(store, ref, stream, start)
    gate = asyncio.Semaphore(concurrency)

    async def read(key: str) -> Commit | None:
        async with gate:
            try:
                return await read_commit(store, key)
            except ObjectNotFoundError:  # expired while we listed
                return None

    fetched = await asyncio.gather(*(read(key) for _, key in keys))
    by_offset = {offset: c for (offset, _), c in zip(keys, fetched, strict=True)}
    commits = []
    position = start
    while (commit := by_offset.get(position)) is not None:
        commits.append(commit)
        position = commit.last_offset + 1
    return commits


# --- compactions ----------------------------------------------------------------------------


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


async def read_chain(
    store: ObjectStore, ref: CorpusRef, stream: str, start: int, concurrency: int = 16
) -> list[tuple[Commit, list[dict[str, Any]]]]:
    """The commits of a chain from ``start`` on and their shards, fetched concurrently."""
    commits = await follow_chain(store, ref, stream, start, concurrency)
    gate = asyncio.Semaphore(concurrency)

    async def shard(commit: Commit) -> list[dict[str, Any]]:
        async with gate:
            return await read_shard(store, ref, commit)

    shards = await asyncio.gather(*(shard(c) for c in commits))
    return list(zip(commits, shards, strict=True))
