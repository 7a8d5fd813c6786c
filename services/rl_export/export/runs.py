"""The latest view's index on disk and in bits: packed entries, line bitmaps, sorted runs.

:class:`~rl_export.export.latest.LatestView` keeps, per trace of a corpus's tail, one packed
int (:func:`pack`: revision, tombstone flag and line number, ordered as the reader orders
lines) and one bit per line (kept or not). Past its memory bound it spills the index as a
sorted run (:class:`Runs`) and merges the runs back in key order; :class:`Cursor` reads the
merged entries by key range beside a compaction's sorted blocks. :func:`index_rows` fills the
index from lines' identities (:class:`Identities`), read from an object's sidecar or from its
bytes (:func:`block_identities`).
"""

from __future__ import annotations

import math
import pickle
import tempfile
from bisect import bisect_left, bisect_right
from collections.abc import Callable, Iterator
from itertools import chain
from operator import eq, itemgetter
from typing import IO, NamedTuple

from rl_export.corpora.commits import Block
from rl_export.corpora.identity import HEAD, TOMBSTONE_END, line_key

Entry = tuple[bytes, int]
"""An index entry: the key and the packed (revision, tombstone, line) of its best line."""


def all_set(bits: bytearray, start: int, count: int) -> bool:
    """Whether bits ``start`` .. ``start + count - 1`` are all set."""
    return bits_of(bits, start, count) == (1 << max(count, 0)) - 1


def bits_of(bits: bytearray, start: int, count: int) -> int:
    """Bits ``start`` .. ``start + count - 1`` of a bitmap, as an int (bit 0: ``start``)."""
    if count <= 0:
        return 0
    end = start + count
    value = int.from_bytes(bits[start >> 3 : ((end - 1) >> 3) + 1], "little") >> (start & 7)
    return value & ((1 << count) - 1)


ROW_BITS = 40  # line numbers below 2**40
ROW_MASK = (1 << ROW_BITS) - 1
SHIFT = ROW_BITS + 1
FLAG = 1 << ROW_BITS


def pack(revision: int, deleted: bool, row: int) -> int:
    """One int per index entry, ordered as the reader's rule orders lines: a greater
    revision wins, then a tombstone, then the line read first (the row is stored inverted)."""
    return (revision << SHIFT) | (deleted << ROW_BITS) | (ROW_MASK - row)


def row_of(packed: int) -> int:
    return ROW_MASK - (packed & ROW_MASK)


def ones(count: int) -> bytearray:
    """A bitmap of ``count`` set bits (the bits past them clear)."""
    bits = bytearray(b"\xff") * ((count + 7) // 8)
    if count & 7:
        bits[-1] = (1 << (count & 7)) - 1
    return bits


def set_bit(bits: bytearray, n: int) -> None:
    bits[n >> 3] |= 1 << (n & 7)


def clear_bit(bits: bytearray, n: int) -> None:
    bits[n >> 3] &= ~(1 << (n & 7))


def popcount(bits: bytearray) -> int:
    return int.from_bytes(bits, "little").bit_count()


SLICE = 8192  # entries per pickled slice of a run, at most
NO_KEY = (b"",)


class Runs:
    """Sorted runs of the tail index on disk, merged back in key order.

    A run is the index sorted and pickled in slices (fast to write and to read back, and the
    merge holds one slice of each run)."""

    def __init__(self, directory: str | None, slice_size: int = SLICE) -> None:
        self.directory = directory
        self.slice = slice_size
        self.files: list[IO[bytes]] = []

    def spill(self, index: dict[bytes, int]) -> None:
        fh = tempfile.TemporaryFile(dir=self.directory)  # noqa: SIM115 - closed in close()
        items = sorted(index.items())
        for start in range(0, len(items), self.slice):
            pickle.dump(items[start : start + self.slice], fh, protocol=pickle.HIGHEST_PROTOCOL)
        fh.seek(0)
        self.files.append(fh)

    @staticmethod
    def _read(fh: IO[bytes]) -> Iterator[list[Entry]]:
        fh.seek(0)
        while True:
            try:
                chunk: list[Entry] = pickle.load(fh)
            except EOFError:
                return
            if chunk:
                yield chunk

    def _slices(self, items: list[Entry]) -> Iterator[list[Entry]]:
        for start in range(0, len(items), self.slice):
            yield items[start : start + self.slice]

    def spans(self, index: dict[bytes, int], lose: Callable[[int], None]) -> Iterator[list[Entry]]:
        """The best entry per trace over every run and ``index``, in key order, as sorted
        lists; ``lose(packed)`` is called for every entry that loses to another run's.

        In batches: what every run holds up to the smallest last key of their current
        slices is sorted together (a sort of sorted runs: little more than a copy), so at
        least one slice is used up per batch; equal keys can only come from two runs."""
        sources = [self._read(fh) for fh in self.files]
        if index:
            sources.append(self._slices(sorted(index.items())))
        current: list[list[Entry]] = []
        at: list[int] = []
        feeds: list[Iterator[list[Entry]]] = []
        for source in sources:
            first = next(source, None)
            if first is not None:
                current.append(first)
                at.append(0)
                feeds.append(source)
        while current:
            if len(current) == 1:  # one run left: the rest of it as it is
                yield current[0][at[0] :]
                yield from feeds[0]
                return
            bound = (min(items[-1][0] for items in current), math.inf)
            parts = []
            for n, items in enumerate(current):
                end = bisect_right(items, bound, at[n])
                if end > at[n]:
                    parts.append(items[at[n] : end])
                    at[n] = end
            if len(parts) == 1:
                yield parts[0]
            else:
                batch = sorted(chain.from_iterable(parts))
                keys = list(map(itemgetter(0), batch))
                if any(map(eq, keys, keys[1:])):
                    batch = best_of(batch, lose)
                yield batch
            for n in range(len(current) - 1, -1, -1):  # refill the slices used up
                if at[n] == len(current[n]):
                    following = next(feeds[n], None)
                    if following is None:
                        del current[n], at[n], feeds[n]
                    else:
                        current[n], at[n] = following, 0

    def close(self) -> None:
        for fh in self.files:
            fh.close()
        self.files = []


def best_of(batch: list[Entry], lose: Callable[[int], None]) -> list[Entry]:
    """One entry per key of a sorted batch: the greatest (the last of its key)."""
    out: list[Entry] = []
    previous: Entry | None = None
    for entry in batch:
        if previous is not None:
            if entry[0] == previous[0]:
                lose(previous[1])
            else:
                out.append(previous)
        previous = entry
    if previous is not None:
        out.append(previous)
    return out


class Cursor:
    """Reads sorted spans of index entries forward, by key range."""

    def __init__(self, spans: Iterator[list[Entry]]) -> None:
        self.spans = spans
        self.items: list[Entry] = []
        self.at = 0
        self.done = False

    def _fill(self) -> bool:
        while self.at >= len(self.items):
            following = next(self.spans, None)
            if following is None:
                self.done = True
                return False
            self.items, self.at = following, 0
        return True

    def skip_below(self, key: bytes) -> None:
        """Pass over the entries with a key below ``key``."""
        while self._fill():
            if self.items[-1][0] < key:
                self.at = len(self.items)
                continue
            self.at = bisect_left(self.items, (key,), self.at)
            return

    def take_through(self, key: bytes) -> list[Entry]:
        """The entries from here with a key up to ``key`` (included)."""
        out: list[Entry] = []
        bound = (key, math.inf)
        while self._fill():
            end = bisect_right(self.items, bound, self.at)
            out.extend(self.items[self.at : end])
            self.at = end
            if end < len(self.items):
                break
        return out

    def drain(self) -> None:
        for _ in self.spans:
            pass


class Identities(NamedTuple):
    """An object's lines as its sidecar gives them: key (:func:`~rl_export.corpora.identity.
    key_of`), revision and tombstone flag, in line order."""

    keys: list[bytes]
    revisions: list[int]
    deleted: list[bool]


def index_rows(identities: Identities, row: int, index: dict[bytes, int],
                keep: bytearray) -> int:  # fmt: skip
    """Step 2 for lines whose identities were read (from a sidecar, or a block of the object:
    :func:`block_identities`), the first numbered ``row``: each into the index; a
    tombstone's bit, and the bit of a line that loses to another of its trace, cleared.
    Returns the next line's number. The hot loop of an export: kept to a few C calls."""
    keys, revisions, deleted = identities
    get = index.get
    shift, flag, mask = SHIFT, FLAG, ROW_MASK
    for key, revision, gone in zip(keys, revisions, deleted, strict=True):
        packed = (revision << shift) | (mask - row)
        if gone:
            packed |= flag
            keep[row >> 3] &= ~(1 << (row & 7))
        old = get(key)
        if old is None:
            index[key] = packed
        else:
            loser = old if packed > old else packed
            index[key] = packed if packed > old else old
            lost = mask - (loser & mask)
            keep[lost >> 3] &= ~(1 << (lost & 7))
        row += 1
    return row


def block_identities(block: Block) -> Identities:
    """Each line's key, revision and tombstone flag in one block of whole lines (:data:`HEAD`,
    else :func:`line_key`, which raises NotARecordError). A hot loop of an export without
    sidecars: kept to a few C calls a line."""
    data, start, end = block
    find, match, endswith = data.find, HEAD.match, data.endswith
    found = Identities([], [], [])
    add_key, add_revision, add_deleted = (found.keys.append, found.revisions.append,
                                          found.deleted.append)  # fmt: skip
    while start < end:
        stop = find(b"\n", start, end)
        head = match(data, start, stop)
        if head is not None:
            add_key(head[1])
            add_revision(int(head[2]))
            add_deleted(endswith(TOMBSTONE_END, start, stop))
        else:
            key, revision, deleted = line_key(data, start, stop)
            add_key(key)
            add_revision(revision)
            add_deleted(deleted)
        start = stop + 1
    return found
