"""Shared memory between an export and its pool's processes (issue 55): a chunk goes into a
slot's in room, the rows' lines come back in its out room; what does not fit is refused, so
the caller sends it through the pipes."""

from __future__ import annotations

import errno
import os
from collections.abc import Iterator

import pytest

from rl_export.export.slots import MAX_SLOTS, Attached, Slots, make_slots


@pytest.fixture
def slots() -> Iterator[Slots]:
    made = Slots(2, size=16)
    yield made
    made.close()


def test_a_chunk_goes_in_and_lines_come_back(slots: Slots) -> None:
    attached = Attached(slots.name, slots.size)
    slot = slots.put([memoryview(b"0123456789"), b"", b"abcdef"])
    assert slot is not None
    assert bytes(attached.chunk(slot, 16)) == b"0123456789abcdef"
    assert attached.give(slot, [b"ab\n", b"", b"cde\n"]) == 7
    assert slots.take(slot, 7) == b"ab\ncde\n"
    # the slot's in room is its own: the other slot's chunk does not touch it
    other = slots.put([b"xyz"])
    again = slots.put([b"uvw"])
    assert {other, again} == {0, 1}
    assert other is not None
    assert again is not None
    assert bytes(attached.chunk(other, 3)) == b"xyz"
    assert bytes(attached.chunk(again, 3)) == b"uvw"


def test_what_does_not_fit_is_refused(slots: Slots) -> None:
    attached = Attached(slots.name, slots.size)
    assert slots.put([b"x" * 17]) is None  # longer than a room
    assert slots.put([b"x" * 9, b"x" * 8]) is None
    slot = slots.put([b"x" * 16])
    assert slot is not None
    assert attached.give(slot, [b"12345678\n", b"12345678\n"]) is None  # 18 bytes
    assert slots.put([b"y"]) is not None
    assert slots.put([b"z"]) is None  # both slots taken
    slots.free(slot)
    assert slots.put([b"z"]) == slot


def test_a_full_dev_shm_refuses_the_slots_when_they_are_made(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The pages are taken when the slots are made: where /dev/shm has no room the export
    uses the pipes (no slots), and nothing is left behind; there are never more than
    MAX_SLOTS."""
    made = make_slots(MAX_SLOTS + 5, size=16)
    assert made is not None
    assert len(made._free) == MAX_SLOTS
    made.close()

    def full(fd: int, offset: int, length: int) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    before = set(os.listdir("/dev/shm"))
    monkeypatch.setattr(os, "posix_fallocate", full)
    assert make_slots(2, size=16) is None
    assert set(os.listdir("/dev/shm")) == before
