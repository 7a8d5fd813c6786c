"""Input events (docs/reference/schemas.md) as pydantic models, decoded straight from JSON bytes.

Every event carries ``event_id``, ``event_type``, ``occurred_at``, ``org``, ``project`` and
``trace_id``; unknown extra fields are kept. ``decode_event`` turns the raw Kafka value into
one of the models below or an :class:`EventRejection` that says why it cannot be accepted,
which the worker sends to the dead-letter topic.
"""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from typing import Annotated, Any, Literal, Required

import orjson
from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ModelWrapValidatorHandler,
    PlainSerializer,
    PlainValidator,
    StrictBool,
    StrictInt,
    TypeAdapter,
    ValidationError,
    model_validator,
)
from pydantic_core import InitErrorDetails
from typing_extensions import TypedDict

from rl_export.model.rubrics import NAME_PATTERN

# RFC 3339 date-time: a full date, a time with seconds, optional fraction, and an offset.
_RFC3339 = re.compile(
    r"^\d{4}-\d{2}-\d{2}[Tt ]\d{2}:\d{2}:\d{2}(\.\d{1,9})?([Zz]|[+-]\d{2}:\d{2})$"
)


def parse_rfc3339(value: Any) -> datetime:
    """Parse an RFC 3339 timestamp (offset or ``Z`` required) and normalise it to UTC."""
    if isinstance(value, datetime):
        if value.tzinfo is None:
            raise ValueError("datetime has no UTC offset")
        return value.astimezone(UTC)
    if not isinstance(value, str) or not _RFC3339.match(value):
        raise ValueError("expected an RFC 3339 date-time with offset, e.g. 2026-01-31T12:00:00Z")
    text = value.replace("t", "T").replace("z", "Z")
    head, sep, tail = text.partition(".")
    if sep:  # Python keeps microseconds: cut a longer fraction, keep the offset.
        digits = re.match(r"\d+", tail)
        assert digits is not None  # guaranteed by _RFC3339
        text = f"{head}.{digits.group()[:6]}{tail[digits.end() :]}"
    try:
        return datetime.fromisoformat(text).astimezone(UTC)
    except ValueError as exc:  # e.g. month 13: the shape matched, the calendar did not
        raise ValueError(f"not a valid date-time: {exc}") from None


EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def micros(value: datetime) -> int:
    """Microseconds since the epoch of an aware datetime, exactly (no float rounding)."""
    delta = value - EPOCH
    return (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds


def from_micros(value: int) -> datetime:
    """Inverse of :func:`micros`."""
    return EPOCH + timedelta(microseconds=value)


_DAYS: dict[int, str] = {}  # days since the epoch -> "YYYY-MM-DD" (a small, hot set)
_UNIX_ORDINAL = date(1970, 1, 1).toordinal()


def format_micros(value: int) -> str:
    """``format_utc(from_micros(value))``, without building a datetime: the join formats
    ``updated_at`` for every snapshot."""
    seconds, fraction = divmod(value, 1_000_000)
    days, seconds = divmod(seconds, 86_400)
    day = _DAYS.get(days)
    if day is None:
        if len(_DAYS) > 4096:
            _DAYS.clear()
        day = _DAYS[days] = date.fromordinal(_UNIX_ORDINAL + days).isoformat()
    hours, seconds = divmod(seconds, 3600)
    minutes, seconds = divmod(seconds, 60)
    if fraction:
        return f"{day}T{hours:02d}:{minutes:02d}:{seconds:02d}.{fraction:06d}Z"
    return f"{day}T{hours:02d}:{minutes:02d}:{seconds:02d}Z"


def format_utc(value: datetime) -> str:
    """Format a datetime as ISO 8601 in UTC with a ``Z`` suffix (the output convention)."""
    return value.astimezone(UTC).isoformat().replace("+00:00", "Z")


UtcDatetime = Annotated[
    datetime,
    BeforeValidator(parse_rfc3339),
    PlainSerializer(format_utc, return_type=str, when_used="json-unless-none"),
]
NonEmptyStr = Annotated[str, Field(min_length=1)]


class _Open(BaseModel):
    """A nested object whose unknown fields are kept."""

    model_config = ConfigDict(extra="allow", frozen=True)


class Message(TypedDict, total=False):
    """The shape of one chat message, checked; the event keeps the original object.

    A TypedDict checked with ``validate_python`` on the parsed list: pydantic-core checks the
    known keys without building a model per message, and the event keeps the dicts as
    parsed, so keys stay in their order and absent keys stay absent.
    """

    __pydantic_config__ = ConfigDict(extra="ignore")  # type: ignore[misc]

    role: Required[Literal["system", "user", "assistant", "tool"]]
    content: str | list[Any] | None
    name: str | None
    tool_calls: list[Any] | None
    tool_call_id: str | None


_MESSAGE_LIST: TypeAdapter[list[Message]] = TypeAdapter(list[Message])


def _check_messages(value: list[dict[str, Any]]) -> list[dict[str, Any]]:
    try:
        _MESSAGE_LIST.validate_python(value)  # one call into pydantic-core for the list
    except ValidationError as exc:
        first = exc.errors()[0]
        raise ValueError(f"{_path(('messages', *first['loc']))}: {first['msg']}") from None
    return value


# Messages pass through exactly as received: checked, never rebuilt.
Messages = Annotated[list[dict[str, Any]], AfterValidator(_check_messages)]


class Attachment(_Open):
    """A reference to a file kept elsewhere (never its content)."""

    name: NonEmptyStr
    uri: NonEmptyStr
    content_type: str
    size: StrictInt = Field(ge=0)


class EvaluatorResult(_Open):
    """One evaluator's verdict on a trace."""

    evaluator: NonEmptyStr
    score: float = Field(ge=0.0, le=1.0, allow_inf_nan=False, strict=True)
    passed: StrictBool
    reasoning: str | None = None


class Outcome(_Open):
    type: str
    turn: StrictInt | None = None
    decision: StrictBool | None = None
    severity: StrictInt = Field(0, ge=0)


class Assessment(_Open):
    principle_id: str
    decision: StrictBool | str | None = None
    explanation: str | None = None


class Classification(_Open):
    type: str
    turn: StrictInt | None = None
    assessments: list[Assessment] = Field(default_factory=list)


class Report(_Open):
    outcomes: list[Outcome] = Field(default_factory=list)
    classifications: list[Classification] = Field(default_factory=list)


class Rubric(BaseModel):
    """The four human ratings, each an integer 1..5."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    correctness: StrictInt = Field(ge=1, le=5)
    helpfulness: StrictInt = Field(ge=1, le=5)
    efficiency: StrictInt = Field(ge=1, le=5)
    safety: StrictInt = Field(ge=1, le=5)

    def total(self) -> int:
        """Sum of the four ratings (4..20)."""
        return self.correctness + self.helpfulness + self.efficiency + self.safety


class BaseEvent(BaseModel):
    """Fields every event carries; unknown extra fields are kept."""

    model_config = ConfigDict(extra="allow", frozen=True)

    event_id: NonEmptyStr
    occurred_at: UtcDatetime
    org: NonEmptyStr
    project: NonEmptyStr
    trace_id: NonEmptyStr

    def order_key(self) -> tuple[datetime, str]:
        """Return the key that defines "latest": ``occurred_at``, then ``event_id``."""
        return (self.occurred_at, self.event_id)


class TraceCompleted(BaseEvent):
    event_type: Literal["trace.completed"]
    agent_version: str
    scenario: str
    messages: Messages
    spans: list[Any] | None = None
    metadata: dict[str, Any] = Field(default_factory=dict)
    attachments: list[Attachment] = Field(default_factory=list)


class TraceDeleted(BaseEvent):
    event_type: Literal["trace.deleted"]


class EvaluationFinished(BaseEvent):
    event_type: Literal["evaluation.finished"]
    evaluation_id: NonEmptyStr
    results: list[EvaluatorResult]
    report: Report = Field(default_factory=Report)


def _answer(value: Any) -> bool | int | str:
    if type(value) not in (bool, int, str):
        raise ValueError("an answer is an integer, true or false, or a string")
    return value  # type: ignore[no-any-return]


AnswerName = Annotated[str, Field(pattern=NAME_PATTERN)]
Answer = Annotated[
    bool | int | str,
    PlainValidator(_answer, json_schema_input_type=bool | int | str),
]
Answers = dict[AnswerName, Answer]
"""A label's answers by question name (docs/guides/rubrics.md); their fit to the rubric version
they name is checked by the join (reason ``invalid_rubric``), but for version 0's, here."""
LabelKind = Literal["label", "adjudication"]

_RUBRIC_0: TypeAdapter[Rubric] = TypeAdapter(Rubric)


def _version_0_schema(schema: dict[str, Any]) -> None:
    """In the JSON Schema: without ``rubric_version`` (or with 0) the answers are the four
    ratings."""
    ratings = Rubric.model_json_schema()
    ratings.pop("title", None)
    schema["if"] = {"properties": {"rubric_version": {"enum": [0, None]}}}
    schema["then"] = {"properties": {"rubric": ratings}}


class LabelSubmitted(BaseEvent):
    """A label: answers to a version of the project's rubric (absent: version 0, the four
    ratings, checked here), or with ``kind: adjudication`` a reviewer's decision."""

    model_config = ConfigDict(json_schema_extra=_version_0_schema)

    event_type: Literal["label.submitted"]
    labeler: NonEmptyStr
    rubric: Answers
    comment: str | None = None
    rubric_version: StrictInt | None = Field(None, ge=0, description="Absent: 0.")
    kind: LabelKind | None = Field(None, description="Absent: label.")

    @model_validator(mode="wrap")
    @classmethod
    def _version_0(cls, data: Any, handler: ModelWrapValidatorHandler[LabelSubmitted]) -> Any:
        """Version 0's answers are the four ratings: checked as :class:`Rubric` checks them,
        with the same errors (``rubric.correctness: ...``)."""
        event = handler(data)
        if event.version == 0:
            try:
                _RUBRIC_0.validate_python(event.rubric)
            except ValidationError as exc:
                raise ValidationError.from_exception_data(cls.__name__, [
                    InitErrorDetails(type=e["type"], loc=("rubric", *e["loc"]),
                                     input=e["input"], ctx=e.get("ctx", {}))
                    for e in exc.errors()
                ]) from None  # fmt: skip
        return event

    @property
    def version(self) -> int:
        """The rubric version the answers are for (absent: 0)."""
        return self.rubric_version or 0

    @property
    def adjudication(self) -> bool:
        return self.kind == "adjudication"

    def rating_sum(self) -> int | None:
        """The sum of a version-0 label's four ratings (None for another version's)."""
        if self.version != 0:
            return None
        return sum(int(self.rubric[name]) for name in Rubric.model_fields)


class LabelSkipped(BaseEvent):
    event_type: Literal["label.skipped"]
    labeler: NonEmptyStr


class LabelRetracted(BaseEvent):
    event_type: Literal["label.retracted"]
    labeler: NonEmptyStr


class LabelCompared(BaseEvent):
    """A labeler's choice between two traces of one org/project (section 12): ``trace_id``
    is ``trace_a``, the smaller id. The web service publishes it; the join's handling (both
    traces, any arrival order) is the stream's."""

    event_type: Literal["label.compared"]
    labeler: NonEmptyStr
    trace_a: NonEmptyStr
    trace_b: NonEmptyStr
    choice: Literal["a", "b", "tie", "both_bad"]
    strength: StrictInt | None = Field(None, ge=1, le=3)
    rubric: dict[str, Any] | None = None
    rubric_version: StrictInt | None = Field(None, ge=0)
    comment: str | None = None


Event = Annotated[
    TraceCompleted
    | TraceDeleted
    | EvaluationFinished
    | LabelSubmitted
    | LabelSkipped
    | LabelRetracted,
    Field(discriminator="event_type"),
]
EVENT_ADAPTER: TypeAdapter[Event] = TypeAdapter(Event)

EVENT_MODELS: dict[str, type[BaseEvent]] = {
    "trace.completed": TraceCompleted,
    "trace.deleted": TraceDeleted,
    "evaluation.finished": EvaluationFinished,
    "label.submitted": LabelSubmitted,
    "label.skipped": LabelSkipped,
    "label.retracted": LabelRetracted,
}


class EventFamily(enum.StrEnum):
    """Which input topic carries an event type (the setting names the topic itself)."""

    TRACES = "traces"
    EVALUATIONS = "evaluations"
    LABELS = "labels"


FAMILY_OF_TYPE: dict[str, EventFamily] = {
    "trace.completed": EventFamily.TRACES,
    "trace.deleted": EventFamily.TRACES,
    "evaluation.finished": EventFamily.EVALUATIONS,
    "label.submitted": EventFamily.LABELS,
    "label.skipped": EventFamily.LABELS,
    "label.retracted": EventFamily.LABELS,
}


class RejectReason(enum.StrEnum):
    """Why an event went to the dead-letter topic (a bounded label for metrics)."""

    BAD_JSON = "bad_json"
    UNKNOWN_EVENT_TYPE = "unknown_event_type"
    WRONG_TOPIC = "wrong_topic"
    INVALID = "invalid"
    OVERSIZED = "oversized"
    FUTURE = "future"
    KEY_MISMATCH = "key_mismatch"
    ORG_MISMATCH = "org_mismatch"
    INVALID_RUBRIC = "invalid_rubric"


@dataclass(frozen=True)
class EventRejection:
    """An event that cannot be accepted, with the reason and a human-readable detail."""

    reason: RejectReason
    detail: str


# pydantic's JSON parser accepts NaN and Infinity, and integers of any size; neither can be
# written back as standard JSON by orjson. Events that may hold them get a strict parse.
# The checks are memchr-fast: a substring test, and 19 digits in a row after mapping every
# digit to "0" (a C-level translate), instead of a regex over every digit run.
_DIGITS_TO_ZERO = bytes.maketrans(b"0123456789", b"0000000000")
_NINETEEN_DIGITS = b"0" * 19


def long_digit_run(raw: bytes) -> bool:
    """True when the bytes hold 19 digits in a row: maybe an integer beyond 64 bits."""
    return _NINETEEN_DIGITS in raw.translate(_DIGITS_TO_ZERO)


def suspect(raw: bytes) -> bool:
    """True when the bytes may hold NaN, Infinity or an integer beyond 64 bits."""
    return b"NaN" in raw or b"Infinity" in raw or long_digit_run(raw)


def _strict_json_problem(raw: bytes, event: BaseEvent) -> EventRejection | None:
    if not suspect(raw):
        return None
    try:
        orjson.loads(raw)  # refuses NaN and Infinity
    except orjson.JSONDecodeError as exc:
        return EventRejection(RejectReason.BAD_JSON, f"not valid JSON: {exc}")
    try:
        orjson.dumps(event.model_dump())  # refuses integers beyond 64 bits
    except TypeError as exc:
        return EventRejection(RejectReason.INVALID, f"cannot be stored: {exc}")
    return None


def _path(loc: tuple[int | str, ...]) -> str:
    """A field path as a reader writes it: ``messages[0].role``."""
    path = ""
    for part in loc:
        path += f"[{part}]" if isinstance(part, int) else f".{part}" if path else part
    return path or "event"


def _describe(exc: ValidationError) -> tuple[RejectReason, str]:
    errors = exc.errors(include_url=False)
    first = errors[0]
    kind = first["type"]
    if kind == "json_invalid":
        return RejectReason.BAD_JSON, f"not valid JSON: {first['msg']}"
    if kind == "dict_type" and not first["loc"]:
        return RejectReason.INVALID, "the event is valid JSON but not a JSON object"
    if kind == "union_tag_not_found":
        return RejectReason.INVALID, "event_type is missing"
    if kind == "union_tag_invalid":
        ctx = first.get("ctx") or {}
        return RejectReason.UNKNOWN_EVENT_TYPE, f"unknown event_type {ctx.get('tag')!r}"
    parts = []
    for err in errors[:3]:
        # loc starts with the union tag ("label.submitted"); drop it from the path.
        message = str(err["msg"]).removeprefix("Value error, ")
        parts.append(f"{_path(err['loc'][1:])}: {message}")
    more = f" (and {len(errors) - 3} more)" if len(errors) > 3 else ""
    return RejectReason.INVALID, "; ".join(parts) + more


def decode_event(
    raw: bytes,
    *,
    max_bytes: int,
    now: datetime,
    future_tolerance_s: float,
    key: bytes | None = None,
    family: EventFamily | None = None,
) -> BaseEvent | EventRejection:
    """Decode and check one Kafka value; never raises for bad input.

    Checks, in order: size, JSON and schema (pydantic parses the bytes itself; NaN,
    Infinity and integers beyond 64 bits are refused, as orjson cannot write them), that the
    event type belongs on the topic it came from, that the Kafka key is the ``trace_id``,
    and that ``occurred_at`` is not further in the future than the tolerance.
    """
    if len(raw) > max_bytes:
        return EventRejection(
            RejectReason.OVERSIZED, f"event is {len(raw)} bytes, the limit is {max_bytes}"
        )
    try:
        event: BaseEvent = EVENT_ADAPTER.validate_json(raw)
    except ValidationError as exc:
        reason, detail = _describe(exc)
        return EventRejection(reason, detail)
    problem = _strict_json_problem(raw, event)
    if problem is not None:
        return problem
    event_type: str = getattr(event, "event_type")  # noqa: B009 - every union member has it
    rejection = placement_rejection(
        event_type, event.trace_id, event.occurred_at,
        family=family, key=key, now=now, future_tolerance_s=future_tolerance_s,
    )  # fmt: skip
    return event if rejection is None else rejection


def placement_rejection(
    event_type: str,
    trace_id: str,
    occurred_at: datetime,
    *,
    family: EventFamily | None,
    key: bytes | None,
    now: datetime,
    future_tolerance_s: float,
) -> EventRejection | None:
    """The checks after the schema, on a valid event: the topic it came from, its Kafka
    key, its clock. Shared by :func:`decode_event` and the join's fast path."""
    if family is not None and FAMILY_OF_TYPE[event_type] is not family:
        return EventRejection(
            RejectReason.WRONG_TOPIC, f"{event_type} does not belong on the {family} topic"
        )
    if key is not None and key != trace_id.encode():
        return EventRejection(
            RejectReason.KEY_MISMATCH,
            f"Kafka key {key[:80]!r} is not the trace_id {trace_id[:80]!r}",
        )
    ahead = (occurred_at - now).total_seconds()
    if ahead > future_tolerance_s:
        return EventRejection(
            RejectReason.FUTURE,
            f"occurred_at {format_utc(occurred_at)} is {ahead:.0f}s ahead of the "
            f"worker's clock (tolerance {future_tolerance_s:.0f}s)",
        )
    return None


def redecode(raw: bytes) -> BaseEvent | EventRejection:
    """Decode again the bytes of an event :func:`decode_event` accepted before.

    For events that waited for their trace: only the schema is checked again (it is the one
    check whose rules could have changed since); size, strict JSON, topic, key and clock
    were checked on arrival, on these same bytes.
    """
    try:
        event: BaseEvent = EVENT_ADAPTER.validate_json(raw)
    except ValidationError as exc:
        reason, detail = _describe(exc)
        return EventRejection(reason, detail)
    return event


def event_type_of(event: BaseEvent) -> str:
    """Return the ``event_type`` of a decoded event."""
    value: str = getattr(event, "event_type")  # noqa: B009 - declared on every subclass
    return value
