"""Commits, the objects they name and the chains they form (docs/concepts/corpora.md).

Per corpus and ``<topic>-<partition>`` the commits form a *chain*: a commit covers
``from_offset`` .. ``last_offset`` (inclusive) of the topic, the first commit starts at 0, and
each next one starts at the previous ``last_offset + 1``. A commit is created only after its
data object, with create-only semantics, so whoever creates ``<from_offset>.json`` first wins.
A commit of few lines may hold them itself (``inline``: its shard's text, ``shard`` naming
the commit): one object written instead of two, which is what a quiet corpus's commits cost.

Here: the commit record and its sidecar reference, shards encoded and decoded, an object as
a :class:`Part` read in verified blocks, and chains listed, followed and read.
"""

from __future__ import annotations

import asyncio
import builtins
import gzip
import hashlib
import zlib
from collections.abc import AsyncIterator, Iterable
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_validator

from rl_export.corpora.layout import Compression, CorpusRef
from rl_export.corpora.store import ObjectStore
from rl_export.model.codec import dumps, dumps_lines, iter_lines, loads
from rl_export.model.errors import ObjectNotFoundError, StoreError

SIDECAR_VERSION = "2"  # 2: a label's time, comment, rubric version, kind and reward
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
    # Of ``records``, the lines of traces the corpus did not hold (the change feed's
    # new_records); None in commits written before it was counted.
    new_records: int | None = Field(default=None, ge=0)
    # The shard's lines themselves (UTF-8 JSON Lines, uncompressed), when the commit holds
    # them: ``shard`` is then the commit's own name and ``sha256`` that of these bytes.
    inline: str | None = None

    @model_validator(mode="after")
    def _ordered(self) -> Commit:
        if self.last_offset < self.from_offset:
            raise ValueError(f"last_offset {self.last_offset} < from_offset {self.from_offset}")
        return self

    @property
    def stream(self) -> str:
        return f"{self.topic}-{self.partition}"

    def to_json(self) -> builtins.bytes:
        """The commit object's bytes (no ``index`` or ``new_records`` key when unknown)."""
        absent = {k for k in ("index", "new_records", "inline") if getattr(self, k) is None}
        return dumps(self.model_dump(mode="json", exclude=absent or None))


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
    data: builtins.bytes | None = None  # its bytes, when its commit holds them (inline)


def commit_part(ref: CorpusRef, commit: Commit) -> Part:
    """A commit's shard as a :class:`Part` (its bytes with it when the commit holds them)."""
    data = None if commit.inline is None else commit.inline.encode()
    return Part(ref.key(commit.shard), commit.sha256, commit.records, commit.compression,
                commit.bytes, commit.index, data)  # fmt: skip


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
    if part.data is not None:  # a commit's own lines: in memory already
        if verify and hashlib.sha256(part.data).hexdigest() != part.sha256:
            raise ChainError(f"{part.key}: the lines it holds do not match its sha256")
        if part.data and not part.data.endswith(b"\n"):
            raise ChainError(f"{part.key}: does not end with a newline")
        if part.data:
            yield part.data, 0, len(part.data)
        return
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


class ChainError(StoreError):
    """A commit or its shard is missing, unreadable or does not match."""


async def read_commit(store: ObjectStore, key: str) -> Commit:
    try:
        return Commit.model_validate(loads(await store.get(key)))
    except ObjectNotFoundError:
        raise
    except (ValueError, TypeError) as exc:
        raise ChainError(f"{key}: unreadable commit ({exc})") from None


async def _verified(store: ObjectStore, ref: CorpusRef, commit: Commit) -> tuple[str, bytes]:
    """A commit's shard (its key and bytes as stored), its checksum checked."""
    key = ref.key(commit.shard)
    data = commit.inline.encode() if commit.inline is not None else await store.get(key)
    digest = hashlib.sha256(data).hexdigest()
    if digest != commit.sha256:
        raise ChainError(f"{key}: sha256 {digest[:16]}… does not match its commit")
    return key, data


async def read_shard(store: ObjectStore, ref: CorpusRef, commit: Commit) -> list[dict[str, Any]]:
    """Fetch a commit's shard, check its checksum and count, and parse it."""
    key, data = await _verified(store, ref, commit)
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


async def iter_chain_lines(
    store: ObjectStore, ref: CorpusRef, stream: str, start: int, concurrency: int = 8
) -> AsyncIterator[tuple[Commit, bytes]]:
    """:func:`read_chain` one commit at a time, unparsed: each commit and its shard's JSON
    Lines (checksum verified, decompressed), in chain order. At most ``concurrency`` shards
    are fetched ahead, so memory holds a few shards, not the chain. The caller parses the
    lines and checks their count against ``commit.records`` (:func:`check_lines`).
    """
    commits = await follow_chain(store, ref, stream, start)

    async def fetch(commit: Commit) -> bytes:
        key, data = await _verified(store, ref, commit)
        try:
            return gzip.decompress(data) if commit.compression == "gzip" else data
        except (OSError, EOFError) as exc:
            raise ChainError(f"{key}: unreadable shard ({exc})") from None

    for at in range(0, len(commits), concurrency):
        window = commits[at : at + concurrency]
        for commit, data in zip(window, await asyncio.gather(*map(fetch, window)), strict=True):
            yield commit, data


def check_lines(ref: CorpusRef, commit: Commit, count: int) -> None:
    """ChainError when a shard read by :func:`iter_chain_lines` had not ``commit.records``
    lines."""
    if count != commit.records:
        key = ref.key(commit.shard)
        raise ChainError(f"{key}: {count} records, its commit says {commit.records}")
