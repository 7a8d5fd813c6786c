"""The query index's record bodies: each ingested batch of corpus lines is one local file.

A segment (``<index dir>/segments/<n:08d>.jsonl``) is a batch's lines, each with its own
location put in front, in fixed width (JSON allows the spaces)::

    {"_o":        1234,"_n":      3920,"trace_id":"tr-1","org":...}

``_o`` is where the rest of the line (after its opening brace) starts in the file and ``_n``
how many bytes it has before the newline. DuckDB reads the segment once to extract the
columns the filters need (so the lines are written once and never parsed in Python), and a
body is read back as ``{`` plus those bytes: the corpus line, byte for byte. A segment no
live record points into is deleted (:meth:`Segments.remove`); readers that opened it before
keep reading it (POSIX).
"""

from __future__ import annotations

import os
from pathlib import Path

PREFIX = b'{"_o":%12d,"_n":%10d,'
PREFIX_BYTES = len(PREFIX % (0, 0))


class Segments:
    """Write batches, read bodies back by location. Batches come from one thread."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        directory.mkdir(parents=True, exist_ok=True)
        existing = self.numbers()
        self.next = (existing[-1] + 1) if existing else 1  # never reuse a number

    def path(self, number: int) -> Path:
        return self.directory / f"{number:08d}.jsonl"

    def numbers(self) -> list[int]:
        return sorted(int(p.stem) for p in self.directory.glob("*.jsonl") if p.stem.isdigit())

    def size(self, number: int) -> int:
        try:
            return self.path(number).stat().st_size
        except FileNotFoundError:
            return 0

    def write(self, lines: list[bytes]) -> tuple[int, Path]:
        """Write a batch of lines (each ``{...}\\n``) as a new segment; return it.

        The bytes reach the OS, not the disk, before this returns: the index is a cache, and
        one whose segments turn out shorter than it says is rebuilt from the corpora.
        """
        pieces: list[bytes | memoryview] = []
        position = 0
        for line in lines:
            if not line.startswith(b"{") or line.startswith(b"{}") or not line.endswith(b"\n"):
                raise ValueError(
                    "a segment holds JSON objects with at least one field, a line each"
                )
            pieces.append(PREFIX % (position + PREFIX_BYTES, len(line) - 2))
            pieces.append(memoryview(line)[1:])
            position += PREFIX_BYTES + len(line) - 1
        number = self.next
        self.next += 1
        path = self.path(number)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        try:
            view = memoryview(b"".join(pieces))
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
                out.append(b"{" + data)
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
