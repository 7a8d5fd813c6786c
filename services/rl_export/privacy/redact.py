"""Redaction (docs/guides/redaction.md): sensitive substrings of every string a record or row
carries become ``[REDACTED:KIND]``, deterministically, with a count per kind.

Pure: text in, text and counts out (:meth:`Redactor.text`); a record or row in, a record and
counts out (:meth:`Redactor.record`); a JSON Lines line in, a line and counts out
(:meth:`Redactor.line`). One module serves the sink (corpus specs with ``redact``), the
exports, the preview, jobs, queue and claim items and ``rl_export.hf``, so every output path
gives the same bytes for the same row.

Which strings: all of them, keys of free-form objects included (metadata, tool arguments,
unknown extra fields, content parts of any type, ``reasoning_content``, ``refusal``, URLs,
attachment URIs), but the structural fields of :mod:`rl_export.privacy.structural` (ids,
names, enum values, datetimes), by where they sit in the layout. The walk is derived from
that one list (:data:`~rl_export.privacy.structural.STRUCTURAL`). Tool-call ``arguments``
that are JSON are redacted as the JSON they hold and encoded again (valid JSON stays valid
JSON), only when something changed. A key that is redacted and then equals another key of
its object gets ``#2`` (``#3``, ...) appended: no value is lost.

Kinds (:data:`KINDS`) and who detects them (:mod:`rl_export.privacy.detectors`): ``secrets``
by a maintained rule set with the project's rules on top (:mod:`rl_export.privacy.secrets`),
the personal-data kinds by Presidio's pattern recognizers. The replacement is
:func:`replace_spans` (overlapping findings become one placeholder).

Speed: what is proven to hold nothing is not parsed. A record's JSON text (a corpus line as
stored, or a row encoded) is searched once by one RE2 automaton that opens only inside a JSON
string where some kind's gate does, or where an escape could hide one
(:func:`~rl_export.privacy.detectors.string_gate`). Where it opens, the text's top-level
fields are split without being built (msgspec's raw values) and each is searched on its own,
down the layout: a structural field whose value is a scalar is passed over, and so is a
part that no gate opens for. Only when some string outside the structural fields may hold
something is the record parsed and walked, and then each string is searched by the gates
before any detector runs. So the line path and the record path give the same bytes: a
property test holds them equal on generated hostile records of every shape.
"""

from __future__ import annotations

import functools
import json
import re
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any

import msgspec
import orjson

from rl_export.model.codec import RawJson, dumps, dumps_line
from rl_export.model.records import TrajectoryRecord
from rl_export.privacy.detectors import (
    DATETIME,
    DIGIT_KINDS,
    KINDS,
    MARGINS,
    Gates,
    Span,
    json_gate,
    pii_detector,
    widen,
)
from rl_export.privacy.gatescan import gate_search
from rl_export.privacy.kinds import PII_KINDS, Counts, RedactError, placeholder
from rl_export.privacy.structural import ID, JSON_TEXT, STRUCTURAL, Each, Names, Spec

__all__ = ["KINDS", "PII_KINDS", "Redactor", "redactor", "warm_up"]
_NO_COUNTS: Counts = {}
_ORDER = {k: n for n, k in enumerate(KINDS)}


def replace_spans(text: str, spans: Sequence[Span]) -> tuple[str, Counts]:
    """``text`` with each span replaced by its kind's placeholder, and the count per kind.

    Overlapping spans become one, of the kind of the span that starts first (the longer one
    at the same start; then secrets before the others): one substring, one count.
    """
    if not spans:
        return text, _NO_COUNTS
    merged: list[list[Any]] = []
    for start, end, kind in sorted(set(spans), key=lambda s: (s[0], -s[1], _ORDER[s[2]])):
        if merged and start < merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], end)
        else:
            merged.append([start, end, kind])
    pieces: list[str] = []
    counts: Counts = {}
    at = 0
    for start, end, kind in merged:
        pieces += [text[at:start], placeholder(kind)]
        counts[kind] = counts.get(kind, 0) + 1
        at = end
    pieces.append(text[at:])
    return "".join(pieces), counts


def _searchable(text: str) -> str:
    """``text`` as RE2 can search it: a lone surrogate (which JSON's ``\\ud800`` may spell)
    becomes U+FFFD, one code point for one, so offsets stay the same."""
    if text.isascii():
        return text
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return "".join("\ufffd" if "\ud800" <= c <= "\udfff" else c for c in text)
    return text


class Redactor:
    """Redacts the kinds it was made for; pure and deterministic. ``bool(redactor)`` is
    False when it redacts nothing (``none``)."""

    def __init__(self, kinds: Sequence[str]) -> None:
        unknown = [k for k in kinds if k not in KINDS]
        if unknown:
            raise RedactError("redact", f"unknown kind {unknown[0]!r}")
        self.kinds = tuple(k for k in KINDS if k in kinds)
        self.gates = Gates(self.kinds)
        self._secrets: Any = None
        self._search: Callable[[bytes, int], int] = lambda data, pos: -1
        if self.kinds:
            self._search = gate_search(json_gate(self.kinds))
            if "secrets" in self.kinds:
                from rl_export.privacy.secrets import secrets_detector

                self._secrets = secrets_detector()
        self._fields = msgspec.json.Decoder(dict[str, msgspec.Raw])
        self._items = msgspec.json.Decoder(list[msgspec.Raw])

    def __bool__(self) -> bool:
        return bool(self.kinds)

    def __repr__(self) -> str:
        return f"Redactor({','.join(self.kinds) or 'none'})"

    # text

    def spans(self, text: str, key: str | None = None) -> list[Span]:
        """Where the sensitive substrings of ``text`` are (overlaps possible); ``key``: the
        name ``text`` is the value of (a secret's name makes a secret-looking value one)."""
        if not self.kinds:
            return []
        safe = _searchable(text)
        named = self._secrets is not None and key is not None and self._secrets.named(key)
        opened = self.gates.which(safe)
        if not opened and not named:
            return []
        spans: list[Span] = []
        if named or "secrets" in opened:
            spans += [(a, b, "secrets") for a, b in self._secrets.spans(text, key)]
        for kind in opened:
            if kind == "secrets":
                continue
            # The detectors run on windows around their gate's matches: their patterns cost
            # milliseconds on a long text (Presidio's e-mail pattern backtracks over every
            # word, phonenumbers' matcher runs once per region), little on a window.
            found = [m.span() for m in self.gates.each[kind].finditer(safe)]
            spans += pii_detector().spans(safe, kind, widen(safe, found, MARGINS[kind]))
        if any(k in DIGIT_KINDS for _, _, k in spans):
            # Digits inside a date or a datetime are never a phone or a card number.
            dates = [m.span() for m in DATETIME.finditer(text)]
            spans = [
                s for s in spans
                if s[2] not in DIGIT_KINDS or not any(a < s[1] and s[0] < b for a, b in dates)
            ]  # fmt: skip
        secret = [(a, b) for a, b, k in spans if k == "secrets"]
        if secret and len(secret) < len(spans):
            # A secret wins over what overlaps it: 'https://user:pw@host' is a password in a
            # URL, not an e-mail address.
            spans = [
                s for s in spans
                if s[2] == "secrets" or not any(a < s[1] and s[0] < b for a, b in secret)
            ]  # fmt: skip
        return spans

    def text(self, text: str, key: str | None = None) -> tuple[str, Counts]:
        """``text`` redacted, and how many substrings of each kind were replaced."""
        return replace_spans(text, self.spans(text, key))

    # records

    def record(self, record: dict[str, Any]) -> tuple[dict[str, Any], Counts]:
        """A record or row with every string but the structural fields redacted (a new dict
        when something changed, else ``record`` itself), and the counts.

        Its JSON text is searched first (:meth:`holds_nothing`); only a record that may hold
        something is walked."""
        if not self.kinds:
            return record, _NO_COUNTS
        try:
            if self.holds_nothing(dumps(record)):
                return record, _NO_COUNTS
        except (TypeError, orjson.JSONEncodeError):
            pass  # a lone surrogate (from JSON arguments): walked without the shortcut
        counts: Counter[str] = Counter()
        return self._walk(record, STRUCTURAL, counts, None), dict(counts)

    def line(self, line: bytes) -> tuple[bytes, dict[str, Any] | None, Counts]:
        """A JSON Lines line redacted: (line, the redacted record or None when unchanged,
        counts). A line proven to hold nothing is returned as it is, without parsing it."""
        if not self.kinds or self.holds_nothing(line):
            return line, None, _NO_COUNTS
        record = orjson.loads(line)
        if not isinstance(record, dict):
            return line, None, _NO_COUNTS
        counts: Counter[str] = Counter()
        redacted = self._walk(record, STRUCTURAL, counts, None)
        if redacted is record:
            return line, None, _NO_COUNTS
        return dumps_line(redacted), redacted, dict(counts)

    def may_hold(self, data: bytes) -> bool:
        """Whether JSON Lines text could hold anything to redact (False: it cannot)."""
        return self.next_hit(data) >= 0

    def next_hit(self, data: bytes, pos: int = 0) -> int:
        """Where the first line at or after ``pos`` (a line's start) of JSON Lines text
        starts that may hold something to redact (-1: none)."""
        hit = self._search(data, pos)
        while hit >= 0:
            start = data.rfind(b"\n", 0, hit) + 1
            end = data.find(b"\n", hit)
            end = len(data) if end < 0 else end
            after = self._clean(data, start, end, hit)
            if after is None:
                return start
            hit = after  # where the gate opens next, past this line (the search went on)
        return -1

    def holds_nothing(self, data: bytes) -> bool:
        """Whether the JSON text of a record or row is proven to hold nothing to redact."""
        hit = self._search(data, 0)
        return hit < 0 or self._clean(data, 0, len(data), hit) is not None

    def _clean(self, data: bytes, start: int, end: int, hit: int) -> int | None:
        """None when the JSON object ``data[start:end]``, in which the gate opened at
        ``hit``, may hold something to redact; else (every place the gate opens at in it is
        in a structural field) where the gate opens next after ``end`` (-1: nowhere).

        A record's leading fields (``trace_id`` to ``evaluator_scores``) and those of its
        tail (``agent_version``, ``scenario``) are matched by patterns derived from the
        structural list, the tail found without parsing what comes before it; the fields
        between them (the evaluation, the messages) and the rest of the tail are parsed only
        when the gate opens there."""
        head = _head_end(data, start, end)
        tail = tail_lead = -1
        tail_fields: dict[str, Any] | None = None
        while 0 <= hit < end:
            if hit < head:  # ids and numbers
                hit = self._search(data, head)
                continue
            if tail < 0:
                tail, tail_fields = self._tail(data, head, end)
                lead = _TAIL_HEAD.match(data, tail, end) if tail_fields is not None else None
                tail_lead = tail if lead is None else lead.end()
            if tail <= hit < tail_lead:  # the tail's leading fields: a version, a scenario
                hit = self._search(data, tail_lead)
                continue
            if hit >= tail:
                if tail_fields is None or not self._proven_fields(tail_fields, STRUCTURAL):
                    return None
                return self._search(data, end)
            if head > start:  # the fields between the head and the tail, as one object
                middle = b"{" + data[head + 1 : tail] + (b"}" if tail < end else b"")
            else:
                middle = data[start:tail] + (b"}" if tail < end else b"")
            if not self._proven(middle, STRUCTURAL):
                return None
            hit = self._search(data, tail) if tail < end else self._search(data, end)
        return hit

    def _tail(self, data: bytes, head: int, end: int) -> tuple[int, dict[str, Any] | None]:
        """Where a record's tail starts in ``data[head:end]``, and its fields (``end`` and
        None: no tail found). The tail is the last ``,"agent_version":`` from which the rest
        is one object: a deeper one would leave the record's closing braces over, so it is
        the record's own."""
        at = data.rfind(_TAIL_KEY, head, end)
        if at < 0:
            return end, None
        try:
            return at, self._fields.decode(b"{" + data[at + 1 : end])
        except msgspec.DecodeError:
            return end, None  # not the record's: the middle holds it

    def _proven(self, data: bytes, spec: Spec) -> bool:
        """Whether the JSON value ``data``, which the gate opened for, holds nothing to
        redact outside the structural fields ``spec`` names: its fields (or items) are
        looked at one by one, down the layout, and each must be structural or one the gate
        does not open for."""
        first = data[:1]
        if spec is ID:
            return first not in (b"{", b"[")  # a scalar where an id goes
        try:
            if first == b"{" and isinstance(spec, dict | Names):
                return self._proven_fields(self._fields.decode(data), spec)
            if first == b"[" and isinstance(spec, Each):
                for raw in self._items.decode(data):
                    value = bytes(raw)
                    if self._search(value, 0) >= 0 and not self._proven(value, spec.item):
                        return False
                return True
        except msgspec.DecodeError:
            return False
        return False

    def _proven_fields(self, fields: dict[str, Any], spec: dict[str, Spec] | Names) -> bool:
        for key, raw in fields.items():
            if isinstance(spec, Names):
                sub: Spec = spec.value
            elif key in spec:
                sub = spec[key]
                if sub is ID or sub is None:
                    value = bytes(raw)
                    if b'"' not in value:
                        continue  # a number, a boolean, null, an empty list: no string
                    if sub is ID and value[:1] == b'"':
                        continue  # a structural string
            else:  # an unknown field: its key is free text, and names its value
                try:
                    if self.gates.open(key) or (
                        self._secrets is not None and self._secrets.named(key)
                    ):
                        return False
                except UnicodeEncodeError:
                    return False
                sub = None
            value = bytes(raw)
            if self._search(value, 0) >= 0 and (sub is None or not self._proven(value, sub)):
                return False
        return True

    # the walk (derived from the structural list)

    def _walk(self, value: Any, spec: Spec, counts: Counter[str], key: str | None) -> Any:
        """``value`` with its strings redacted where ``spec`` does not make them structural
        (the same object when nothing changed); ``key``: the name of the field it is."""
        if isinstance(value, str):
            if spec is ID:
                return value
            if spec is JSON_TEXT:
                return self._json_text(value, counts, key)
            return self._redact(value, counts, key)
        if isinstance(value, dict):
            return self._object(value, spec, counts)
        if isinstance(value, list):
            item = spec.item if isinstance(spec, Each) else None
            items = [self._walk(v, item, counts, key) for v in value]
            return items if any(a is not b for a, b in zip(items, value, strict=True)) else value
        if isinstance(value, RawJson):
            parsed = value.value()
            new = self._walk(parsed, spec, counts, key)
            return value if new is parsed else RawJson(dumps(new))
        return value

    def _object(self, value: dict[Any, Any], spec: Spec, counts: Counter[str]) -> Any:
        out: dict[Any, Any] = {}
        changed = False
        for name, item in value.items():
            if isinstance(spec, Names):
                new_name, sub, context = name, spec.value, None
            elif isinstance(spec, dict) and name in spec:
                new_name, sub, context = name, spec[name], None
            else:  # a key of free text: scanned, and it names its value
                new_name = self._redact(name, counts, None) if isinstance(name, str) else name
                sub, context = None, name if isinstance(name, str) else None
            new_item = self._walk(item, sub, counts, context)
            if new_name is not name or new_item is not item:
                changed = True
            if new_name in out:  # a redacted key equal to another: keep both values
                n = 2
                while f"{new_name}#{n}" in out:
                    n += 1
                new_name = f"{new_name}#{n}"
            out[new_name] = new_item
        return out if changed else value

    def _json_text(self, value: str, counts: Counter[str], key: str | None) -> str:
        """Tool-call arguments: JSON redacted as the JSON it holds and encoded again (only
        when something changed), else text."""
        try:
            parsed = json.loads(value)
        except ValueError:
            parsed = None
        if not isinstance(parsed, dict | list):
            return self._redact(value, counts, key)
        new = self._walk(parsed, None, counts, None)
        if new is parsed:
            return value
        text = json.dumps(new, ensure_ascii=False)
        return text if _searchable(text) is text or text.isascii() else json.dumps(new)

    def _redact(self, text: str, counts: Counter[str], key: str | None) -> str:
        new, found = replace_spans(text, self.spans(text, key))
        if found:
            counts.update(found)
            return new
        return text


def _leading(fields: Sequence[str], opening: bytes) -> re.Pattern[bytes]:
    """A pattern of the first of ``fields``, in order, after ``opening``, while each is
    structural (or free but a scalar, which holds no string), derived from the structural
    list: what it matches holds nothing to redact."""
    string = rb'"[^"\\]*(?:\\.[^"\\]*)*"'
    scalar = rb"(?:null|true|false|-?[0-9][0-9.eE+-]*)"
    either = rb"(?:%s|%s)" % (string, scalar)
    parts = []
    for name in fields:
        spec = STRUCTURAL.get(name, JSON_TEXT)
        if spec is ID:
            value = either
        elif spec is None:
            value = scalar
        elif isinstance(spec, Each) and spec.item is ID:
            value = rb"(?:null|\[(?:%s(?:,%s)*)?\])" % (either, either)
        elif isinstance(spec, Names) and spec.value is None:
            pair = rb"%s:%s" % (string, scalar)
            value = rb"(?:null|\{(?:%s(?:,%s)*)?\})" % (pair, pair)
        else:
            break
        parts.append(rb'"%s":%s' % (name.encode(), value))
    pattern = b""
    for part in reversed(parts):
        pattern = rb"(?:,%s%s)?" % (part, pattern)
    return re.compile(re.escape(opening) + pattern[len(b"(?:,") : -len(b")?")])


_FIELDS = list(TrajectoryRecord.model_fields)
_AFTER_MESSAGES = _FIELDS[_FIELDS.index("messages") + 1 :]
_HEAD = _leading(_FIELDS, b"{")
"""A record's leading fields: ``{"trace_id":...`` to ``"evaluator_scores":{...}``."""
_TAIL_HEAD = _leading(_AFTER_MESSAGES, b",")
"""The leading fields of its tail: ``,"agent_version":"...","scenario":"..."``."""
_TAIL_KEY = b',"%s":' % _AFTER_MESSAGES[0].encode()
"""The key of the first field after a record's messages (``agent_version``)."""


def _head_end(data: bytes, start: int, end: int) -> int:
    """Where the leading fields of the line ``data[start:end]`` that hold nothing to redact
    end (``start`` when it does not start like a record)."""
    match = _HEAD.match(data, start, end)
    return start if match is None else match.end()


def warm_up(kinds: Sequence[str] = KINDS) -> None:
    """Load and build the detectors of ``kinds`` now, not on a first request."""
    if "secrets" in kinds:
        from rl_export.privacy.secrets import secrets_detector

        secrets_detector().scanner  # noqa: B018 - the rule set loaded, not only its gates
    if set(kinds) & set(PII_KINDS):
        pii_detector()


@functools.lru_cache(maxsize=32)
def redactor(kinds: tuple[str, ...]) -> Redactor:
    """The redactor of some kinds (made once per process)."""
    return Redactor(kinds)
