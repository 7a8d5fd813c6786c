"""Step 4 of the latest view for one object: the lines it keeps, cut out between line ends
as the object is read, or, where a sidecar gave a prefilter, fetched by range from the
sidecar's line places (:mod:`rl_export.export.latest`)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import NamedTuple

import numpy as np
import numpy.typing as npt

from rl_export.corpora.commits import ChainError, Part, object_blocks
from rl_export.corpora.store import ObjectStore
from rl_export.export.runs import all_set
from rl_export.model.errors import ObjectNotFoundError

JOIN_RUNS = 16
"""A block with more runs of kept lines than this passes them on copied into one."""
RANGE_BATCH = 4 << 20
"""Bytes of a prefiltered object's kept lines fetched at once (by range)."""


class Candidates(NamedTuple):
    """A part's lines a prefilter may match (bit ``n``: line ``n``), and where each line is
    in the object (its sidecar's ``line_offset`` and ``line_length``, newline excluded)."""

    bits: int
    offsets: npt.NDArray[np.int64]
    lengths: npt.NDArray[np.int64]


async def kept_ranges(
    store: ObjectStore, part: Part, kept: int, candidates: Candidates
) -> AsyncIterator[tuple[bytes, int, int, int, int]]:
    """The lines of ``kept`` (bit ``n``: line ``n``), fetched by range from the sidecar's line
    places, one run of consecutive lines a range, as ``(data, 0, len(data), lines, 0)`` of
    about :data:`RANGE_BATCH` bytes each: a filtered export reads
    only the bytes of the lines it may keep, and finds no line end itself."""
    flags = np.unpackbits(
        np.frombuffer(kept.to_bytes((part.records + 7) // 8, "little"), dtype=np.uint8),
        bitorder="little",
    )[: part.records]
    edges = np.diff(np.concatenate(([0], flags, [0])).astype(np.int8))
    starts, ends = np.flatnonzero(edges == 1), np.flatnonzero(edges == -1)  # lines [s, e)
    begin = candidates.offsets[starts]
    size = candidates.offsets[ends - 1] + candidates.lengths[ends - 1] + 1 - begin
    ranges: list[tuple[int, int]] = []
    lines = total = 0
    for at, length, count in zip(begin.tolist(), size.tolist(), (ends - starts).tolist(),
                                 strict=True):  # fmt: skip
        ranges.append((at, length))
        lines += count
        total += length
        if total >= RANGE_BATCH:
            data = b"".join(await _ranges(store, part, ranges))
            yield data, 0, len(data), lines, 0
            ranges, lines, total = [], 0, 0
    if ranges:
        data = b"".join(await _ranges(store, part, ranges))
        yield data, 0, len(data), lines, 0


async def _ranges(store: ObjectStore, part: Part, ranges: list[tuple[int, int]]) -> list[bytes]:
    if part.data is not None:  # a commit's own lines
        return [part.data[start : start + length] for start, length in ranges]
    try:
        return await store.get_ranges(part.key, ranges)
    except ObjectNotFoundError:
        raise ChainError(f"{part.key}: missing (expired while reading?)") from None


async def kept_lines(
    store: ObjectStore, part: Part, bits: bytearray, n: int
) -> AsyncIterator[tuple[bytes, int, int, int, int]]:
    """One object's lines whose bits are set (its line ``k`` is bit ``n + k``), as
    ``(data, start, end, lines, 0)``: whole when every bit is set (its line count then
    comes with an empty range after it), else the runs of kept lines cut between line
    ends: a block's runs as they are when they are few, else copied together (a reader
    that parses what it is given pays per call, and a filter leaves many short runs)."""
    whole = all_set(bits, n, part.records)
    async for data, start, end in object_blocks(store, part, verify=False):
        if whole:
            yield data, start, end, 0, 0
            continue
        find = data.find
        runs: list[tuple[int, int, int]] = []
        run_start, kept = -1, 0
        position = start
        while position < end:
            stop = find(b"\n", position, end) + 1
            if bits[n >> 3] & (1 << (n & 7)):
                if run_start < 0:
                    run_start = position
                kept += 1
            elif run_start >= 0:
                runs.append((run_start, position, kept))
                run_start, kept = -1, 0
            n += 1
            position = stop
        if run_start >= 0:
            runs.append((run_start, end, kept))
        if len(runs) > JOIN_RUNS:
            joined = b"".join([data[a:b] for a, b, _ in runs])
            yield joined, 0, len(joined), sum(k for _, _, k in runs), 0
            continue
        for a, b, k in runs:
            yield data, a, b, k, 0
    if whole:
        yield b"", 0, 0, part.records, 0
