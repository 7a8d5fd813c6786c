"""The query index's record bodies: each ingested slice of corpus lines is one local file.

A segment (``<index dir>/segments/<n:08d>.jsonl``) holds a slice's lines exactly as the
corpus has them (verified by the reader), written with one system call and never copied line
by line. DuckDB reads it once to extract the columns the filters need; the index keeps each
record's offset and length in it, and a body is read back with one ``pread``: the corpus
line, byte for byte. A segment no live record points into is deleted
(:meth:`Segments.remove`); readers that opened it before keep reading it (POSIX).
"""

from __future__ import annotations

import os
import threading
from pathlib import Path


class Segments:
    """Write batches, read bodies back by location (from any thread)."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        directory.mkdir(parents=True, exist_ok=True)
        existing = self.numbers()
        self.next = (existing[-1] + 1) if existing else 1  # never reuse a number
        self._lock = threading.Lock()  # corpora's writers take numbers side by side

    def path(self, number: int) -> Path:
        return self.directory / f"{number:08d}.jsonl"

    def numbers(self) -> list[int]:
        return sorted(int(p.stem) for p in self.directory.glob("*.jsonl") if p.stem.isdigit())

    def size(self, number: int) -> int:
        try:
            return self.path(number).stat().st_size
        except FileNotFoundError:
            return 0

    def reserve(self, count: int) -> int:
        """The first of ``count`` new numbers, never used again (a sidecar object's rows take
        one each, with no file: their bodies stay in the store)."""
        with self._lock:
            first = self.next
            self.next += count
            return first

    def write(self, data: bytes | memoryview) -> tuple[int, Path]:
        """Write a slice of lines as a new segment; return its number and path.

        The bytes reach the OS, not the disk, before this returns: the index is a cache, and
        one whose segments turn out shorter than it says is rebuilt from the corpora.
        """
        number = self.reserve(1)
        path = self.path(number)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
        finally:
            os.close(fd)
        return number, path

    def read_many(self, locations: list[tuple[int, int, int]]) -> list[bytes]:
        """The bodies at each (segment, offset, length), in order; FileNotFoundError when a
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
        """Delete every segment not in ``keep``; return them. Call between batches."""
        removed = []
        for number in self.numbers():
            if number not in keep:
                self.path(number).unlink(missing_ok=True)
                removed.append(number)
        return removed
