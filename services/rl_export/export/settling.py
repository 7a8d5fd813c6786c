"""Step 3 of the latest view (:mod:`rl_export.export.latest`): the compaction settled against
the tail.

The view's index says, per trace, which line of the tail is its best (greatest revision; a
tombstone on an equal one). The compaction holds one line per trace, sorted by ``trace_id``.
A :class:`Settler` walks the compaction once, a part (from its sidecar's columns) or a block
(a chunk of its bytes) at a time, and for each tail trace its range can hold finds the
trace's compaction line: the older of the two lines is cleared from its bitmap (a
compaction line of a later tail revision, or of a tombstone of the same one; else the tail's
line). Tombstones of the compaction are cleared as they are read. Traces are found by binary
search over the block's lines, or, when the block holds many of them (more than one per
``lookup_share`` lines), by reading every line's key.

Pure over its inputs: the bitmaps, the cursor over the index's sorted runs and the erasure
bookkeeping are the view's, passed in; it reads no object itself.
"""

from __future__ import annotations

from bisect import bisect_left

from rl_export.corpora.commits import Block
from rl_export.corpora.erasures import note_erased
from rl_export.corpora.identity import TOMBSTONE_END, line_key
from rl_export.export.runs import FLAG, SHIFT, Cursor, Identities, clear_bit, row_of
from rl_export.model.records import ERASED_REVISION

LOOKUP_SHARE = 16
"""A compaction block with more than one tail trace in its range per this many lines has
every line's key read instead of a binary search per trace."""


class UnsortedError(Exception):
    """The compaction's keys do not increase."""


class Settler:
    """Settles one view's compaction against its tail's best lines (see the module)."""

    def __init__(
        self,
        keep: bytearray,
        keep_tail: bytearray,
        cursor: Cursor,
        *,
        erased_keys: frozenset[bytes],
        erased_best: dict[bytes, tuple[int, bool]],
        lookup_share: int = LOOKUP_SHARE,
    ) -> None:
        self.keep = keep  # one bit per compaction line
        self.keep_tail = keep_tail  # one bit per tail line
        self.cursor = cursor
        self.erased_keys = erased_keys
        self.erased_best = erased_best
        self.lookup_share = lookup_share
        self.looked_up = 0  # tail traces looked up in the compaction by binary search
        self.scanned_blocks = 0  # compaction blocks whose every line's key was read

    def rows(
        self, identities: Identities, n: int, previous: bytes | None
    ) -> tuple[int, bytes | None]:
        """One compaction part from its sidecar (as :meth:`block`): its lines are rows ``n``
        on; returns the next row and the part's last key."""
        keys, revisions, deleted = identities
        if not keys:
            return n, previous
        before = previous
        for key in keys:
            if before is not None and key <= before:
                raise UnsortedError
            before = key
        keep, keep_tail = self.keep, self.keep_tail
        for k, gone in enumerate(deleted):
            if gone:
                clear_bit(keep, n + k)
        if self.erased_keys:
            note_erased(self.erased_best, self.erased_keys, *identities)
        cursor = self.cursor
        cursor.skip_below(keys[0])
        low = 0
        for key, packed in cursor.take_through(keys[-1]):
            k = bisect_left(keys, key, low)
            if k < len(keys) and keys[k] == key:
                self.looked_up += 1
                settle(keep, keep_tail, n + k, revisions[k], packed)
            low = k
        return n + len(keys), keys[-1]

    def block(self, block: Block, n: int, previous: bytes | None) -> tuple[int, bytes]:
        """One block of the compaction: its lines are rows ``n`` on, the last key before it
        ``previous``; returns the next row and the block's last key."""
        data, start, end = block
        keep, keep_tail = self.keep, self.keep_tail
        find, endswith = data.find, data.endswith
        first_stop = find(b"\n", start, end)
        first, _, _ = line_key(data, start, first_stop)
        last_start = data.rfind(b"\n", start, end - 1) + 1
        last = first if last_start <= start else line_key(data, last_start, end - 1)[0]
        if (previous is not None and first <= previous) or last < first:
            raise UnsortedError
        self.cursor.skip_below(first)
        wanted = self.cursor.take_through(last)
        if not wanted:  # no tail trace in range: count the lines, drop any tombstone
            position = start
            while position < end:
                stop = find(b"\n", position, end)
                if endswith(TOMBSTONE_END, position, stop):
                    clear_bit(keep, n)
                n += 1
                position = stop + 1
            return n, last
        starts = lines_of(data, start, end)
        count = len(starts)
        for k, position in enumerate(starts):
            if endswith(TOMBSTONE_END, position, (starts[k + 1] if k + 1 < count else end) - 1):
                clear_bit(keep, n + k)

        def settle_line(k: int, key: bytes, revision: int, gone: bool, packed: int) -> None:
            if packed >> SHIFT == ERASED_REVISION:
                note_erased(self.erased_best, self.erased_keys, [key], [revision], [gone])
            settle(keep, keep_tail, n + k, revision, packed)

        if len(wanted) * self.lookup_share > count:
            self.scanned_blocks += 1
            j = 0
            before = previous
            for k, position in enumerate(starts):
                stop = (starts[k + 1] if k + 1 < count else end) - 1
                key, revision, gone = line_key(data, position, stop)
                if before is not None and key <= before:
                    raise UnsortedError
                before = key
                while j < len(wanted) and wanted[j][0] < key:
                    j += 1
                if j < len(wanted) and wanted[j][0] == key:
                    settle_line(k, key, revision, gone, wanted[j][1])
                    j += 1
        else:
            self.looked_up += len(wanted)
            low = 0
            for key, packed in wanted:
                high = count
                while low < high:
                    middle = (low + high) // 2
                    position = starts[middle]
                    stop = (starts[middle + 1] if middle + 1 < count else end) - 1
                    found, revision, gone = line_key(data, position, stop)
                    if found < key:
                        low = middle + 1
                    elif found > key:
                        high = middle
                    else:
                        settle_line(middle, found, revision, gone, packed)
                        low = middle + 1
                        break
        return n + count, last


def settle(keep: bytearray, keep_tail: bytearray, row: int, revision: int, packed: int) -> None:
    """Compaction line ``row`` (of ``revision``) against the tail's best line of its trace
    (``packed``): the older of the two is cleared."""
    tail_revision = packed >> SHIFT
    if tail_revision > revision or (tail_revision == revision and packed & FLAG):
        clear_bit(keep, row)  # the tail has a later revision (or a tombstone of it)
    else:
        clear_bit(keep_tail, row_of(packed))  # the compaction's line is as new or newer


def lines_of(data: bytes, start: int, end: int) -> list[int]:
    """The start of every line of ``data[start:end]`` (whole lines)."""
    find = data.find
    starts: list[int] = []
    append = starts.append
    while start < end:
        append(start)
        start = find(b"\n", start, end) + 1
    return starts
