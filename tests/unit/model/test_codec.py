from __future__ import annotations

from datetime import UTC, datetime

import pytest

from rl_export.model.codec import dumps_line, dumps_lines, iter_lines, loads


def test_lines_are_compact_newline_terminated_utf8() -> None:
    line = dumps_line({"b": "é", "a": [1, 2]})
    assert line == '{"b":"é","a":[1,2]}\n'.encode()
    assert line.count(b"\n") == 1


def test_unicode_line_separators_are_escaped() -> None:
    text = "one\u2028two\u2029three"
    line = dumps_line({"t": text})
    assert "\u2028".encode() not in line
    assert "\u2029".encode() not in line
    assert b"\\u2028" in line
    assert loads(line) == {"t": text}
    assert len(line.decode().splitlines()) == 1


def test_datetimes_are_utc_with_z() -> None:
    assert (
        dumps_line({"at": datetime(2026, 1, 1, tzinfo=UTC)}) == b'{"at":"2026-01-01T00:00:00Z"}\n'
    )


def test_documents_round_trip_and_broken_lines_are_named() -> None:
    doc = dumps_lines([{"a": 1}, {"a": 2}])
    assert doc.endswith(b"\n")
    assert list(iter_lines(doc)) == [{"a": 1}, {"a": 2}]
    with pytest.raises(ValueError, match="line 2"):
        list(iter_lines(b'{"a":1}\n{"a"\n'))
    with pytest.raises(ValueError, match="newline"):
        list(iter_lines(b'{"a":1}'))
