"""The latest view of a corpus in bounded memory: the latest revision per trace from the latest
compaction plus the commits after it, tombstones dropped, as JSON Lines lines.

How a view is made (:class:`LatestView`; the steps match the code):

1. Find the latest compaction (its records are already the latest per trace, sorted by
   ``trace_id``) and, per chain, the commits after its position (the *tail*), following each
   chain as the reader does (a gap is a :class:`~rl_export.corpora.layout.ChainError`).
2. Index the tail: number its lines in read order and keep, per trace, the best line
   (greatest revision; on an equal revision a tombstone; else the first read, as the
   reader's latest view does) as ``trace_id -> one int`` (revision, tombstone flag and line
   number packed so that the best line is the greatest: :func:`_pack`). Only each line's
   head is read (:mod:`rl_export.corpora.identity`). Past ``spill_at`` traces the index is
   sorted and pickled to a temporary run file, and a new one starts, so memory holds at
   most ``spill_at`` entries whatever the corpus size.
3. Merge the compaction's identities (in ``trace_id`` order) with the runs (merged in
   ``trace_id`` order): a compaction line survives unless the tail has a later revision (or
   a tombstone of the same one); a tail line survives when it is its trace's best, live,
   and not older than the compaction's. Survivors are bits in two bitmaps (one bit a line).
4. :meth:`LatestView.blocks` reads the compaction and the tail again and passes the
   surviving lines on, verbatim, as views of what was read: compaction lines first (by
   ``trace_id``), then the tail's in chain order. An object whose lines all survive goes
   out whole; from others the runs of surviving lines are cut out.

Every object is read in 4 MiB chunks (:func:`~rl_export.corpora.layout.object_blocks`); in
steps 2 and 3 its sha256 (hashed in a thread, beside the work on the chunk) and line count
are checked when it ends, and a mismatch raises ChainError (an export then fails, and leaves
no file); step 4 does not hash again. Memory: the index (at most ``spill_at`` entries, one
str and one int each), one bit per line, a chunk or two.
"""

from __future__ import annotations

import heapq
import os
import pickle
import tempfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import IO

from rl_export.common.errors import NoDataError, ObjectNotFoundError
from rl_export.corpora.identity import Identity, NotARecordError, block_identities
from rl_export.corpora.layout import (
    Block,
    ChainError,
    Compaction,
    CorpusRef,
    Part,
    block_lines,
    chain_keys,
    check_count,
    latest_compaction,
    object_blocks,
    read_commit,
)
from rl_export.corpora.reader import list_streams
from rl_export.corpora.store import ObjectStore

SPILL_AT = 200_000


def _identities(part: Part, block: Block) -> Iterator[Identity]:
    try:
        yield from block_identities(*block)
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


_ROW_BITS = 40  # line numbers below 2**40
_ROW_MASK = (1 << _ROW_BITS) - 1


def _pack(revision: int, deleted: bool, row: int) -> int:
    """One int per index entry, ordered as the reader's rule orders lines: a greater
    revision wins, then a tombstone, then the line read first (the row is stored inverted)."""
    return (revision << (_ROW_BITS + 1)) | (deleted << _ROW_BITS) | (_ROW_MASK - row)


_RUN_CHUNK = 8192  # entries per pickled slice of a run


class _Runs:
    """Sorted runs of the tail index on disk, merged back in ``trace_id`` order.

    A run is the index sorted and pickled in slices (fast to write and to read back, and a
    reader holds one slice of each run); the merge compares packed entries, so the best
    line of a trace is simply the greatest value."""

    def __init__(self, directory: str | None) -> None:
        self.directory = directory
        self.files: list[IO[bytes]] = []

    def spill(self, index: dict[str, int]) -> None:
        fh = tempfile.TemporaryFile(dir=self.directory)  # noqa: SIM115 - closed in close()
        items = sorted(index.items())
        for start in range(0, len(items), _RUN_CHUNK):
            pickle.dump(items[start : start + _RUN_CHUNK], fh, protocol=pickle.HIGHEST_PROTOCOL)
        fh.seek(0)
        self.files.append(fh)

    @staticmethod
    def _read(fh: IO[bytes]) -> Iterator[tuple[str, int]]:
        fh.seek(0)
        while True:
            try:
                chunk: list[tuple[str, int]] = pickle.load(fh)
            except EOFError:
                return
            yield from chunk

    def merged(self, index: dict[str, int]) -> Iterator[tuple[str, int]]:
        """The best entry per trace over every run and ``index``, in ``trace_id`` order."""
        last = sorted(index.items())
        if not self.files:
            yield from last
            return
        streams = [self._read(fh) for fh in self.files]
        current: tuple[str, int] | None = None
        for entry in heapq.merge(*streams, last):
            if current is not None and entry[0] == current[0]:
                if entry[1] > current[1]:
                    current = entry
                continue
            if current is not None:
                yield current
            current = entry
        if current is not None:
            yield current

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

    async def _index(self, runs: _Runs) -> dict[str, int]:
        """Step 2."""
        index: dict[str, int] = {}
        get = index.get
        row = 0
        for part in self.tail:
            first = row
            async for block in object_blocks(self.store, part):
                for trace_id, revision, deleted in _identities(part, block):
                    packed = _pack(revision, deleted, row)
                    if packed > get(trace_id, -1):
                        index[trace_id] = packed
                    row += 1
                if len(index) >= self.spill_at:
                    runs.spill(index)
                    self.runs += 1
                    index = {}
            check_count(part, row - first)
        self.tail_lines = row
        return index

    async def _merge(self, merged: Iterator[tuple[str, int]]) -> None:
        """Step 3 (entries packed: see :func:`_pack`)."""
        keep_tail = bytearray((self.tail_lines + 7) // 8)
        records = self.compaction.records if self.compaction is not None else 0
        keep_compaction = bytearray((records + 7) // 8)
        shift, flag, mask = _ROW_BITS + 1, 1 << _ROW_BITS, _ROW_MASK

        def keep(packed: int) -> None:
            if not packed & flag:  # the best line is live: it survives
                row = mask - (packed & mask)
                keep_tail[row >> 3] |= 1 << (row & 7)

        best = next(merged, None)
        n = 0
        previous: str | None = None
        for part in self.compaction_parts:
            first = n
            async for block in object_blocks(self.store, part):
                for trace_id, revision, deleted in _identities(part, block):
                    if previous is not None and trace_id <= previous:
                        raise ChainError(f"{part.key}: compaction not sorted by trace_id")
                    previous = trace_id
                    while best is not None and best[0] < trace_id:
                        keep(best[1])
                        best = next(merged, None)
                    survives = not deleted
                    if best is not None and best[0] == trace_id:
                        tail_revision = best[1] >> shift
                        if tail_revision > revision or (
                            tail_revision == revision and best[1] & flag
                        ):
                            survives = False
                            keep(best[1])
                        best = next(merged, None)
                    if survives and n < records:
                        _set(keep_compaction, n)
                    n += 1
            check_count(part, n - first)
        if best is not None:
            keep(best[1])
        for _, packed in merged:  # the tail's traces after the compaction's last
            if not packed & flag:
                row = mask - (packed & mask)
                keep_tail[row >> 3] |= 1 << (row & 7)
        if n != records:
            raise ChainError(
                f"{self.ref.compaction_key(self.compaction.generation if self.compaction else 0)}"
                f": {n} records, it says {records}"
            )
        self._keep_compaction, self._keep_tail = keep_compaction, keep_tail

    async def blocks(self) -> AsyncIterator[tuple[memoryview, int]]:
        """Step 4: the surviving lines, as views of what was read (never copied), and how
        many lines each adds. An object whose lines all survive is passed on as it is read
        (its count comes with an empty view after it); in others the runs of surviving
        lines are cut out between line ends. Objects are not hashed again: steps 2 and 3
        verified each of them."""
        if not self._opened:
            await self.open()
        for parts, bits in ((self.compaction_parts, self._keep_compaction),
                            (self.tail, self._keep_tail)):  # fmt: skip
            n = 0
            for part in parts:
                whole = _all_set(bits, n, part.records)
                async for data, start, end in object_blocks(self.store, part, verify=False):
                    view = memoryview(data)
                    if whole:
                        yield view[start:end], 0
                        continue
                    find = data.find
                    run_start, kept = -1, 0
                    position = start
                    while position < end:
                        stop = find(b"\n", position, end) + 1
                        if bits[n >> 3] & (1 << (n & 7)):
                            if run_start < 0:
                                run_start = position
                            kept += 1
                        elif run_start >= 0:
                            yield view[run_start:position], kept
                            run_start, kept = -1, 0
                        n += 1
                        position = stop
                    if run_start >= 0:
                        yield view[run_start:end], kept
                if whole:
                    n += part.records
                    yield memoryview(b""), part.records

    async def lines(self) -> AsyncIterator[list[bytes]]:
        """Step 4, line by line: the surviving lines, newline included, in batches."""
        async for view, _ in self.blocks():
            if view:
                data = view.tobytes()
                yield block_lines((data, 0, len(data)))
