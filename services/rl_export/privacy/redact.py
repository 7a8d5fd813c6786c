"""Redaction (docs/guides/exports.md): sensitive substrings of a row's free text become
``[REDACTED:KIND]``, deterministically, with a count per kind.

Pure: text in, text and counts out (:meth:`Redactor.text`); a record or row in, a record and
counts out (:meth:`Redactor.record`); a JSON Lines line in, a line and counts out
(:meth:`Redactor.line`). One module serves the sink (corpus specs with ``redact``) and the
exports, so it sits below both.

Kinds (:data:`KINDS`) and who detects them, all kept libraries run without any NLP model:

- ``secrets``: bc-detect-secrets' plugins (cloud and SaaS keys, tokens, private key blocks,
  JWTs, passwords in URLs, and the keyword detector: values assigned to key, secret, token or
  password names, kept when their Shannon entropy says they are not a word or a
  placeholder), plus the recognizers of :data:`EXTRA_SECRETS` for key formats the fork has
  no plugin for (OpenAI and Anthropic, Google, GitLab, Hugging Face, fine-grained GitHub
  tokens, bearer tokens).
- ``email``, ``phone``, ``credit_card`` (Luhn-valid), ``iban`` (checksum-valid), ``ip``:
  Presidio's predefined pattern recognizers, constructed directly (no ``AnalyzerEngine``,
  so no spaCy pipeline and no model download). A phone must hold at least 7 digits and be
  written with a ``+`` or separators: a bare run of digits is an order number as often as a
  phone.

The replacement is :func:`replace_spans` (overlapping findings become one placeholder), not
presidio-anonymizer: that package imports presidio-analyzer and with it spaCy (seconds of
CPU and about 100 MB) only to splice strings, which the default ``secrets`` never needs.

Which strings (:meth:`Redactor.record`): message ``content`` (a string, or the ``text`` of
its parts, ``tool_result`` parts' content and ``tool_use`` parts' ``input``), tool-call
``arguments`` (a JSON string stays valid JSON: its string values are redacted and it is
encoded again, only when something changed), message ``metadata`` string values, evaluation
``reasoning`` and assessment ``explanation``, label ``comment``, a record's ``metadata``
string values. Never keys, ids, roles, names, numbers or datetimes.

Speed: a cheap pre-filter (:class:`Gates`, one RE2 automaton per kind, and a detector runs
only on text its kind's gate matches) keeps text without any candidate away from the
detectors, and :meth:`Redactor.line` keeps a JSON line without any candidate from being
parsed. The libraries are imported on first use (Presidio's imports spaCy: seconds of CPU);
:func:`warm_up` does it ahead, for a server.
"""

from __future__ import annotations

import functools
import json
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import orjson

from rl_export.model.codec import RawJson, dumps_line
from rl_export.privacy.detectors import (
    DATE,
    DATETIME,
    DIGIT_KINDS,
    GATES,
    KINDS,
    MARGINS,
    Gates,
    Span,
    byte_search,
    find_all,
    pii_detector,
    secrets_detector,
    widen,
)
from rl_export.privacy.kinds import PII_KINDS, Counts, RedactError, add_counts, placeholder

__all__ = ["KINDS", "PII_KINDS", "Redactor", "redactor", "warm_up"]
_NO_COUNTS: Counts = {}


def replace_spans(text: str, spans: Sequence[Span]) -> tuple[str, Counts]:
    """``text`` with each span replaced by its kind's placeholder, and the count per kind.

    Overlapping spans become one, of the kind of the span that starts first (the longer one
    at the same start; then secrets before the others): one substring, one count.
    """
    if not spans:
        return text, _NO_COUNTS
    order = {k: n for n, k in enumerate(KINDS)}
    merged: list[list[Any]] = []
    for start, end, kind in sorted(set(spans), key=lambda s: (s[0], -s[1], order[s[2]])):
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


# --- the redactor ---------------------------------------------------------------------------


class _Pass:
    """One walk over a record's places: gathering its strings (``dry``), or redacting."""

    __slots__ = ("counts", "dry", "forced", "texts")

    def __init__(self, *, dry: bool) -> None:
        self.dry = dry
        self.texts: list[str] = []
        self.forced = False  # an escape in gathered JSON text could hide a gate's match
        self.counts: Counter[str] = Counter()

    def gather_json(self, text: str) -> None:
        """JSON text gathered whole (a superset of its strings)."""
        self.texts.append(text)
        if "\\u" in text or "\\/" in text:
            self.forced = True


class Redactor:
    """Redacts the kinds it was made for; pure and deterministic. ``bool(redactor)`` is
    False when it redacts nothing (``none``)."""

    def __init__(self, kinds: Sequence[str]) -> None:
        unknown = [k for k in kinds if k not in KINDS]
        if unknown:
            raise RedactError("redact", f"unknown kind {unknown[0]!r}")
        self.kinds = tuple(k for k in KINDS if k in kinds)
        self.gates = Gates(self.kinds)
        # The gates run on a line's bytes too (:meth:`next_hit`), where an escape (\u, \/)
        # counts as a match: a line none opens for is not parsed.
        self._line_gate: Any = None
        self._line_search: Callable[[bytes, int], int] | None = None
        if self.kinds:
            import re2

            options = re2.Options()
            options.max_mem = 64 << 20
            pattern = "|".join(f"(?:{GATES[k]})" for k in self.kinds) + r"|\\u|\\/"
            self._line_gate = re2.compile(pattern.encode(), options)
            self._line_search = byte_search(self._line_gate)

    def __bool__(self) -> bool:
        return bool(self.kinds)

    def __repr__(self) -> str:
        return f"Redactor({','.join(self.kinds) or 'none'})"

    # text

    def spans(self, text: str, secret_values: Iterable[str] = ()) -> list[Span]:
        """Where the sensitive substrings of ``text`` are (overlaps possible)."""
        values = list(secret_values) if "secrets" in self.kinds else []
        if not values and not self.gates.open(text):
            return []
        spans: list[Span] = []
        for kind in self.gates.which(text):
            # The detectors run on windows around their gate's matches: their patterns cost
            # milliseconds on a long text (Presidio's e-mail pattern backtracks over every
            # word, phonenumbers' matcher runs once per region), little on a window.
            found = [m.span() for m in self.gates.each[kind].finditer(text)]
            windows = widen(text, found, MARGINS[kind])
            if kind == "secrets":
                spans += secrets_detector().spans(text, windows, values)
                values = []
            else:
                spans += pii_detector().spans(text, kind, windows)
        if values:  # found in the text around this one (a JSON object's other keys)
            spans += [(i, i + len(v), "secrets") for v in values for i in find_all(text, v)]
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

    def text(self, text: str, secret_values: Iterable[str] = ()) -> tuple[str, Counts]:
        """``text`` redacted, and how many substrings of each kind were replaced."""
        return replace_spans(text, self.spans(text, secret_values))

    # records

    def record(self, record: dict[str, Any]) -> tuple[dict[str, Any], Counts]:
        """A record or row with the strings of docs/guides/exports.md redacted (a new dict when
        something changed, else ``record`` itself), and the counts.

        First the strings are only gathered and the gates tried on all of them at once; the
        detectors run only when one opens."""
        if not self.kinds:
            return record, _NO_COUNTS
        gather = _Pass(dry=True)
        _gather(record, gather)
        if not gather.forced and not self.gates.open("\n".join(gather.texts)):
            return record, _NO_COUNTS
        work = _Pass(dry=False)
        return self._walk(record, work), dict(work.counts)

    def _walk(self, record: dict[str, Any], p: _Pass) -> dict[str, Any]:
        out = dict(record)
        changed = False
        for key in _MESSAGE_KEYS:
            if key in record:
                new = self._messages(record[key], p)
                if new is not record[key]:
                    out[key], changed = new, True
        for key in ("evaluation", "human_labels", "labels", "metadata", "report", "results"):
            if key in record:
                new = _PLACES[key](self, record[key], p)
                if new is not record[key]:
                    out[key], changed = new, True
        return out if changed else record

    def line(self, line: bytes) -> tuple[bytes, dict[str, Any] | None, Counts]:
        """A JSON Lines line redacted: (line, the redacted record or None when unchanged,
        counts). A line no gate opens for is returned as it is, without parsing it."""
        if not self.may_hold(line):
            return line, None, _NO_COUNTS
        record = orjson.loads(line)
        if not isinstance(record, dict):
            return line, None, _NO_COUNTS
        redacted, counts = self.record(record)
        if redacted is record:
            return line, None, counts
        return dumps_line(redacted), redacted, counts

    def may_hold(self, data: bytes) -> bool:
        """Whether JSON text could hold anything to redact (False: it cannot)."""
        return self.next_hit(data) >= 0

    def next_hit(self, data: bytes, pos: int = 0) -> int:
        """Where the first possible match in JSON Lines text at or after ``pos`` is (-1:
        none). A match in a trajectory record's fields that are never redacted (the head
        before ``evaluation``, the tail from ``agent_version`` to ``labels``: ids, names,
        the scenario, dates) does not count."""
        if not self.kinds or pos >= len(data):
            return -1
        search = self._line_search
        if search is None:
            return pos
        line, regions = -1, []
        while (hit := search(data, pos)) >= 0:
            start = data.rfind(b"\n", 0, hit) + 1
            if start != line:  # the line's fixed fields, found once per line
                end = data.find(b"\n", hit)
                line, regions = start, _fixed_fields(data, start, len(data) if end < 0 else end)
            for a, b in regions:
                if a <= hit < b:  # never redacted (dates in it too): read on after it
                    pos = b
                    break
            else:
                if DATE.match(data, hit):
                    # A date opens the phone gate, and no finding of any kind starts with one
                    # (digits inside a date are never a phone or a card): read on after it.
                    pos = hit + 10
                    continue
                return hit
        return -1

    # places

    def _strings(self, value: Any, p: _Pass, values: Iterable[str] = ()) -> Any:
        """Every string inside a JSON value (keys kept), redacted."""
        if isinstance(value, str):
            if p.dry:
                p.texts.append(value)
                return value
            new, found = self.text(value, values)
            add_counts(p.counts, found)
            return new if found else value
        if isinstance(value, list):
            items = [self._strings(v, p, values) for v in value]
            return items if any(a is not b for a, b in zip(items, value, strict=True)) else value
        if isinstance(value, dict):
            pairs = {k: self._strings(v, p, values) for k, v in value.items()}
            return pairs if any(pairs[k] is not value[k] for k in value) else value
        return value

    def _structure(self, value: Any, p: _Pass) -> Any:
        """A JSON object or list of free text (metadata, tool input): its strings, with the
        secrets its keys name (``{"password": "..."}``) found across the whole of it."""
        if not isinstance(value, dict | list) or not self.kinds:
            return value
        text = json.dumps(value, ensure_ascii=False)
        if p.dry:  # the keys too: a key may name the secret its value is
            p.texts.append(text)
            return value
        if not self.gates.open(text):
            return value
        values = secrets_detector().keyword_values(text) if "secrets" in self.kinds else set()
        return self._strings(value, p, values)

    def _arguments(self, value: Any, p: _Pass) -> Any:
        """Tool-call arguments: a JSON string stays valid JSON."""
        if not isinstance(value, str):
            return self._structure(value, p)
        try:
            parsed = json.loads(value)
        except ValueError:
            parsed = None
        if not isinstance(parsed, dict | list):
            return self._strings(value, p)
        if p.dry:
            p.gather_json(value)
            return value
        new = self._structure(parsed, p)
        return value if new is parsed else json.dumps(new, ensure_ascii=False)

    def _content(self, content: Any, p: _Pass) -> Any:
        if isinstance(content, str):
            return self._strings(content, p)
        if not isinstance(content, list):
            return content
        parts = []
        for part in content:
            new = part
            if isinstance(part, dict):
                kind = part.get("type")
                if isinstance(part.get("text"), str):
                    new = {**part, "text": self._strings(part["text"], p)}
                elif kind == "tool_result" and "content" in part:
                    new = {**part, "content": self._content(part["content"], p)}
                elif kind == "tool_use" and "input" in part:
                    new = {**part, "input": self._structure(part["input"], p)}
                if all(new.get(k) is part.get(k) for k in part):
                    new = part
            parts.append(new)
        return parts if any(a is not b for a, b in zip(parts, content, strict=True)) else content

    def _message(self, message: Any, p: _Pass) -> Any:
        if not isinstance(message, dict):
            return message
        out = dict(message)
        if "content" in message:
            out["content"] = self._content(message["content"], p)
        calls = message.get("tool_calls")
        if isinstance(calls, list):
            out["tool_calls"] = _each(calls, lambda c: self._call(c, p))
        if isinstance(message.get("function_call"), dict):  # the legacy single call
            out["function_call"] = self._call({"function": message["function_call"]}, p)["function"]
        if isinstance(message.get("metadata"), dict | list):
            out["metadata"] = self._structure(message["metadata"], p)
        return out if any(out[k] is not message[k] for k in message) else message

    def _call(self, call: Any, p: _Pass) -> Any:
        if not isinstance(call, dict) or not isinstance(call.get("function"), dict):
            return call
        function = call["function"]
        if "arguments" not in function:
            return call
        arguments = self._arguments(function["arguments"], p)
        if arguments is function["arguments"]:
            return call
        return {**call, "function": {**function, "arguments": arguments}}

    def _messages(self, messages: Any, p: _Pass) -> Any:
        if isinstance(messages, RawJson):
            if p.dry:
                p.gather_json(messages.data.decode("utf-8", "surrogatepass"))
                return messages
            parsed = messages.value()
            new = self._messages(parsed, p)
            return messages if new is parsed else RawJson(orjson.dumps(new))
        if not isinstance(messages, list):
            return messages
        return _each(messages, lambda m: self._message(m, p))

    def _evaluation(self, evaluation: Any, p: _Pass) -> Any:
        if not isinstance(evaluation, dict):
            return evaluation
        out = dict(evaluation)
        if "results" in evaluation:
            out["results"] = self._results(evaluation["results"], p)
        if "report" in evaluation:
            out["report"] = self._report(evaluation["report"], p)
        return out if any(out[k] is not evaluation[k] for k in evaluation) else evaluation

    def _results(self, results: Any, p: _Pass) -> Any:
        return _each_field(results, "reasoning", lambda v: self._strings(v, p))

    def _report(self, report: Any, p: _Pass) -> Any:
        if not isinstance(report, dict) or not isinstance(report.get("classifications"), list):
            return report

        def classification(item: Any) -> Any:
            return _each_field(item, "assessments", lambda a: _each_field(
                a, "explanation", lambda v: self._strings(v, p)), whole=True)  # fmt: skip

        new = _each(report["classifications"], classification)
        return report if new is report["classifications"] else {**report, "classifications": new}

    def _labels(self, labels: Any, p: _Pass) -> Any:
        return _each_field(labels, "comment", lambda v: self._strings(v, p))

    def _metadata(self, metadata: Any, p: _Pass) -> Any:
        return self._structure(metadata, p)


_PLACES: dict[str, Callable[[Redactor, Any, _Pass], Any]] = {
    "evaluation": Redactor._evaluation,
    "human_labels": Redactor._labels,
    "labels": Redactor._labels,  # record schema 2's name of human_labels
    "metadata": Redactor._metadata,
    "report": Redactor._report,  # executions rows carry the report and results on their own
    "results": Redactor._results,
}


# The record layout's fields around the free text, in order (records.TrajectoryRecord): keys
# of our own encoding, which no text can hold (a quote in a string is escaped).
_HEAD_END = b',"evaluation":'
_TAIL_START = b',"agent_version":"'
_TAIL_END = b',"human_labels":['
_TAIL_END_V2 = b',"labels":['  # record schema 2


def _fixed_fields(data: bytes, start: int, end: int) -> list[tuple[int, int]]:
    """Where the line ``data[start:end]`` holds a trajectory record's fields that are never
    redacted: from its start to ``evaluation`` (the first such key: an evaluator named so
    in ``evaluator_scores`` ends the region early, never late), and from the last
    ``agent_version`` key (only ``labels``, whose keys are fixed, comes after it) to
    ``labels`` or the end. Nothing for lines of another shape (a key ``evaluation`` inside a
    ``messages`` row's conversation is not the record's)."""
    regions = []
    head = data.find(_HEAD_END, start, end)
    if (
        head >= 0
        and data.startswith(b'{"trace_id":', start)
        and data.find(b'"messages":', start, head) < 0  # a row of another shape (messages)
    ):
        regions.append((start, head))
        tail = data.rfind(_TAIL_START, head, end)
        if tail >= 0:
            labels = data.find(_TAIL_END, tail, end)
            if labels < 0:
                labels = data.find(_TAIL_END_V2, tail, end)
            regions.append((tail, end if labels < 0 else labels))
    return regions


# --- gathering: the strings of the places above, without copying anything ------------------
# (The same places as Redactor._walk, walked lean: most records hold nothing to redact, and
# this walk is all they cost. A unit test holds the two to the same strings.)


def _gather(record: dict[str, Any], p: _Pass) -> None:
    texts = p.texts
    for key in _MESSAGE_KEYS:
        messages = record.get(key)
        if isinstance(messages, RawJson):
            p.gather_json(messages.data.decode("utf-8", "surrogatepass"))
        elif isinstance(messages, list):
            for message in messages:
                if isinstance(message, dict):
                    _gather_message(message, p)
    evaluation = record.get("evaluation")
    if isinstance(evaluation, dict):
        _gather_results(evaluation.get("results"), texts)
        _gather_report(evaluation.get("report"), texts)
    _gather_results(record.get("results"), texts)
    _gather_report(record.get("report"), texts)
    for key in ("human_labels", "labels"):  # schema 3's name and schema 2's
        labels = record.get(key)
        if isinstance(labels, list):
            texts += [x["comment"] for x in labels if isinstance(x, dict) and isinstance(
                x.get("comment"), str)]  # fmt: skip
    if isinstance(record.get("metadata"), dict | list):
        texts.append(json.dumps(record["metadata"], ensure_ascii=False))


def _gather_message(message: dict[str, Any], p: _Pass) -> None:
    texts = p.texts
    content = message.get("content")
    if isinstance(content, str):
        texts.append(content)
    elif isinstance(content, list):
        _gather_parts(content, p)
    calls = message.get("tool_calls")
    if isinstance(calls, list):
        for call in calls:
            if isinstance(call, dict):
                _gather_call(call.get("function"), p)
    _gather_call(message.get("function_call"), p)
    if isinstance(message.get("metadata"), dict | list):
        texts.append(json.dumps(message["metadata"], ensure_ascii=False))


def _gather_parts(parts: list[Any], p: _Pass) -> None:
    for part in parts:
        if not isinstance(part, dict):
            continue
        if isinstance(part.get("text"), str):
            p.texts.append(part["text"])
        elif part.get("type") == "tool_result":
            inner = part.get("content")
            if isinstance(inner, str):
                p.texts.append(inner)
            elif isinstance(inner, list):
                _gather_parts(inner, p)
        elif part.get("type") == "tool_use" and isinstance(part.get("input"), dict | list):
            p.texts.append(json.dumps(part["input"], ensure_ascii=False))


def _gather_call(function: Any, p: _Pass) -> None:
    if not isinstance(function, dict):
        return
    arguments = function.get("arguments")
    if isinstance(arguments, str):
        p.gather_json(arguments)
    elif isinstance(arguments, dict | list):
        p.texts.append(json.dumps(arguments, ensure_ascii=False))


def _gather_results(results: Any, texts: list[str]) -> None:
    if isinstance(results, list):
        texts += [x["reasoning"] for x in results if isinstance(x, dict) and isinstance(
            x.get("reasoning"), str)]  # fmt: skip


def _gather_report(report: Any, texts: list[str]) -> None:
    if not isinstance(report, dict) or not isinstance(report.get("classifications"), list):
        return
    for item in report["classifications"]:
        assessments = item.get("assessments") if isinstance(item, dict) else None
        if isinstance(assessments, list):
            texts += [a["explanation"] for a in assessments if isinstance(a, dict) and
                      isinstance(a.get("explanation"), str)]  # fmt: skip


_MESSAGE_KEYS = ("messages", "conversation", "prompt", "completion", "chosen", "rejected")


def _each(items: list[Any], fn: Callable[[Any], Any]) -> list[Any]:
    """``[fn(i) for i in items]``, or ``items`` itself when nothing changed."""
    new = [fn(i) for i in items]
    return new if any(a is not b for a, b in zip(new, items, strict=True)) else items


def _each_field(items: Any, key: str, fn: Callable[[Any], Any], *, whole: bool = False) -> Any:
    """For a list of objects (or, ``whole``, one object), ``key`` replaced by ``fn`` of it."""

    def one(item: Any) -> Any:
        if not isinstance(item, dict) or key not in item:
            return item
        new = fn(item[key])
        return item if new is item[key] else {**item, key: new}

    if whole:
        return one(items)
    return _each(items, one) if isinstance(items, list) else items


def warm_up(kinds: Sequence[str] = KINDS) -> None:
    """Import and build the detectors of ``kinds`` now, not on a first request."""
    if "secrets" in kinds:
        secrets_detector()
    if set(kinds) & set(PII_KINDS):
        pii_detector()


@functools.lru_cache(maxsize=32)
def redactor(kinds: tuple[str, ...]) -> Redactor:
    """The redactor of some kinds (made once per process)."""
    return Redactor(kinds)
