"""The search behind the JSON-text gate (:func:`rl_export.privacy.detectors.json_gate`):
where its RE2 pattern first matches bytes, with Hyperscan in front when it can be.

RE2 runs an alternation of the secrets rules' literals (a 10 KB pattern) at about 430 MB/s
on our records; an export without redaction only copies the same bytes, so the gate's scan
alone nearly doubled an export's cost. Hyperscan (Intel's multi-pattern matcher, the engine
the secrets rules' own scanner is built on) scans the same alternation at about 1.1 GB/s.

Hyperscan is the *filter*, RE2 the *answer*: Hyperscan finds the first line whose text it
matches, and RE2 then searches that line alone (from ``pos`` when it is ``pos``'s line).
The answer is always RE2's, so it is the same as RE2 searching the whole text, provided

- no match spans a line: the gates match no raw newline (JSON text holds none in a
  record; the gates' classes exclude it), so RE2 searching line by line finds what it finds
  over the whole text;
- every line RE2 matches, Hyperscan matches too. Hyperscan here matches bytes, RE2 UTF-8
  characters: the two differ only where RE2 folds case to a character outside ASCII (a
  gate's ``(?i:...)``), which Unicode does for two letters only, ``k`` (KELVIN SIGN, U+212A)
  and ``s`` (LATIN SMALL LETTER LONG S, U+017F): a line holding either is always handed to
  RE2 (a unit test walks every code point to hold RE2 to that list). A gate holding a
  character outside ASCII, or one Hyperscan cannot compile (also as a prefilter, which may
  match more but never less), is searched by RE2 alone, and so is everything where the
  package is not installed (it ships wheels for x86-64 Linux).

A unit test holds :func:`gate_search` to RE2's own search on generated JSON Lines.
"""

from __future__ import annotations

import contextlib
import re
import threading
from collections.abc import Callable
from typing import Any

from rl_export.privacy.detectors import bounded_search, byte_search

Search = Callable[[bytes, int], int]
"""``search(data, pos)``: where the pattern first matches ``data`` at or after ``pos``
(-1: nowhere)."""

FOLDED_OUTSIDE_ASCII = ("\u212a", "\u017f")
"""The characters outside ASCII that RE2's case folding equates with an ASCII letter."""

_MAX_MEM = 64 << 20


def gate_search(pattern: str) -> Search:
    """The search of an RE2 ``pattern`` that matches no newline, Hyperscan in front of it
    when it can be (the answer is RE2's either way)."""
    import re2

    options = re2.Options()
    options.max_mem = _MAX_MEM
    compiled = re2.compile(pattern.encode(), options)
    exact = byte_search(compiled)
    database = _hyperscan(pattern)
    if database is None:
        return exact
    return _filtered(database, bounded_search(compiled))


def _hyperscan(pattern: str) -> Any:
    """A Hyperscan database matching every line ``pattern`` matches, or None."""
    if not _bytes_like(pattern):
        return None
    try:
        import hyperscan
    except ImportError:
        return None
    folded = [re_bytes(c.encode()) for c in FOLDED_OUTSIDE_ASCII]
    expressions = [pattern.encode(), *folded]
    try:
        database = hyperscan.Database()
        database.compile(expressions=expressions, ids=list(range(len(expressions))),
                         flags=[hyperscan.HS_FLAG_PREFILTER] * len(expressions))  # fmt: skip
    except Exception:  # hyperscan.error, or a CPU without SSSE3: RE2 alone
        return None
    return database


def _bytes_like(pattern: str) -> bool:
    """Whether ``pattern`` names only ASCII characters, so that matching its bytes can only
    match more than RE2 matching its characters: no character outside ASCII, written or
    escaped (``\\x{...}``, ``\\x80`` and above, octal), no Unicode class (``\\p``,
    ``\\P``), no single-byte escape (``\\C``)."""
    if not pattern.isascii():
        return False
    for escape in _ESCAPE.finditer(pattern):
        letter, after = escape.group(1), pattern[escape.end() : escape.end() + 2]
        if letter in "pPCX" or letter.isdigit():  # Unicode classes, a byte, octal
            return False
        if letter == "x" and not (_HEX.fullmatch(after) and int(after, 16) < 0x80):
            return False  # \\x{...}, or a character at U+0080 or above
    return True


_ESCAPE = re.compile(r"\\(.)", re.DOTALL)
_HEX = re.compile("[0-9A-Fa-f]{2}")


def re_bytes(data: bytes) -> bytes:
    """A pattern matching ``data``, byte for byte."""
    return "".join(f"\\x{b:02x}" for b in data).encode()


def _on_match(_id: int, _from: int, to: int, _flags: int, state: list[int]) -> bool:
    """Hyperscan's callback; ``state`` is [where the match may end at the earliest, where
    the first one did]. Matches come in the order of their ends."""
    if to > state[0]:
        state[1] = to
        return True  # stop the scan
    return False


def _filtered(database: Any, bounded: Callable[[bytes, int, int], int]) -> Search:
    import hyperscan

    local = threading.local()  # a scratch space is one scan's at a time

    def search(data: bytes, pos: int) -> int:
        size = len(data)
        if pos > size:
            return -1
        scratch = getattr(local, "scratch", None)
        if scratch is None:
            scratch = local.scratch = hyperscan.Scratch(database)
        view = memoryview(data)
        start = data.rfind(b"\n", 0, pos) + 1  # from pos's line: the context RE2 sees
        while start < size:
            state = [pos - start, -1]  # a match must end past pos
            with contextlib.suppress(hyperscan.ScanTerminated):  # raised when stopped
                database.scan(view[start:], match_event_handler=_on_match, context=state,
                              scratch=scratch)  # fmt: skip
            if state[1] < 0:
                return -1
            last = start + state[1] - 1  # the match's last byte, on the line RE2 searches
            line = max(start, data.rfind(b"\n", start, last) + 1)
            end = data.find(b"\n", last)
            end = size if end < 0 else end + 1
            hit = bounded(data, max(pos, line), end)
            if hit >= 0:
                return hit
            start = end
        return -1

    return search
