"""Segments: lines appended and read back by location; old segments removed."""

from __future__ import annotations

from pathlib import Path

import pytest

from rl_export.web.segments import Segments


def test_append_read_rotate_and_remove(tmp_path: Path) -> None:
    segments = Segments(tmp_path, max_bytes=10)
    first = segments.append(b"aaaa\nbb\n")
    second = segments.append(b"cccccc\n")  # over 10 bytes: a new segment
    assert first == (1, 0)
    assert second == (2, 0)
    assert segments.read_many([(1, 5, 2), (2, 0, 6), (1, 0, 4)]) == [b"bb", b"cccccc", b"aaaa"]
    assert segments.remove(keep={1}) == []  # 2 is being written
    segments.append(b"ddddddddd\n")
    assert segments.remove(keep={2}) == [1]
    with pytest.raises(FileNotFoundError):
        segments.read_many([(1, 0, 4)])
    segments.close()
    again = Segments(tmp_path, max_bytes=10)
    assert again.append(b"e\n")[0] == 4  # never appends to an old segment
    again.close()
