"""Segments: a batch of lines written once, read by DuckDB, bodies read back byte for byte."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest

from rl_export.web.segments import Segments


def test_write_read_back_and_remove(tmp_path: Path) -> None:
    segments = Segments(tmp_path)
    lines = [b'{"a":1}\n', b'{"trace_id":"t","text":"\\u2028 \xc3\xa9"}\n']
    number, path = segments.write(lines)
    assert number == 1
    # Every line of the file is JSON with its own location in front.
    rows = [orjson.loads(line) for line in path.read_bytes().splitlines()]
    assert [(r["_o"], r["_n"]) for r in rows] == [(35, 6), (77, 34)]
    locations = [(number, r["_o"], r["_n"]) for r in rows]
    assert segments.read_many(locations[::-1]) == [line[:-1] for line in lines[::-1]]
    second, _ = segments.write([b'{"b":2}\n'])
    assert second == 2
    assert segments.remove(keep={2}) == [1]
    with pytest.raises(FileNotFoundError):
        segments.read_many(locations)
    assert Segments(tmp_path).write([b'{"c":3}\n'])[0] == 3  # numbers are never reused


@pytest.mark.parametrize("line", [b"[1]\n", b"{}\n", b'{"a":1}'])
def test_only_json_objects_with_fields_a_line_each(tmp_path: Path, line: bytes) -> None:
    with pytest.raises(ValueError, match="JSON objects"):
        Segments(tmp_path).write([line])
