"""The detectors of redaction (:mod:`rl_export.privacy.redact`), one per kind, behind gates.

Each kind has a *gate*, a cheap necessary condition (RE2 patterns: linear time), and a
detector that runs only where its gate opens:

- ``secrets``: a maintained rule set with the project's rules on top, its gate derived from
  their patterns (:mod:`rl_export.privacy.secrets`);
- ``email``, ``phone``, ``credit_card``, ``iban``, ``ip``: Presidio's predefined pattern
  recognizers, constructed directly (no ``AnalyzerEngine``: no spaCy pipeline, no model), on
  windows around their gate's matches.

A gate comes in two forms: on a string (:class:`Gates`), and on the JSON text that holds
strings (:func:`json_gate`: a match wherever the JSON spelling of a string may hold a
finding). A detector gives spans ``(start, end, kind)``; the redactor replaces them. The
libraries are loaded on first use.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

KINDS: tuple[str, ...] = ("secrets", "email", "phone", "credit_card", "iban", "ip")
"""The kinds of docs/guides/exports.md's redaction: ``secrets``, ``email``, ``phone``,
``credit_card``, ``iban``, ``ip`` (the metrics' closed set of ``kind`` label values)."""


# --- gates: cheap necessary conditions, one per kind ---------------------------------------

# The gates of the personal-data kinds use only characters JSON writes unescaped (no quote,
# backslash or control character), so each is its own gate on JSON text too.
GATES: dict[str, str] = {
    "email": "@",
    # At least 7 digits in a run of digits and phone punctuation (python-phonenumbers'
    # VALID_PUNCTUATION; PhoneRecognizer's results are kept only in that shape: _phone_ok),
    # not followed by a Latin letter: phonenumbers' matcher refuses a number a letter
    # follows (a unit test holds Presidio to it), and so an ISO datetime's date, which a
    # 'T' follows, does not open the gate. An 'x' may follow (it starts an extension).
    "phone": r"\p{Nd}(?:[ \-x\x{2010}-\x{2015}\x{2212}\x{30FC}\x{FF0D}-\x{FF0F}\x{00A0}"
    r"\x{00AD}\x{200B}\x{2060}\x{3000}()\x{FF08}\x{FF09}\x{FF3B}\x{FF3D}.\[\]/~\x{2053}"
    r"\x{223C}\x{FF5E}+]{0,4}\p{Nd}){6,}(?:[^A-WYZa-wyz\p{Nd}]|$)",
    # CreditCardRecognizer's pattern starts with 4 digits, a separator or not, 3 digits.
    "credit_card": r"\p{Nd}{4}[ -]?\p{Nd}{3}",
    # IbanRecognizer's pattern starts with a country code and two check digits.
    "iban": r"[A-Z]{2}[0-9]{2}",
    # IpRecognizer's IPv4 forms hold a dotted quad; its IPv6 forms hold '::' or, written in
    # full, four groups followed by a colon.
    "ip": r"[0-9]{1,3}\.[0-9]{1,3}\.[0-9]{1,3}\.[0-9]{1,3}|::|"
    r"[0-9A-Fa-f]{1,4}:[0-9A-Fa-f]{1,4}:[0-9A-Fa-f]{1,4}:[0-9A-Fa-f]{1,4}:",
}


def gate_text(kind: str) -> str:
    """A kind's gate on a string, as RE2 pattern text."""
    if kind == "secrets":
        from rl_export.privacy.secrets import secrets_detector

        return secrets_detector().gate_text
    return GATES[kind]


def json_gate_text(kind: str) -> str:
    """A kind's gate on JSON text (strings' escapes as they are written), as RE2 pattern
    text (:func:`json_gate`)."""
    if kind == "secrets":
        from rl_export.privacy.secrets import secrets_detector

        return secrets_detector().json_gate_text
    return GATES[kind]


_ESCAPES = r"\\u|\\/"
"""Escapes that could spell any character of a match (``\\u0041``, ``\\/``; escaped once
more in tool arguments that are JSON in a string, they still hold these bytes): JSON text
holding one is always looked at."""


def json_gate(kinds: Sequence[str]) -> str:
    """RE2 pattern text that matches JSON text wherever a string in it may hold something of
    ``kinds`` (keys included), or an escape (:data:`_ESCAPES`) is. It matches no ``"``: a
    match lies in one token of the JSON text."""
    return "|".join([*(f"(?:{json_gate_text(k)})" for k in kinds), _ESCAPES])


class Gates:
    """The gates of some kinds on strings: one automaton for all of them (an RE2 set: one
    pass says which open), and one per kind (where its matches are)."""

    def __init__(self, kinds: Sequence[str]) -> None:
        import re2  # google-re2: an alternation of hundreds of words at automaton speed

        options = re2.Options()
        options.max_mem = 64 << 20
        self.kinds = tuple(kinds)
        texts = {k: gate_text(k) for k in kinds}
        self.each = {k: re2.compile(texts[k], options) for k in kinds}
        self.set = re2.Set.SearchSet(options)
        for kind in self.kinds:
            self.set.Add(texts[kind])
        if self.kinds:
            self.set.Compile()

    def open(self, text: str) -> bool:
        """True when some kind's gate matches (a lone surrogate raises UnicodeEncodeError)."""
        return bool(self.kinds) and bool(self.set.Match(text))

    def which(self, text: str) -> list[str]:
        """The kinds whose gate matches, in :data:`KINDS` order."""
        if not self.kinds:
            return []
        return [self.kinds[i] for i in sorted(self.set.Match(text) or ())]


def byte_search(pattern: Any) -> Callable[[bytes, int], int]:
    """``search(data, pos)``: where a compiled RE2 pattern first matches bytes at or after
    ``pos`` (-1: nowhere). google-re2's ``search`` builds a generator and a match object per
    call (about 4 µs, half of what a ``--redact all`` export spent in the gates); the
    compiled program's own ``Match`` is called directly when the installed version has it,
    else ``search`` (the answer is the same: a unit test holds them to it)."""
    bounded = bounded_search(pattern)

    def search(data: bytes, pos: int) -> int:
        return -1 if pos > len(data) else bounded(data, pos, len(data))

    return search


def bounded_search(pattern: Any) -> Callable[[bytes, int, int], int]:
    """``search(data, pos, endpos)``: where a compiled RE2 pattern first matches
    ``data[pos:endpos]`` (-1: nowhere), as :func:`byte_search`."""
    import re2

    program = getattr(pattern, "_regexp", None)
    anchor = getattr(getattr(re2, "_Anchor", None), "UNANCHORED", None)
    if program is None or anchor is None or not hasattr(program, "Match"):
        return lambda data, pos, endpos: (
            -1 if (m := pattern.search(data, pos, endpos)) is None else m.start()
        )
    match = program.Match

    def search(data: bytes, pos: int, endpos: int) -> int:
        start: int = match(anchor, data, pos, endpos)[0][0]
        return start

    return search


# --- detectors ------------------------------------------------------------------------------

Span = tuple[int, int, str]  # start, end, kind


DIGIT_KINDS = frozenset({"phone", "credit_card"})
DATETIME = re.compile(
    r"\d{4}-\d\d-\d\d(?:[T ]\d\d:\d\d(?::\d\d(?:[.,]\d+)?)?(?:Z|[+-]\d\d(?::?\d\d)?)?)?"
)


def _phone_ok(found: str) -> bool:
    """A phone has at least 7 digits and a ``+`` or a separator (a bare run of digits is an
    order number as often as a phone)."""
    digits = sum(c.isdigit() for c in found)
    return digits >= 7 and digits < len(found)


class _Presidio:
    """Presidio's predefined pattern recognizers, constructed without an NLP engine."""

    def __init__(self) -> None:
        import tldextract
        from presidio_analyzer.predefined_recognizers import (
            CreditCardRecognizer,
            EmailRecognizer,
            IbanRecognizer,
            IpRecognizer,
            PhoneRecognizer,
        )

        # The public-suffix list bundled with tldextract: it would otherwise try to fetch
        # the latest one over the network at first use.
        offline = tldextract.TLDExtract(suffix_list_urls=(), cache_dir=None)

        class OfflineEmailRecognizer(EmailRecognizer):
            def validate_result(self, pattern_text: str) -> bool:
                return offline(pattern_text).fqdn != ""

        self.recognizers: dict[str, Any] = {
            "email": OfflineEmailRecognizer(),
            "phone": PhoneRecognizer(),
            "credit_card": CreditCardRecognizer(),
            "iban": IbanRecognizer(),
            "ip": IpRecognizer(),
        }
        self.min_score = 0.3  # IpRecognizer scores a bare '::' 0.1

    def spans(self, text: str, kind: str, windows: Iterable[tuple[int, int]]) -> list[Span]:
        """The kind's findings in the given windows of ``text``."""
        recognizer = self.recognizers[kind]
        out: list[Span] = []
        for offset, piece in [(a, text[a:b]) for a, b in windows]:
            for result in recognizer.analyze(piece, recognizer.supported_entities, None):
                if result.score < self.min_score:
                    continue
                if kind == "phone" and not _phone_ok(piece[result.start : result.end]):
                    continue
                out.append((offset + result.start, offset + result.end, kind))
        return out


# How far around a gate's match its detector looks: more than the longest thing it finds
# (an IBAN is up to 34 characters and 8 spaces; an e-mail's local part up to 64).
MARGINS = {"email": 100, "phone": 24, "credit_card": 32, "iban": 48, "ip": 48}


def widen(text: str, windows: Iterable[tuple[int, int]], margin: int = 24) -> list[tuple[int, int]]:
    """Windows grown by ``margin`` characters each side and on to the next space (at most
    another ``margin``: a token is not cut), merged."""
    out: list[tuple[int, int]] = []
    size = len(text)
    for a, b in sorted(windows):
        start = max(0, a - margin)
        if start > 0:
            space = text.rfind(" ", max(0, start - margin), start)
            start = space + 1 if space >= 0 else max(0, start - margin)
        end = min(size, b + margin)
        if end < size:
            space = text.find(" ", end, end + margin)
            end = space if space >= 0 else min(size, end + margin)
        if out and start <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], end))
        else:
            out.append((start, end))
    return out


@functools.cache
def pii_detector() -> _Presidio:
    return _Presidio()


def find_all(text: str, value: str) -> Iterator[int]:
    start = text.find(value)
    while start >= 0 and value:
        yield start
        start = text.find(value, start + len(value))
