"""``rl-export shards ls|cat|tail``: look at the corpora in a store (``shards verify``, which
checks them, is :mod:`rl_export.corpora.verify`)."""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from typing import TypeVar

from rl_export.corpora.commits import ChainError, Commit, read_commit
from rl_export.corpora.compacted import latest_compaction
from rl_export.corpora.layout import CorpusRef
from rl_export.corpora.reader import CorpusReader, end_cursor, stream_order
from rl_export.corpora.store import ObjectStore
from rl_export.corpora.versions import Version
from rl_export.model.codec import dumps_line
from rl_export.model.errors import ObjectNotFoundError

_T = TypeVar("_T")
_R = TypeVar("_R")
_CORPUS_FOLDERS = ("data", "_manifest", "_compacted")
_COMMIT_NAME = re.compile(r"^(?P<stream>[^/]+)/(?P<offset>[0-9]+)\.json$")
DEFAULT_CONCURRENCY = 16  # store requests at once


# --- discovery ------------------------------------------------------------------------------


def group_by_corpus(keys: Iterable[str]) -> dict[CorpusRef, list[str]]:
    """Store keys by corpus (any corpus with a data, manifest or compaction object)."""
    out: dict[CorpusRef, list[str]] = {}
    for key in keys:
        parts = key.split("/")
        if len(parts) >= 5 and parts[3] in _CORPUS_FOLDERS:
            out.setdefault(CorpusRef(parts[0], parts[1], parts[2]), []).append(key)
    return dict(sorted(out.items(), key=lambda item: item[0].root))


async def bounded(
    items: Iterable[_T], fn: Callable[[_T], Awaitable[_R]], limit: int = DEFAULT_CONCURRENCY
) -> list[_R]:
    """``fn`` over ``items`` with at most ``limit`` at once; results in the items' order."""
    gate = asyncio.Semaphore(limit)

    async def one(item: _T) -> _R:
        async with gate:
            return await fn(item)

    return list(await asyncio.gather(*(one(item) for item in items)))


def parse_commit_key(ref: CorpusRef, key: str) -> tuple[str, int] | None:
    match = _COMMIT_NAME.match(key.removeprefix(f"{ref.root}/_manifest/"))
    if match is None:
        return None
    return match["stream"], int(match["offset"])


# --- ls, cat, tail --------------------------------------------------------------------------


async def ls(store: ObjectStore, prefix: str = "") -> list[str]:
    """One line per corpus and chain: commits, offsets, records, bytes, latest compaction.

    ``offsets`` is the lowest ``from_offset`` .. the highest ``last_offset`` (``verify``
    says whether the range has holes); commits that cannot be read are counted apart.
    """
    lines = []
    for ref, keys in group_by_corpus(await store.list(prefix)).items():
        compaction = await latest_compaction(store, ref)
        generation = str(compaction.generation) if compaction else "-"
        named = [(parsed, key) for key in keys if (parsed := parse_commit_key(ref, key))]

        async def read(key: str) -> Commit | None:
            try:
                return await read_commit(store, key)
            except (ChainError, ObjectNotFoundError):
                return None

        commits = await bounded([key for _, key in named], read)
        streams: dict[str, list[Commit | None]] = {}
        for ((stream, _), _), commit in zip(named, commits, strict=True):
            streams.setdefault(stream, []).append(commit)
        if not streams:
            lines.append(
                f"{ref.root} - commits=0 offsets=- records=0 bytes=0 compaction={generation}"
            )
        for stream in sorted(streams, key=stream_order):
            readable = [c for c in streams[stream] if c is not None]
            offsets = (
                f"{min(c.from_offset for c in readable)}..{max(c.last_offset for c in readable)}"
                if readable
                else "-"
            )
            line = (
                f"{ref.root} {stream} commits={len(streams[stream])} offsets={offsets} "
                f"records={sum(c.records for c in readable)} "
                f"bytes={sum(c.bytes for c in readable)} compaction={generation}"
            )
            if len(readable) < len(streams[stream]):
                line += f" unreadable={len(streams[stream]) - len(readable)}"
            lines.append(line)
    return lines


async def cat(
    store: ObjectStore, ref: CorpusRef, *, latest_only: bool = False,
    version: Version | None = None,
) -> AsyncIterator[bytes]:  # fmt: skip
    """The corpus as JSON Lines, from the latest compaction on (checksums verified); with
    ``version``, the version's records (its compaction, the chains to its ends, the traces
    deleted since left out)."""
    reader = CorpusReader(store, ref)
    async for record in reader.records(latest_only=latest_only, version=version):
        yield dumps_line(record)


async def tail(
    store: ObjectStore,
    ref: CorpusRef,
    *,
    stop: asyncio.Event,
    from_start: bool = False,
    poll_interval_s: float = 1.0,
) -> AsyncIterator[bytes]:
    """New records as JSON Lines until ``stop`` is set (``from_start``: everything first)."""
    reader = CorpusReader(store, ref, poll_interval_s=poll_interval_s)
    cursor = None if from_start else await end_cursor(store, ref)
    async for record in reader.follow(cursor, stop=stop):
        yield dumps_line(record)
