"""Memory an export shares with the processes of its pool (transport only).

A large export with a chat template makes its rows in a pool of processes
(:mod:`rl_export.export.templated`): each chunk of the corpus's lines goes to a process and
the chunk's finished JSON Lines come back. Through the pool's pipes every byte is pickled,
written into the pipe 64 KiB at a time, read out and unpickled: at 1,000,000 records (4.1 GB
in, 2.4 GB out) that cost about 11 s of CPU, a tenth of the export's. Through shared memory
a chunk is one copy in and its lines one copy out.

The export's process creates a block of :class:`Slots`, each an *in* room for a chunk's
lines and an *out* room for the rows' lines, and sends a slot's number with each task; the
pool's processes attach to the block once (:class:`Attached`). A slot is this process's until
the task's answer is taken, so no two tasks share one. What does not fit (a chunk with a
line longer than a room, or rows that came out longer) goes through the pipe as before: a
room's size is a speed-up, never a limit. The block's pages are taken when it is made
(``posix_fallocate``: a full ``/dev/shm`` refuses it then, where touching a page later would
kill the process), there are at most :data:`MAX_SLOTS` (with more tasks in flight the rest
take the pipes), and where shared memory cannot be had the export uses the pipes alone.

Public interface::

    class Slots(count, size=ROOM_BYTES)          # in the export's process
        .name; .put(pieces) -> slot | None; .take(slot, size) -> bytes; .free(slot); .close()
    class Attached(name, size)                   # in a pool process (the Slots' size)
        .chunk(slot, length) -> memoryview; .give(slot, lines) -> size | None
    def make_slots(count) -> Slots | None        # None: no shared memory to be had here
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from multiprocessing import shared_memory

ROOM_BYTES = 2 << 20
"""The size of a slot's in room and of its out room (a chunk of the corpus's lines is about
1 MiB: :data:`~rl_export.export.templated.CHUNK_BYTES`)."""
MAX_SLOTS = 12
"""At most this many slots an export (48 MiB of a container's 64 MiB ``/dev/shm``)."""


def _buffer(memory: shared_memory.SharedMemory) -> memoryview:
    buf = memory.buf
    assert buf is not None, "open until closed"
    return buf


def _put(buf: memoryview, at: int, pieces: Sequence[bytes | memoryview]) -> None:
    for piece in pieces:
        end = at + len(piece)
        buf[at:end] = piece
        at = end


class Slots:
    """Slots of shared memory, each a task's in room and out room (the module)."""

    def __init__(self, count: int, size: int = ROOM_BYTES) -> None:
        self.size = size
        self.memory = shared_memory.SharedMemory(create=True, size=count * 2 * size)
        fd = getattr(self.memory, "_fd", -1)  # POSIX shared memory's file (tmpfs)
        if fd >= 0 and hasattr(os, "posix_fallocate"):
            try:
                os.posix_fallocate(fd, 0, count * 2 * size)
            except OSError:
                self.close()
                raise
        self._free = list(range(count))

    @property
    def name(self) -> str:
        return self.memory.name

    def put(self, pieces: Sequence[bytes | memoryview]) -> int | None:
        """A free slot with the pieces one after another in its in room, or None (none
        free, or they are too long)."""
        if sum(map(len, pieces)) > self.size or not self._free:
            return None
        slot = self._free.pop()
        _put(_buffer(self.memory), 2 * slot * self.size, pieces)
        return slot

    def take(self, slot: int, size: int) -> bytes:
        """The ``size`` bytes a pool process left in the slot's out room; the slot is free."""
        start = (2 * slot + 1) * self.size
        data = bytes(_buffer(self.memory)[start : start + size])
        self._free.append(slot)
        return data

    def free(self, slot: int) -> None:
        self._free.append(slot)

    def close(self) -> None:
        self.memory.close()
        self.memory.unlink()


def make_slots(count: int, size: int = ROOM_BYTES) -> Slots | None:
    """Up to :data:`MAX_SLOTS` slots, or None where shared memory cannot be had (the pipes
    then carry it all)."""
    try:
        return Slots(min(count, MAX_SLOTS), size)
    except OSError:
        return None


class Attached:
    """A pool process's view of the export's slots."""

    def __init__(self, name: str, size: int) -> None:
        # Spawned processes share the export's resource tracker: attaching registers the
        # name it already holds, and the export's unlink forgets it.
        self.memory = shared_memory.SharedMemory(name=name)
        self.size = size

    def chunk(self, slot: int, length: int) -> memoryview:
        """The ``length`` bytes the export put in the slot's in room."""
        start = 2 * slot * self.size
        return _buffer(self.memory)[start : start + length]

    def give(self, slot: int, lines: Sequence[bytes]) -> int | None:
        """``lines`` one after another in the slot's out room: their size, or None when they
        do not fit (nothing written)."""
        size = sum(map(len, lines))
        if size > self.size:
            return None
        _put(_buffer(self.memory), (2 * slot + 1) * self.size, lines)
        return size
