"""What the join needs of an input event, decoded on a fast path the pydantic models check.

The pydantic models of :mod:`rl_export.model.events` are the contract: the JSON Schemas,
the API and every dead letter's reason come from them. Validating every event through them
is most of what decoding costs, though, and the join needs only a little of each event in a
form it stores as is. :func:`read_event` therefore decodes with msgspec structs that mirror
the models (:class:`_TraceCompleted` and friends) into an :class:`EventView`:

1. An event msgspec accepts (so there is no NaN or Infinity in it, which msgspec's JSON
   parser refuses), whose bytes hold no integer orjson could not write back (no run of 19
   digits), becomes a view directly: nested objects (attachments,
   results, the report) are dumped exactly as the models dump them (declared fields in
   declaration order, defaults filled in, unknown fields after them).
2. Anything else goes through :func:`~rl_export.model.events.decode_event` (pydantic): the
   event is accepted or rejected, with its reason, exactly as the models say.

So the models stay the one source of truth: the fast path only ever accepts what they accept
and yields what they yield, which ``tests/unit/model/test_eventview.py`` checks on every
event shape the tests know, on generated ones, and on every rejection case.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime
from typing import Annotated, Any, Literal

import msgspec
import orjson

from rl_export.model.events import (
    BaseEvent,
    EvaluationFinished,
    EventFamily,
    EventRejection,
    LabelCompared,
    LabelRetracted,
    LabelSkipped,
    LabelSubmitted,
    LabelUncompared,
    PairEvent,
    RejectReason,
    TraceCompleted,
    decode_event,
    long_digit_run,
    micros,
    parse_rfc3339,
    placement_rejection,
)


@dataclass(slots=True)
class EventView:
    """One accepted event as the join applies it: identity, time, and the payload it stores.

    ``micros`` is ``occurred_at`` in microseconds since the epoch (exact). Payload fields are
    set for their event type only: ``messages`` (the conversation as compact JSON, parsed and
    written back once), ``metadata`` (the trace's object as compact JSON, its keys in the
    order received), ``attachments`` / ``results`` / ``report`` as the models dump them,
    ``rubric`` as (correctness, helpfulness, efficiency, safety) and the label's ``comment``.
    A label of another rubric version than 0, or an adjudication, has ``rubric`` None and its
    ``answers`` as given instead, with its ``rubric_version`` and ``kind``.
    """

    event_type: str
    event_id: str
    micros: int
    org: str
    project: str
    trace_id: str
    agent_version: str = ""
    scenario: str = ""
    messages: bytes = b""
    attachments: list[dict[str, Any]] | None = None
    metadata: bytes = b"{}"
    evaluation_id: str = ""
    results: list[dict[str, Any]] | None = None
    report: dict[str, Any] | None = None
    labeler: str = ""
    rubric: tuple[int, int, int, int] | None = None
    comment: str | None = None
    answers: dict[str, Any] | None = None
    rubric_version: int = 0
    kind: str = "label"
    pair: PairView | None = None  # a pair event's (label.compared, label.uncompared, pair.void)


@dataclass(slots=True)
class PairView:
    """What the join keeps of a pair event: the pair, which side this copy is for (its
    ``trace_id``'s), and a comparison's choice, strength and answers (None: a retraction or
    a notice). The labeler and the comment are the :class:`EventView`'s."""

    trace_a: str
    trace_b: str
    mirror: bool = False
    choice: str | None = None
    strength: int | None = None
    answers: dict[str, Any] | None = None
    rubric_version: int | None = None


def view_of(event: BaseEvent) -> EventView:
    """The view of an event the pydantic models decoded (the authoritative path)."""
    event_type: str = getattr(event, "event_type")  # noqa: B009 - every subclass has it
    view = EventView(
        event_type, event.event_id, micros(event.occurred_at), event.org, event.project,
        event.trace_id,
    )  # fmt: skip
    if isinstance(event, TraceCompleted):
        view.agent_version = event.agent_version
        view.scenario = event.scenario
        view.messages = orjson.dumps(event.messages)
        view.attachments = [a.model_dump(mode="json") for a in event.attachments]
        view.metadata = orjson.dumps(event.metadata)
    elif isinstance(event, EvaluationFinished):
        view.evaluation_id = event.evaluation_id
        view.results = [r.model_dump(mode="json", exclude_unset=True) for r in event.results]
        view.report = event.report.model_dump(mode="json")
    elif isinstance(event, LabelSubmitted):
        view.labeler = event.labeler
        view.comment = event.comment
        view.rubric_version = event.version
        view.kind = event.kind or "label"
        r = event.rubric
        if view.rubric_version == 0 and view.kind == "label":
            view.rubric = (r["correctness"], r["helpfulness"], r["efficiency"], r["safety"])  # type: ignore[assignment]
        else:
            view.answers = dict(r)
    elif isinstance(event, LabelSkipped | LabelRetracted):
        view.labeler = event.labeler
    elif isinstance(event, PairEvent):
        pair = view.pair = PairView(event.trace_a, event.trace_b, bool(event.mirror))
        if isinstance(event, LabelCompared):
            view.comment = event.comment
            pair.choice, pair.strength = event.choice, event.strength
            pair.answers = None if event.rubric is None else dict(event.rubric)
            pair.rubric_version = event.rubric_version
        if isinstance(event, LabelCompared | LabelUncompared):
            view.labeler = event.labeler
    return view


# --- the msgspec mirror of the models -----------------------------------------------------

_NonEmpty = Annotated[str, msgspec.Meta(min_length=1)]
_Rating = Annotated[int, msgspec.Meta(ge=1, le=5)]
_NULL = msgspec.Raw(b"null")
_Role = Literal["system", "user", "assistant", "tool"]


class _Base(msgspec.Struct, tag_field="event_type"):
    """Fields every event carries; unknown fields are skipped (the join keeps none)."""

    event_id: _NonEmpty
    occurred_at: str
    org: _NonEmpty
    project: _NonEmpty
    trace_id: _NonEmpty


class _Message(msgspec.Struct):
    """The checked keys of a message (the conversation itself is kept as parsed)."""

    role: _Role
    content: str | list[Any] | None = None
    name: str | None = None
    tool_calls: list[Any] | None = None
    tool_call_id: str | None = None


class _TraceCompleted(_Base, tag="trace.completed"):
    agent_version: str
    scenario: str
    messages: msgspec.Raw
    spans: msgspec.Raw = _NULL  # a list or null: checked by its first byte
    metadata: msgspec.Raw = _NULL  # an object (null is not allowed: checked)
    attachments: list[dict[str, Any]] = msgspec.field(default_factory=list)


class _TraceDeleted(_Base, tag="trace.deleted"):
    pass


class _EvaluationFinished(_Base, tag="evaluation.finished"):
    evaluation_id: _NonEmpty
    results: list[dict[str, Any]]
    report: dict[str, Any] = msgspec.field(default_factory=dict)


class _Rubric(msgspec.Struct, forbid_unknown_fields=True):
    correctness: _Rating
    helpfulness: _Rating
    efficiency: _Rating
    safety: _Rating


class _LabelSubmitted(_Base, tag="label.submitted"):
    labeler: _NonEmpty
    rubric: _Rubric
    comment: str | None = None
    rubric_version: int | None = None  # only a version-0 label is decoded here
    kind: str | None = None  # only a label (not an adjudication)


class _LabelSkipped(_Base, tag="label.skipped"):
    labeler: _NonEmpty


class _LabelRetracted(_Base, tag="label.retracted"):
    labeler: _NonEmpty


_Any = (
    _TraceCompleted | _TraceDeleted | _EvaluationFinished | _LabelSubmitted | _LabelSkipped
    | _LabelRetracted
)  # fmt: skip
_DECODER = msgspec.json.Decoder(_Any)
_TYPES: dict[type, str] = {
    _TraceCompleted: "trace.completed",
    _TraceDeleted: "trace.deleted",
    _EvaluationFinished: "evaluation.finished",
    _LabelSubmitted: "label.submitted",
    _LabelSkipped: "label.skipped",
    _LabelRetracted: "label.retracted",
}
_MESSAGES = msgspec.json.Decoder(list[_Message])


class _Slow(Exception):
    """The fast path cannot decide: the models must (rare: bad or unusual input)."""


def _str(value: Any, *, empty: bool = True) -> str:
    if type(value) is not str or (not empty and not value):
        raise _Slow
    return value


def _int(value: Any, minimum: int | None = None) -> int:
    if type(value) is not int or (minimum is not None and value < minimum):
        raise _Slow
    return value


def _opt(value: Any, kind: type) -> Any:
    if value is not None and type(value) is not kind:
        raise _Slow
    return value


def _dump(obj: Any, declared: tuple[str, ...], fill: dict[str, Any] | None) -> dict[str, Any]:
    """A nested object as its model dumps it: declared fields in order (``fill`` gives the
    defaults of those not set; None means only the set ones, as ``exclude_unset``), then the
    unknown ones in their order."""
    if type(obj) is not dict:
        raise _Slow
    out = {}
    for key in declared:
        if key in obj:
            out[key] = obj[key]
        elif fill is not None:
            out[key] = fill[key]
    if len(out) != len(obj) or fill is not None:
        for key, value in obj.items():
            if key not in out:
                out[key] = value
    return out


_ATTACHMENT = ("name", "uri", "content_type", "size")
_RESULT = ("evaluator", "score", "passed", "reasoning")
_OUTCOME = ("type", "turn", "decision", "severity")
_OUTCOME_FILL = {"turn": None, "decision": None, "severity": 0}
_CLASSIFICATION = ("type", "turn", "assessments")
_ASSESSMENT = ("principle_id", "decision", "explanation")
_ASSESSMENT_FILL = {"decision": None, "explanation": None}


def _attachment(obj: Any) -> dict[str, Any]:
    out = _dump(obj, _ATTACHMENT, None)
    if not all(k in out for k in _ATTACHMENT) or type(out["content_type"]) is not str:
        raise _Slow  # every declared field is required
    _str(out["name"], empty=False)
    _str(out["uri"], empty=False)
    _int(out["size"], 0)
    return out


def _result(obj: Any) -> dict[str, Any]:
    out = _dump(obj, _RESULT, None)
    _str(out.get("evaluator"), empty=False)
    score = out.get("score")
    if type(score) is int:  # a JSON integer: the model keeps it as a float
        score = out["score"] = float(score)
    if type(score) is not float or not 0.0 <= score <= 1.0:
        raise _Slow
    if type(out.get("passed")) is not bool:
        raise _Slow
    _opt(out.get("reasoning"), str)
    return out


def _outcome(obj: Any) -> dict[str, Any]:
    out = _dump(obj, _OUTCOME, {"type": None, **_OUTCOME_FILL})
    _str(out["type"])
    _opt(out["turn"], int)
    _opt(out["decision"], bool)
    _int(out["severity"], 0)
    return out


def _assessment(obj: Any) -> dict[str, Any]:
    out = _dump(obj, _ASSESSMENT, {"principle_id": None, **_ASSESSMENT_FILL})
    _str(out["principle_id"])
    if out["decision"] is not None and type(out["decision"]) not in (bool, str):
        raise _Slow
    _opt(out["explanation"], str)
    return out


def _classification(obj: Any) -> dict[str, Any]:
    out = _dump(obj, _CLASSIFICATION, {"type": None, "turn": None, "assessments": []})
    _str(out["type"])
    _opt(out["turn"], int)
    if type(out["assessments"]) is not list:
        raise _Slow
    out["assessments"] = [_assessment(a) for a in out["assessments"]]
    return out


def _report(obj: Any) -> dict[str, Any]:
    out = _dump(obj, ("outcomes", "classifications"), {"outcomes": [], "classifications": []})
    if type(out["outcomes"]) is not list or type(out["classifications"]) is not list:
        raise _Slow
    out["outcomes"] = [_outcome(o) for o in out["outcomes"]]
    out["classifications"] = [_classification(c) for c in out["classifications"]]
    return out


_CANONICAL_TIME = re.compile(r"\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}Z")


def _occurred(text: str) -> datetime:
    """``parse_rfc3339``, quicker for the usual ``YYYY-MM-DDTHH:MM:SSZ``."""
    try:
        if len(text) == 20 and _CANONICAL_TIME.fullmatch(text):
            return datetime.fromisoformat(text)  # already UTC
        return parse_rfc3339(text)
    except ValueError:
        raise _Slow from None


def _fast(raw: bytes) -> tuple[EventView, datetime]:
    """The fast path; raises :class:`_Slow` when the models must decide."""
    try:
        event = _DECODER.decode(raw)
    except (msgspec.ValidationError, msgspec.DecodeError):
        raise _Slow from None
    if long_digit_run(raw):  # maybe an integer beyond 64 bits: the models say what to do
        raise _Slow
    occurred = _occurred(event.occurred_at)
    view = EventView(
        _TYPES[type(event)], event.event_id, micros(occurred), event.org, event.project,
        event.trace_id,
    )  # fmt: skip
    if isinstance(event, _LabelSubmitted):
        if event.rubric_version or event.kind not in (None, "label"):
            raise _Slow  # another rubric version, or an adjudication: the models decide
        view.labeler = event.labeler
        r = event.rubric
        view.rubric = (r.correctness, r.helpfulness, r.efficiency, r.safety)
        view.comment = event.comment
    elif isinstance(event, _LabelSkipped | _LabelRetracted):
        view.labeler = event.labeler
    elif isinstance(event, _TraceCompleted):
        spans, metadata = memoryview(event.spans), memoryview(event.metadata)
        if (spans[:1].tobytes() != b"[" and spans.tobytes() != b"null") or (
            metadata[:1].tobytes() != b"{" and event.metadata is not _NULL
        ):
            raise _Slow  # spans must be a list or null, metadata an object (or absent)
        try:
            _MESSAGES.decode(event.messages)
            view.messages = orjson.dumps(orjson.loads(memoryview(event.messages)))
            if event.metadata is not _NULL:
                view.metadata = orjson.dumps(orjson.loads(metadata))
        except (msgspec.ValidationError, msgspec.DecodeError, orjson.JSONDecodeError):
            # Raw kept what it did not decode: a lone surrogate or bytes that are not UTF-8
            # in the conversation or the metadata. The models say what they are.
            raise _Slow from None
        view.agent_version = event.agent_version
        view.scenario = event.scenario
        view.attachments = [_attachment(a) for a in event.attachments]
    elif isinstance(event, _EvaluationFinished):
        view.evaluation_id = event.evaluation_id
        view.results = [_result(r) for r in event.results]
        view.report = _report(event.report)
    return view, occurred


def read_event(
    raw: bytes,
    *,
    max_bytes: int,
    now: datetime,
    future_tolerance_s: float,
    key: bytes | None = None,
    family: EventFamily | None = None,
) -> EventView | EventRejection:
    """Decode and check one Kafka value into the view the join applies; never raises.

    The checks and their order are :func:`~rl_export.model.events.decode_event`'s: size,
    JSON and schema, topic, key, clock. An event that fails one gets the models' reason.
    """
    if len(raw) > max_bytes:
        return EventRejection(
            RejectReason.OVERSIZED, f"event is {len(raw)} bytes, the limit is {max_bytes}"
        )
    try:
        view, occurred = _fast(raw)
    except _Slow:
        try:
            decoded = decode_event(
                raw, max_bytes=max_bytes, now=now, future_tolerance_s=future_tolerance_s,
                key=key, family=family,
            )  # fmt: skip
        except (RecursionError, TypeError) as exc:
            return _too_deep(exc)
        return decoded if isinstance(decoded, EventRejection) else view_of(decoded)
    except (RecursionError, TypeError) as exc:
        return _too_deep(exc)
    rejection = placement_rejection(
        view.event_type, view.trace_id, occurred,
        family=family, key=key, now=now, future_tolerance_s=future_tolerance_s,
    )  # fmt: skip
    return view if rejection is None else rejection


def reread_event(raw: bytes) -> EventView | EventRejection:
    """Decode again an event accepted before (one that waited for its trace): only the
    schema is checked again, as :func:`~rl_export.model.events.redecode` does."""
    try:
        view, _ = _fast(raw)
    except _Slow:
        from rl_export.model.events import redecode

        try:
            decoded = redecode(raw)
        except (RecursionError, TypeError) as exc:
            return _too_deep(exc)
        return decoded if isinstance(decoded, EventRejection) else view_of(decoded)
    except (RecursionError, TypeError) as exc:
        return _too_deep(exc)
    return view


def _too_deep(exc: RecursionError | TypeError) -> EventRejection:
    """The rejection of JSON nested deeper than the parsers go (orjson stops at 254 levels
    with a TypeError, msgspec and pydantic with a RecursionError): such an event would
    otherwise raise out of the decoder on every retry and stop its partition. Any other
    TypeError is a bug of ours and raised again."""
    if isinstance(exc, TypeError) and "recursion" not in str(exc).lower():
        raise exc
    return EventRejection(RejectReason.BAD_JSON, "JSON nested too deeply to decode")
