"""Segments: a slice of lines written once, bodies read back byte for byte, old ones removed."""

from __future__ import annotations

from pathlib import Path

import pytest

from rl_export.index.segments import Segments


def test_write_read_back_and_remove(tmp_path: Path) -> None:
    segments = Segments(tmp_path)
    data = b'{"a":1}\n{"trace_id":"t","text":"\\u2028 \xc3\xa9"}\n'
    number, path = segments.write(memoryview(data)[0:])
    assert number == 1
    assert path.read_bytes() == data  # as the corpus has them
    locations = [(number, 0, 7), (number, 8, len(data) - 9)]
    assert segments.read_many(locations[::-1]) == [data[8:-1], b'{"a":1}']
    second, _ = segments.write(b'{"b":2}\n')
    assert second == 2
    assert segments.size(2) == 8
    assert segments.remove(keep={2}) == [1]
    with pytest.raises(FileNotFoundError):
        segments.read_many(locations)
    assert Segments(tmp_path).write(b'{"c":3}\n')[0] == 3  # numbers are never reused


def test_a_location_past_the_end_is_an_error(tmp_path: Path) -> None:
    segments = Segments(tmp_path)
    number, _ = segments.write(b'{"a":1}\n')
    with pytest.raises(FileNotFoundError, match="shorter"):
        segments.read_many([(number, 4, 100)])
