"""The query index's record bodies: corpus lines copied to local append-only segment files.

The index (DuckDB) holds the columns the filters need and, per record, where its line is:
``(segment, offset, length)``. Segments are ``<index dir>/segments/<n:08d>.jsonl``, one
written at a time, a new one after ``max_bytes``. Lines are written as read from the corpus
(verified there), so a body is the record's exact JSON. A segment no live record points into
is deleted (:meth:`Segments.remove`); readers that opened it before keep reading it (POSIX).
"""

from __future__ import annotations

import os
from pathlib import Path

SEGMENT_BYTES = 256 * 1024 * 1024


class Segments:
    """Append lines, read them back by location. Appends come from one thread."""

    def __init__(self, directory: Path, max_bytes: int = SEGMENT_BYTES) -> None:
        self.directory = directory
        self.max_bytes = max_bytes
        directory.mkdir(parents=True, exist_ok=True)
        existing = self.numbers()
        self.current = (existing[-1] + 1) if existing else 1  # never append to an old one
        self._size = 0
        self._out: int | None = None

    def path(self, number: int) -> Path:
        return self.directory / f"{number:08d}.jsonl"

    def numbers(self) -> list[int]:
        return sorted(int(p.stem) for p in self.directory.glob("*.jsonl") if p.stem.isdigit())

    def size(self, number: int) -> int:
        try:
            return self.path(number).stat().st_size
        except FileNotFoundError:
            return 0

    def append(self, data: bytes) -> tuple[int, int]:
        """Write ``data`` (whole lines); return (segment, offset of its first byte).

        The bytes reach the OS before this returns (not the disk: the index is a cache that
        is rebuilt from the corpora when a segment turns out shorter than it should be).
        """
        if self._out is None or (self._size and self._size + len(data) > self.max_bytes):
            self._rotate()
        assert self._out is not None
        offset = self._size
        view = memoryview(data)
        while view:
            written = os.write(self._out, view)
            view = view[written:]
        self._size += len(data)
        return self.current, offset

    def _rotate(self) -> None:
        if self._out is not None:
            os.close(self._out)
            self.current += 1
        self._out = os.open(self.path(self.current), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        self._size = os.fstat(self._out).st_size

    def read_many(self, locations: list[tuple[int, int, int]]) -> list[bytes]:
        """The bytes at each (segment, offset, length), in order; FileNotFoundError when a
        segment is gone (removed after the query that found it: ask again)."""
        fds: dict[int, int] = {}
        try:
            out = []
            for number, offset, length in locations:
                fd = fds.get(number)
                if fd is None:
                    fd = fds[number] = os.open(self.path(number), os.O_RDONLY)
                data = os.pread(fd, length, offset)
                if len(data) != length:
                    raise FileNotFoundError(f"segment {number} is shorter than the index says")
                out.append(data)
            return out
        finally:
            for fd in fds.values():
                os.close(fd)

    def remove(self, keep: set[int]) -> list[int]:
        """Delete every segment not in ``keep`` but the one being written; return them."""
        removed = []
        for number in self.numbers():
            if number in keep or number == self.current:
                continue
            self.path(number).unlink(missing_ok=True)
            removed.append(number)
        return removed

    def close(self) -> None:
        if self._out is not None:
            os.close(self._out)
            self._out = None
