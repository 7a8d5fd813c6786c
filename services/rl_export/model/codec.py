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


class RawJson:
    """A JSON value kept as the bytes it was written as: copied out verbatim, parsed on demand.

    Conversations are most of the bytes of a trajectory. The join serialises a trace's
    messages once, when the trace arrives, and from then on the table, the snapshots and
    every corpus's records carry those bytes without parsing them again. Equal bytes are
    equal values.
    """

    __slots__ = ("data",)

    def __init__(self, data: bytes) -> None:
        # Not a dataclass: orjson would serialise a dataclass as an object of its fields.
        self.data = data

    def __eq__(self, other: object) -> bool:
        return isinstance(other, RawJson) and other.data == self.data

    def __hash__(self) -> int:
        return hash(self.data)

    def __repr__(self) -> str:
        return f"RawJson({self.data[:60]!r}{'...' if len(self.data) > 60 else ''})"

    def value(self) -> Any:
        """The parsed value."""
        return orjson.loads(self.data)


def _fragment(value: Any) -> orjson.Fragment:
    if isinstance(value, RawJson):
        return orjson.Fragment(value.data)
    raise TypeError(f"Type is not JSON serializable: {type(value).__name__}")


def dumps(value: Any) -> bytes:
    """Serialise one value as compact JSON bytes (:class:`RawJson` values copied verbatim)."""
    return escape_separators(orjson.dumps(value, default=_fragment, option=_OPTIONS))


def escape_separators(data: bytes) -> bytes:
    """Escape U+2028 and U+2029 in JSON bytes (only inside strings can they be).

    Both start with the byte 0xE2. Looking for that one byte is a ``memchr``; looking for
    the three-byte sequences directly costs far more than encoding the JSON did (CPython's
    substring search is slow on short needles), so it is done only when the byte is there.
    """
    if b"\xe2" in data and (_LS in data or _PS in data):
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
