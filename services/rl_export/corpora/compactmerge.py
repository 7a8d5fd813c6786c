"""Compaction's streaming core: the winners of the new lines, and their merge with the base.

:func:`rl_export.corpora.compaction.compact` used to hold every record of a corpus parsed;
at a million records of a few KB that is tens of GiB. Here the memory is bounded by a part
(``max_part_records`` records) and a small index per trace, whatever the corpus's size:

* :class:`Winners`: the lines read after the base (the chains, commit by commit, then the
  base's tombstones) decide a winner per trace as compaction always did (a later revision
  wins; on equal revisions the line read later). Of each winner only its revision, a few
  flags and where its bytes are stay in memory; the bytes (re-encoded as the generation
  writes them, tombstones stamped with their commit's ``created_at``) go to a spill file in
  the system's temporary folder. A line that loses when it is read is never spilled.
* :class:`Walk`: the base generation's parts are sorted by ``trace_id``; they are read line
  by line and merged with the winners in ``trace_id`` order (a winner read after the base
  replaces its base record when its revision is the same or newer). Each live record goes to
  the part being written, a local file closed every ``max_part_records`` records (with its
  sha256, line lengths and sidecar rows), its ``(trace_id, revision)`` to the holdings; the
  tombstones kept and, for the table, the latest row of every trace the new lines touched.

The bytes are those :func:`rl_export.corpora.commits.encode_shard` writes: every record is
parsed and encoded again (``dumps``), as the in-memory compaction did, so a generation is the
same, byte for byte, whichever wrote it.
"""

from __future__ import annotations

import hashlib
import logging
import os
import tempfile
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from rl_export.corpora.commits import ChainError, Commit
from rl_export.model.codec import dumps_line, loads
from rl_export.model.partitioning import Partitioner, partition_for

SIDECAR_BATCH_ROWS = 4096
"""Sidecar rows converted to Arrow at once while a part is written (they hold their records'
lists and objects until then)."""

log = logging.getLogger(__name__)

DELETED = 1  # the winner is a tombstone
TOUCHED = 2  # a line after the base names the trace
BASE = 4  # the winner is one of the base's tombstones (read before the chains' lines)

Entry = tuple[int, int, int, int]
"""A winner: (revision, offset in the spill file, length, flags)."""


def parse_lines(data: bytes, where: str) -> Iterator[bytes]:
    """The lines of JSON Lines bytes, newline included (ChainError when the last has none)."""
    if data and not data.endswith(b"\n"):
        raise ChainError(f"{where}: does not end with a newline")
    start = 0
    end = len(data)
    while start < end:
        cut = data.index(b"\n", start) + 1
        yield data[start:cut]
        start = cut


def _loads(line: bytes, where: str) -> dict[str, Any]:
    try:
        row = loads(line)
    except ValueError as exc:
        raise ChainError(f"{where}: unreadable line ({exc})") from None
    if not isinstance(row, dict):
        raise ChainError(f"{where}: a line that is not an object")
    return row


class Winners:
    """The latest line per trace among those read after the base, kept as an index over a
    spill file (:data:`Entry` per trace)."""

    def __init__(self, folder: str) -> None:
        self._file: IO[bytes] = tempfile.TemporaryFile(dir=folder)  # noqa: SIM115
        self._size = 0
        self.index: dict[str, Entry] = {}
        self.lines = 0  # lines read

    def close(self) -> None:
        self._file.close()

    def _spill(self, data: bytes) -> int:
        at = self._size
        self._file.write(data)
        self._size += len(data)
        return at

    def flush(self) -> None:
        self._file.flush()

    def read(self, entry: Entry) -> bytes:
        return os.pread(self._file.fileno(), entry[2], entry[1])

    def add_commit(self, commit: Commit, data: bytes, where: str) -> int:
        """A commit's lines, in order (tombstones stamped with its ``created_at``); their
        count."""
        count = 0
        index = self.index
        for line in parse_lines(data, where):
            count += 1
            row = _loads(line, where)
            trace_id, revision = row["trace_id"], row["revision"]
            current = index.get(trace_id)
            # ">=": on equal revisions the row read later wins.
            if current is None or revision >= current[0]:
                deleted = bool(row.get("deleted"))
                if deleted and "deleted_at" not in row:
                    row["deleted_at"] = commit.created_at
                encoded = dumps_line(row)
                flags = TOUCHED | (DELETED if deleted else 0)
                index[trace_id] = (revision, self._spill(encoded), len(encoded), flags)
            elif not current[3] & TOUCHED:
                index[trace_id] = (*current[:3], current[3] | TOUCHED)
        self.lines += count
        return count

    def add_base_tombstones(self, rows: Sequence[dict[str, Any]]) -> None:
        """The base generation's tombstones, read (as compaction always did) after its
        records and before every chain line: a chain line wins over one on an equal
        revision, a later tombstone over an earlier one."""
        index = self.index
        for row in rows:
            trace_id, revision = row["trace_id"], row["revision"]
            current = index.get(trace_id)
            if (
                current is None
                or (current[3] & BASE and revision >= current[0])
                or revision > current[0]
            ):
                encoded = dumps_line(row)
                flags = BASE | (DELETED if row.get("deleted") else 0)
                if current is not None:
                    flags |= current[3] & TOUCHED
                index[trace_id] = (revision, self._spill(encoded), len(encoded), flags)

    def touched(self) -> tuple[int, int]:
        """The traces the new lines name, and their winners' bytes."""
        count = size = 0
        for entry in self.index.values():
            if entry[3] & TOUCHED:
                count += 1
                size += entry[2]
        return count, size


@dataclass
class PartFile:
    """One part of the new generation, written to a local file (uncompressed lines)."""

    n: int
    path: Path
    records: int
    sha256: str  # of the lines
    lengths: list[int]
    index: list[Any] | None  # its sidecar rows, converted (sidecar.index_batch); None: none


@dataclass
class Walk:
    """The merge of the base's records (fed in ``trace_id`` order) with the winners."""

    winners: Winners
    folder: str
    max_part_records: int
    erased: frozenset[str] | set[str]
    since: str  # tombstones deleted at or after it are kept
    sidecars: bool  # build each part's sidecar rows
    partitioning: tuple[Partitioner, int] | None
    changes_wanted: bool  # keep the latest row of each touched trace (the table's MERGE)
    # Called with each part as it is closed, in the walk's thread, which waits for it (the
    # part stored, its sidecar rows let go, before the next part starts).
    on_part: Callable[[PartFile], None]
    tombstones_only: bool = False  # ... only the touched traces' tombstones
    records: int = 0
    tombstones: list[bytes] = field(default_factory=list)
    changes: list[dict[str, Any]] = field(default_factory=list)
    fields: dict[str, None] = field(default_factory=dict)  # the live records' fields
    holdings: list[list[tuple[str, int]]] = field(default_factory=list)

    def __post_init__(self) -> None:
        if self.max_part_records < 1:
            raise ValueError(f"max_part_records must be at least 1, got {self.max_part_records}")
        self._keys = sorted(self.winners.index)
        self._at = 0
        self._previous: str | None = None
        self._parts = 0
        self._file: IO[bytes] | None = None
        self._hash = hashlib.sha256()
        self._count = 0
        self._lengths: list[int] = []
        self._index_rows: list[tuple[Any, ...]] = []
        self._index: list[Any] | None = [] if self.sidecars else None
        if self.partitioning is not None:
            self.holdings = [[] for _ in range(self.partitioning[1])]
        self.winners.flush()

    # --- input ------------------------------------------------------------------------------

    def base_block(self, data: bytes, start: int, end: int, where: str) -> int:
        """A block of the base's lines (whole lines, in ``trace_id`` order); their count."""
        count = 0
        keys, index = self._keys, self.winners.index
        for line in parse_lines(data[start:end], where):
            count += 1
            row = _loads(line, where)
            trace_id = row["trace_id"]
            if self._previous is not None and trace_id <= self._previous:
                raise ChainError(f"{where}: the parts are not sorted by trace_id ({trace_id!r})")
            self._previous = trace_id
            while self._at < len(keys) and keys[self._at] < trace_id:
                self._winner(keys[self._at])
                self._at += 1
            entry = None
            if self._at < len(keys) and keys[self._at] == trace_id:
                entry = index[trace_id]
                self._at += 1
            if entry is not None and entry[0] >= row["revision"]:
                self._winner(trace_id)
            else:
                touched = entry is not None and bool(entry[3] & TOUCHED)
                self._emit(row, None, touched=touched)
        return count

    def finish(self) -> None:
        """The winners after the base's last record; the last part closed."""
        keys = self._keys
        while self._at < len(keys):
            self._winner(keys[self._at])
            self._at += 1
        self._close()

    # --- output -----------------------------------------------------------------------------

    def _winner(self, trace_id: str) -> None:
        entry = self.winners.index[trace_id]
        encoded = self.winners.read(entry)
        row = _loads(encoded, "the compaction's spill file")
        self._emit(row, encoded, touched=bool(entry[3] & TOUCHED))

    def _emit(self, row: dict[str, Any], encoded: bytes | None, *, touched: bool) -> None:
        deleted = bool(row.get("deleted"))
        if touched and self.changes_wanted and (deleted or not self.tombstones_only):
            self.changes.append(row)
        if deleted:
            if row.get("deleted_at", "") >= self.since:
                self.tombstones.append(encoded if encoded is not None else dumps_line(row))
            return
        trace_id = row["trace_id"]
        if trace_id in self.erased:
            return
        if encoded is None:
            encoded = dumps_line(row)
        if self._file is None:
            path = Path(self.folder) / f"part-{self._parts:05d}.jsonl"
            self._file = path.open("wb")
        self._file.write(encoded)
        self._hash.update(encoded)
        self._lengths.append(len(encoded))
        self._count += 1
        self.records += 1
        if self.sidecars:
            from rl_export.corpora.sidecar import index_row  # pyarrow: on use

            if self._index is not None:
                self._index_rows.append(index_row(row))
                if len(self._index_rows) == SIDECAR_BATCH_ROWS:
                    self._convert()
        fields = self.fields
        for name in row:
            if name not in fields:
                fields[name] = None
        if self.partitioning is not None:
            partitioner, count = self.partitioning
            self.holdings[partition_for(trace_id.encode(), count, partitioner)].append(
                (trace_id, row["revision"])
            )
        if self._count == self.max_part_records:
            self._close()

    def _convert(self) -> None:
        """The sidecar rows held, as Arrow; a part whose rows cannot make a sidecar goes
        without one (logged), as :func:`~rl_export.corpora.sidecar.write_sidecar` does."""
        from rl_export.corpora.sidecar import SIDECAR_ERRORS, index_batch

        rows, self._index_rows = self._index_rows, []
        if self._index is None or not rows:
            return
        try:
            self._index.append(index_batch(rows))
        except SIDECAR_ERRORS as exc:
            log.warning("part %d of the new generation: no index sidecar (%s: %s)",
                        self._parts, type(exc).__name__, exc)  # fmt: skip
            self._index = None

    def _close(self) -> None:
        if self._file is None:
            return
        self._file.close()
        self._convert()
        part = PartFile(
            n=self._parts,
            path=Path(self._file.name),
            records=self._count,
            sha256=self._hash.hexdigest(),
            lengths=self._lengths,
            index=self._index,
        )
        self._parts += 1
        self._file = None
        self._hash = hashlib.sha256()
        self._count = 0
        self._lengths = []
        self._index_rows = []
        self._index = [] if self.sidecars else None
        self.on_part(part)


def read_part_files(paths: Sequence[Path]) -> Iterator[dict[str, Any]]:
    """The records of local part files, in order (blocking: for a thread)."""
    for path in paths:
        with path.open("rb") as f:
            for line in f:
                yield loads(line)
