"""JSON and JSON Lines encoding shared by every stage (orjson underneath).

JSON Lines here means: UTF-8, one object per ``\\n``-terminated line, no pretty-printing,
and U+2028 / U+2029 escaped so that tools which split on Unicode line breaks stay safe.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import orjson

_OPTIONS = orjson.OPT_UTC_Z | orjson.OPT_NON_STR_KEYS
# orjson writes these two characters raw; JSON allows the \\u escape instead.
_LS, _PS = "\u2028".encode(), "\u2029".encode()


def dumps(value: Any) -> bytes:
    """Serialise one value as compact JSON bytes."""
    data = orjson.dumps(value, option=_OPTIONS)
    if _LS in data or _PS in data:
        data = data.replace(_LS, b"\\u2028").replace(_PS, b"\\u2029")
    return data


def dumps_line(value: Any) -> bytes:
    """Serialise one value as a JSON Lines line, newline included."""
    return dumps(value) + b"\n"


def dumps_lines(values: Iterable[Any]) -> bytes:
    """Serialise values as a JSON Lines document (final newline present when non-empty)."""
    return b"".join(dumps_line(v) for v in values)


def loads(data: bytes | str) -> Any:
    """Parse one JSON value."""
    return orjson.loads(data)


def iter_lines(data: bytes) -> Iterable[Any]:
    """Parse a JSON Lines document; raise ValueError naming the line that is broken."""
    if data and not data.endswith(b"\n"):
        raise ValueError("JSON Lines document does not end with a newline")
    for number, line in enumerate(data.splitlines(), start=1):
        try:
            yield orjson.loads(line)
        except orjson.JSONDecodeError as exc:
            raise ValueError(f"line {number}: {exc}") from None
