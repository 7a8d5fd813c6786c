"""The latest view of a corpus in bounded memory: the latest revision per trace from the latest
compaction plus the commits after it, tombstones dropped, as JSON Lines lines.

How a view is made (:class:`LatestView`; the steps match the code):

1. Find the latest compaction (its records are already the latest per trace, sorted by
   ``trace_id``) and, per chain, the commits after its position (the *tail*), following each
   chain as the reader does (a gap is a :class:`~rl_export.corpora.layout.ChainError`).
2. Index the tail: number its lines in read order and keep, per trace, the best line
   (greatest revision; on an equal revision a tombstone; else the first read, as the
   reader's latest view does) as ``trace_id -> (revision, deleted, line number)``. Only the
   line's head is read (:mod:`rl_export.corpora.identity`). Past ``spill_at`` traces the
   index is sorted and written to a temporary run file, and a new one starts, so memory
   holds at most ``spill_at`` entries whatever the corpus size.
3. Merge the compaction's identities (in ``trace_id`` order) with the runs (merged in
   ``trace_id`` order): a compaction line survives unless the tail has a later revision (or
   a tombstone of the same one); a tail line survives when it is its trace's best, live,
   and not older than the compaction's. Survivors are bits in two bitmaps (one bit a line).
4. :meth:`LatestView.lines` reads the compaction and the tail again and yields the surviving
   lines, verbatim: compaction lines first (by ``trace_id``), then the tail's in chain order.

Every object is read in chunks (:meth:`ObjectStore.chunks`), its sha256 and line count
checked when it ends; a mismatch raises ChainError (an export then fails, and leaves no
file). Memory: the index (at most ``spill_at`` entries), one bit per line, one chunk.
"""

from __future__ import annotations

import heapq
import itertools
import os
import tempfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import IO, NamedTuple

import orjson

from rl_export.common.errors import NoDataError, ObjectNotFoundError
from rl_export.corpora.identity import Identity, NotARecordError, block_identities
from rl_export.corpora.layout import (
    ChainError,
    Compaction,
    CorpusRef,
    Part,
    block_lines,
    chain_keys,
    latest_compaction,
    object_blocks,
    read_commit,
)
from rl_export.corpora.reader import list_streams
from rl_export.corpora.store import ObjectStore

SPILL_AT = 200_000


class _Entry(NamedTuple):
    trace_id: str
    revision: int
    deleted: bool
    row: int


def _identities(part: Part, block: bytes) -> Iterator[Identity]:
    try:
        yield from block_identities(block)
    except NotARecordError as exc:
        raise ChainError(f"{part.key}: {exc}") from None


def _all_set(bits: bytearray, start: int, count: int) -> bool:
    """Whether bits ``start`` .. ``start + count - 1`` are all set."""
    if count <= 0:
        return True
    end = start + count
    value = int.from_bytes(bits[start >> 3 : ((end - 1) >> 3) + 1], "little") >> (start & 7)
    mask = (1 << count) - 1
    return value & mask == mask


def _better(revision: int, deleted: bool, current: tuple[int, bool, int]) -> bool:
    """Whether a line read later replaces the best so far (the reader's rule)."""
    return revision > current[0] or (revision == current[0] and deleted and not current[1])


class _Runs:
    """Sorted runs of the tail index on disk, merged back in ``trace_id`` order."""

    def __init__(self, directory: str | None) -> None:
        self.directory = directory
        self.files: list[IO[bytes]] = []

    def spill(self, index: dict[str, tuple[int, bool, int]]) -> None:
        fh = tempfile.TemporaryFile(dir=self.directory)  # noqa: SIM115 - closed in close()
        fh.write(
            b"".join(orjson.dumps([t, r, d, n]) + b"\n" for t, (r, d, n) in sorted(index.items()))
        )
        fh.seek(0)
        self.files.append(fh)

    @staticmethod
    def _read(fh: IO[bytes]) -> Iterator[_Entry]:
        for line in fh:
            t, r, d, n = orjson.loads(line)
            yield _Entry(t, r, d, n)

    def merged(self, index: dict[str, tuple[int, bool, int]]) -> Iterator[_Entry]:
        """The best entry per trace over every run and ``index``, in ``trace_id`` order."""
        last = (_Entry(t, r, d, n) for t, (r, d, n) in sorted(index.items()))
        if not self.files:
            yield from last
            return
        for fh in self.files:
            fh.seek(0)
        streams = [self._read(fh) for fh in self.files]
        merged = heapq.merge(*streams, last, key=lambda e: e.trace_id)
        for _, group in itertools.groupby(merged, key=lambda e: e.trace_id):
            best = max(group, key=lambda e: (e.revision, e.deleted, -e.row))
            yield best

    def close(self) -> None:
        for fh in self.files:
            fh.close()
        self.files = []


def _set(bits: bytearray, n: int) -> None:
    bits[n >> 3] |= 1 << (n & 7)


def _popcount(bits: bytearray) -> int:
    return int.from_bytes(bits, "little").bit_count()


class LatestView:
    """The latest revision per trace of one corpus, tombstones dropped (see the module)."""

    def __init__(
        self,
        store: ObjectStore,
        ref: CorpusRef,
        *,
        spill_at: int = SPILL_AT,
        tmpdir: str | os.PathLike[str] | None = None,
    ) -> None:
        if spill_at < 1:
            raise ValueError(f"spill_at must be at least 1, got {spill_at}")
        self.store = store
        self.ref = ref
        self.spill_at = spill_at
        self.tmpdir = None if tmpdir is None else str(Path(tmpdir))
        self.compaction: Compaction | None = None
        self.compaction_parts: list[Part] = []
        self.tail: list[Part] = []
        self.tail_lines = 0
        self.runs = 0  # how many sorted runs the index spilled (for the benchmark)
        self._keep_compaction = bytearray()
        self._keep_tail = bytearray()
        self.total = 0  # lines the view yields
        self._opened = False

    async def exists(self) -> bool:
        """Whether the corpus has any commit or compaction."""
        return bool(await self.store.list(f"{self.ref.root}/_manifest/")) or bool(
            await self.store.list(self.ref.compacted_prefix())
        )

    async def open(self) -> LatestView:
        """Steps 1 to 3; raise NoDataError when the corpus has no data at all."""
        if self._opened:
            return self
        await self._find()
        if self.compaction is None and not self.tail and not await self.exists():
            raise NoDataError(
                "source",
                f"no data for {self.ref.root} in {self.store.url} (no corpus there: check "
                f"--org, --project and --source)",
            )
        runs = _Runs(self.tmpdir)
        try:
            index = await self._index(runs)
            await self._merge(runs.merged(index))
        finally:
            runs.close()
        self.total = _popcount(self._keep_compaction) + _popcount(self._keep_tail)
        self._opened = True
        return self

    async def _find(self) -> None:
        """Step 1."""
        self.compaction = await latest_compaction(self.store, self.ref)
        positions: dict[str, int] = {}
        if self.compaction is not None:
            positions = dict(self.compaction.positions)
            self.compaction_parts = [
                Part(self.ref.key(p["shard"]), p["sha256"], p["records"], p["compression"])
                for p in self.compaction.parts
            ]
        for stream in await list_streams(self.store, self.ref):
            by_offset = dict(await chain_keys(self.store, self.ref, stream))
            position = positions.get(stream, 0)
            while position in by_offset:
                try:
                    commit = await read_commit(self.store, by_offset[position])
                except ObjectNotFoundError:
                    raise ChainError(f"{by_offset[position]}: listed but gone") from None
                if commit.stream != stream or commit.from_offset != position:
                    raise ChainError(f"{by_offset[position]}: does not continue {stream}")
                self.tail.append(
                    Part(
                        self.ref.key(commit.shard), commit.sha256, commit.records,
                        commit.compression,
                    )
                )  # fmt: skip
                position = commit.last_offset + 1
            if any(offset > position for offset in by_offset):
                raise ChainError(
                    f"{self.ref.manifest_prefix(stream)}: no commit at offset {position} but "
                    f"later ones (a gap, or history the chain no longer holds)"
                )

    async def _index(self, runs: _Runs) -> dict[str, tuple[int, bool, int]]:
        """Step 2."""
        index: dict[str, tuple[int, bool, int]] = {}
        row = 0
        for part in self.tail:
            async for block, _ in object_blocks(self.store, part):
                for trace_id, revision, deleted in _identities(part, block):
                    current = index.get(trace_id)
                    if current is None or _better(revision, deleted, current):
                        index[trace_id] = (revision, deleted, row)
                    row += 1
                if len(index) >= self.spill_at:
                    runs.spill(index)
                    self.runs += 1
                    index = {}
        self.tail_lines = row
        return index

    async def _merge(self, winners: Iterator[_Entry]) -> None:
        """Step 3."""
        keep_tail = bytearray((self.tail_lines + 7) // 8)
        records = self.compaction.records if self.compaction is not None else 0
        keep_compaction = bytearray((records + 7) // 8)
        best = next(winners, None)
        n = 0
        previous: str | None = None
        for part in self.compaction_parts:
            async for block, _ in object_blocks(self.store, part):
                for trace_id, revision, deleted in _identities(part, block):
                    if previous is not None and trace_id <= previous:
                        raise ChainError(f"{part.key}: compaction not sorted by trace_id")
                    previous = trace_id
                    while best is not None and best.trace_id < trace_id:
                        if not best.deleted:
                            _set(keep_tail, best.row)
                        best = next(winners, None)
                    survives = not deleted
                    if best is not None and best.trace_id == trace_id:
                        if best.revision > revision or (best.revision == revision and best.deleted):
                            survives = False
                            if not best.deleted:
                                _set(keep_tail, best.row)
                        best = next(winners, None)
                    if survives and n < records:
                        _set(keep_compaction, n)
                    n += 1
        while best is not None:
            if not best.deleted:
                _set(keep_tail, best.row)
            best = next(winners, None)
        if n != records:
            raise ChainError(
                f"{self.ref.compaction_key(self.compaction.generation if self.compaction else 0)}"
                f": {n} records, it says {records}"
            )
        self._keep_compaction, self._keep_tail = keep_compaction, keep_tail

    async def blocks(self) -> AsyncIterator[tuple[bytes, int]]:
        """Step 4: the surviving lines as blocks of whole lines, with their counts. A block
        whose lines all survive is the object's block itself, never split into lines."""
        if not self._opened:
            await self.open()
        for parts, bits in ((self.compaction_parts, self._keep_compaction),
                            (self.tail, self._keep_tail)):  # fmt: skip
            n = 0
            for part in parts:
                async for block, count in object_blocks(self.store, part):
                    if _all_set(bits, n, count):
                        yield block, count
                    else:
                        out = []
                        for k, line in enumerate(block_lines(block), start=n):
                            if bits[k >> 3] & (1 << (k & 7)):
                                out.append(line)
                        if out:
                            yield b"".join(out), len(out)
                    n += count

    async def lines(self) -> AsyncIterator[list[bytes]]:
        """Step 4, line by line: the surviving lines, newline included, in batches."""
        async for block, _ in self.blocks():
            yield block_lines(block)
