"""Who a corpus line is about: its ``trace_id``, ``revision`` and whether it is a tombstone,
read from the line's first bytes without parsing the whole record (pure).

Every row the project writes starts with ``{"trace_id":...`` and has ``revision`` as a top-level
key before any nested value (the trajectory record and its tombstone: ``trace_id``, ``org``,
``project``, ``reward_source``, ``revision``; a corpus row of another format: ``trace_id``,
``revision``), and a tombstone, and only a tombstone, ends with ``"deleted":true}``. A line
that does not look like that is parsed in full, so the answer never depends on the shortcut.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import NamedTuple

import orjson

_HEAD = re.compile(rb'\{"trace_id":"((?:[^"\\]|\\.)*)"')
_REVISION = re.compile(rb'"revision":(\d{1,18})[,}]')
_TOMBSTONE_END = b'"deleted":true}'


class Identity(NamedTuple):
    trace_id: str
    revision: int
    deleted: bool


_HEAD_BYTES = 512  # the identity is in a line's first bytes (else: parsed in full)


class NotARecordError(ValueError):
    """A line that is not a JSON object with a string ``trace_id`` and integer ``revision``."""


def line_identity(line: bytes) -> Identity:
    """The identity of one JSON Lines line (trailing newline allowed)."""
    head = _HEAD.match(line)
    if head is not None:
        found = _REVISION.search(line, head.end())
        if found is not None and not _nested(line, head.end(), found.start()):
            raw = head.group(1)
            trace_id = raw.decode() if b"\\" not in raw else orjson.loads(b'"' + raw + b'"')
            end = len(line) - 1 if line.endswith(b"\n") else len(line)
            return Identity(trace_id, int(found.group(1)), line.endswith(_TOMBSTONE_END, 0, end))
    return _parsed(line)


def block_identities(block: bytes) -> Iterator[Identity]:
    """The identity of every line of a block of whole lines, without copying the lines: only
    each line's head is looked at (and its end, for the tombstone's last key)."""
    start, size = 0, len(block)
    find, match, search = block.find, _HEAD.match, _REVISION.search
    while start < size:
        end = find(b"\n", start)
        if end < 0:
            end = size
        head = match(block, start, min(end, start + _HEAD_BYTES))
        found = None
        if head is not None:
            found = search(block, head.end(), min(end, start + _HEAD_BYTES))
        if found is None or head is None or _nested(block, head.end(), found.start()):
            yield _parsed(block[start:end])
        else:
            raw = head.group(1)
            trace_id = raw.decode() if b"\\" not in raw else orjson.loads(b'"' + raw + b'"')
            yield Identity(
                trace_id, int(found.group(1)), block.endswith(_TOMBSTONE_END, start, end)
            )
        start = end + 1


def _nested(line: bytes, start: int, stop: int) -> bool:
    """True when an object or a list may open between two positions (then the revision found
    could be a nested key: parse the line instead)."""
    return line.find(b"{", start, stop) >= 0 or line.find(b"[", start, stop) >= 0


def _parsed(line: bytes) -> Identity:
    try:
        row = orjson.loads(line)
    except orjson.JSONDecodeError as exc:
        raise NotARecordError(f"not JSON: {exc}") from None
    if not isinstance(row, dict):
        raise NotARecordError("not a JSON object")
    trace_id, revision = row.get("trace_id"), row.get("revision")
    if not isinstance(trace_id, str) or isinstance(revision, bool) or not isinstance(revision, int):
        raise NotARecordError("no string trace_id and integer revision")
    return Identity(trace_id, revision, row.get("deleted") is True)
