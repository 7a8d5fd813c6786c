"""Who a corpus line is about: its ``trace_id``, ``revision`` and whether it is a tombstone,
read from the line's first bytes without parsing the whole record (pure).

Every row the project writes starts with ``{"trace_id":...`` and has ``revision`` as a top-level
key before any nested value (the trajectory record and its tombstone: ``trace_id``, ``org``,
``project``, ``reward_source``, ``revision``; a corpus row of another format: ``trace_id``,
``revision``), and a tombstone, and only a tombstone, ends with ``"deleted":true}``. A line
that does not look like that is parsed in full, so the answer never depends on the shortcut.

:data:`HEAD` and :func:`line_key` are the shortcut the latest view's hot loops use: a line's
*key* is its ``trace_id`` as UTF-8 bytes (the raw bytes between the quotes when the id has no
escape in it, else the parsed id encoded), which sorts as the ``trace_id`` strings sort.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import NamedTuple

import orjson

_HEAD = re.compile(rb'\{"trace_id":"((?:[^"\\]|\\.)*)"')
HEAD = re.compile(
    rb'\{"trace_id":"([^"\\]*)"'
    rb'(?:,"org":"[^"\\{\[]*","project":"[^"\\{\[]*","reward_source":(?:"[^"\\{\[]*"|null))?'
    rb',"revision":(\d{1,18}),'
)
"""A line the project wrote, up to its revision: ``{"trace_id":"<id>",`` (an id without
escapes), the trajectory record's ``org``, ``project`` and ``reward_source`` or nothing (a
corpus row of another format), then ``"revision":<digits>,``. Group 1 is the key, group 2
the revision. Matched at a line's start; a line it does not match goes to :func:`line_key`."""
TOMBSTONE_END = b'"deleted":true}'
"""How a tombstone's line ends (before its newline), and only a tombstone's."""
_REVISION = re.compile(rb'"revision":(\d{1,18})[,}]')
_TOMBSTONE_END = b'"deleted":true}'


class Identity(NamedTuple):
    trace_id: str
    revision: int
    deleted: bool


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


_KEY = b'{"trace_id":"'
_REVISION_KEY = b'"revision":'
_HEAD_BYTES = 512  # where a line's identity is looked for (else: parsed in full)


def block_identities(block: bytes, start: int = 0, size: int | None = None) -> Iterator[Identity]:
    """The identity of every line of ``block[start:size]`` (whole lines), without copying
    the lines: only each line's head is looked at (a few ``find`` calls), and its end for
    the tombstone's last key; a line whose head is not the project's key order is parsed in
    full."""
    size = len(block) if size is None else size
    find, endswith, startswith = block.find, block.endswith, block.startswith
    while start < size:
        end = find(b"\n", start, size)
        if end < 0:
            end = size
        if startswith(_KEY, start):
            quote = find(b'"', start + 13, end)
            limit = min(end, start + _HEAD_BYTES)
            at = find(_REVISION_KEY, quote, limit) if quote > 0 else -1
            stop = find(b",", at + 11, at + 31) if at > 0 else -1
            if (
                stop > 0
                and find(b"\\", start + 13, quote) < 0
                and find(b"{", quote, at) < 0
                and find(b"[", quote, at) < 0
                and block[at + 11 : stop].isdigit()
            ):
                yield Identity(
                    block[start + 13 : quote].decode(),
                    int(block[at + 11 : stop]),
                    endswith(_TOMBSTONE_END, start, end),
                )
                start = end + 1
                continue
        yield _parsed(block[start:end])
        start = end + 1


def line_key(data: bytes, start: int, stop: int) -> tuple[bytes, int, bool]:
    """``(key, revision, deleted)`` of the line ``data[start:stop]`` (``stop`` at its newline
    or the end): :data:`HEAD`, else :func:`line_identity`. Raises NotARecordError."""
    found = HEAD.match(data, start, stop)
    if found is not None:
        return found[1], int(found[2]), data.endswith(TOMBSTONE_END, start, stop)
    identity = line_identity(data[start:stop])
    return key_of(identity.trace_id), identity.revision, identity.deleted


def key_of(trace_id: str) -> bytes:
    """The key of a ``trace_id``: its UTF-8 bytes (lone surrogates kept, as JSON allows), so
    keys sort as the ids do."""
    return trace_id.encode("utf-8", "surrogatepass")


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
