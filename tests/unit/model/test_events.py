"""Input event contracts (DESIGN.md section 2): what is accepted, kept and rejected."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from rl_export.model.events import (
    EVENT_MODELS,
    BaseEvent,
    EvaluationFinished,
    EventFamily,
    EventRejection,
    LabelSubmitted,
    RejectReason,
    TraceCompleted,
    decode_event,
    format_utc,
    parse_rfc3339,
)
from tests.factories import event, raw

NOW = datetime(2026, 6, 1, tzinfo=UTC)


def decode(value: dict[str, Any] | bytes, **kw: Any) -> BaseEvent | EventRejection:
    data = value if isinstance(value, bytes) else raw(value)
    kw.setdefault("max_bytes", 1024 * 1024)
    kw.setdefault("now", NOW)
    kw.setdefault("future_tolerance_s", 86400)
    return decode_event(data, **kw)


def rejected(value: dict[str, Any] | bytes, **kw: Any) -> EventRejection:
    result = decode(value, **kw)
    assert isinstance(result, EventRejection), result
    return result


@pytest.mark.parametrize("event_type", sorted(EVENT_MODELS))
def test_every_event_type_decodes_to_its_model(event_type: str) -> None:
    result = decode(event(event_type))
    assert isinstance(result, EVENT_MODELS[event_type])
    assert result.trace_id == "tr-1"
    assert result.occurred_at == datetime(2026, 1, 1, tzinfo=UTC)


def test_unknown_extra_fields_are_kept_at_every_level() -> None:
    result_in = {"evaluator": "j", "score": 1, "passed": True, "reasoning": None, "model": "gpt"}
    value = event("evaluation.finished", source="ci", results=[result_in])
    result = decode(value)
    assert isinstance(result, EvaluationFinished)
    assert result.model_extra == {"source": "ci"}
    assert result.results[0].model_dump()["model"] == "gpt"


def test_messages_pass_through_exactly_as_received() -> None:
    messages = [
        {"role": "system", "content": None},
        {"role": "user", "content": [{"type": "text", "text": "hi"}], "x-extra": 1},
        {"role": "assistant", "tool_calls": [{"id": "c1", "function": {"name": "f"}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "result", "name": "f"},
    ]
    result = decode(event("trace.completed", messages=messages))
    assert isinstance(result, TraceCompleted)
    assert result.messages == messages
    assert "content" not in result.messages[2]  # no nulls filled in


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("2026-01-01T02:00:00+02:00", datetime(2026, 1, 1, tzinfo=UTC)),
        ("2026-01-01t00:00:00z", datetime(2026, 1, 1, tzinfo=UTC)),
        ("2026-01-01 00:00:00.5Z", datetime(2026, 1, 1, 0, 0, 0, 500000, tzinfo=UTC)),
        ("2026-01-01T00:00:00.123456789-00:30", datetime(2026, 1, 1, 0, 30, 0, 123456, UTC)),
    ],
)
def test_rfc3339_dates_are_normalised_to_utc(text: str, expected: datetime) -> None:
    assert parse_rfc3339(text) == expected


@pytest.mark.parametrize(
    "text", ["2026-01-01", "2026-01-01T00:00:00", "yesterday", "2026-02-30T00:00:00Z", 1700000000]
)
def test_dates_without_offset_or_invalid_are_rejected(text: object) -> None:
    with pytest.raises(ValueError, match="date-time"):
        parse_rfc3339(text)


def test_format_utc_uses_z() -> None:
    assert format_utc(datetime(2026, 1, 1, 1, tzinfo=UTC)) == "2026-01-01T01:00:00Z"


@pytest.mark.parametrize(
    ("mutate", "reason", "detail"),
    [
        (lambda e: e["rubric"].update(correctness=6), RejectReason.INVALID, "rubric.correctness"),
        (lambda e: e["rubric"].update(safety=0), RejectReason.INVALID, "rubric.safety"),
        (lambda e: e["rubric"].update(safety=3.0), RejectReason.INVALID, "rubric.safety"),
        (lambda e: e["rubric"].pop("safety"), RejectReason.INVALID, "rubric.safety"),
        (lambda e: e.update(occurred_at="not a date"), RejectReason.INVALID, "occurred_at"),
        (lambda e: e.update(occurred_at="2026-01-01T00:00:00"), RejectReason.INVALID, "offset"),
        (lambda e: e.pop("trace_id"), RejectReason.INVALID, "trace_id"),
        (lambda e: e.update(event_id=""), RejectReason.INVALID, "event_id"),
        (lambda e: e.update(event_type="label.deleted"), RejectReason.UNKNOWN_EVENT_TYPE, "label"),
        (lambda e: e.pop("event_type"), RejectReason.INVALID, "event_type"),
    ],
)
def test_invalid_labels_are_rejected_with_a_reason(mutate: Any, reason: str, detail: str) -> None:
    value = event("label.submitted")
    mutate(value)
    result = rejected(value)
    assert result.reason == reason
    assert detail in result.detail


@pytest.mark.parametrize("score", [1.5, -0.1, "0.5", None])
def test_scores_outside_zero_to_one_are_rejected(score: object) -> None:
    value = event("evaluation.finished")
    value["results"][0]["score"] = score
    assert rejected(value).reason == RejectReason.INVALID


def test_severity_defaults_to_zero_and_must_not_be_negative() -> None:
    value = event("evaluation.finished", report={"outcomes": [{"type": "x", "turn": 1,
                                                               "decision": None}]})  # fmt: skip
    result = decode(value)
    assert isinstance(result, EvaluationFinished)
    assert result.report.outcomes[0].severity == 0
    value["report"]["outcomes"][0]["severity"] = -1
    assert rejected(value).reason == RejectReason.INVALID


def test_a_message_with_an_unknown_role_is_rejected() -> None:
    value = event("trace.completed", messages=[{"role": "robot", "content": "x"}])
    result = rejected(value)
    assert result.reason == RejectReason.INVALID
    assert "messages[0].role" in result.detail


@pytest.mark.parametrize("data", [b"{", b"", b"\xff\xfe", b'{"a": 1'])
def test_bad_json_is_rejected(data: bytes) -> None:
    assert rejected(data).reason == RejectReason.BAD_JSON


def test_json_that_is_not_an_object_is_invalid() -> None:
    assert rejected(b"[1, 2]").reason == RejectReason.INVALID


def test_oversized_events_are_rejected_before_parsing() -> None:
    result = rejected(b"x" * 2000, max_bytes=1024)
    assert result.reason == RejectReason.OVERSIZED
    assert "2000 bytes" in result.detail


def test_events_more_than_the_tolerance_in_the_future_are_rejected() -> None:
    soon = format_utc(NOW + timedelta(hours=23))
    late = format_utc(NOW + timedelta(hours=25))
    assert isinstance(decode(event("label.skipped", at=soon)), BaseEvent)
    assert rejected(event("label.skipped", at=late)).reason == RejectReason.FUTURE


def test_an_event_on_the_wrong_topic_is_rejected() -> None:
    result = rejected(event("label.submitted"), family=EventFamily.TRACES)
    assert result.reason == RejectReason.WRONG_TOPIC
    assert isinstance(decode(event("label.submitted"), family=EventFamily.LABELS), LabelSubmitted)


def test_a_kafka_key_other_than_the_trace_id_is_rejected() -> None:
    assert rejected(event("label.skipped"), key=b"tr-2").reason == RejectReason.KEY_MISMATCH
    assert isinstance(decode(event("label.skipped"), key=b"tr-1"), BaseEvent)


def test_order_key_is_occurred_at_then_event_id() -> None:
    a = decode(event("label.skipped", event_id="b", at="2026-01-01T00:00:00Z"))
    b = decode(event("label.skipped", event_id="a", at="2026-01-01T00:00:01Z"))
    c = decode(event("label.skipped", event_id="c", at="2026-01-01T01:00:00+01:00"))
    assert isinstance(a, BaseEvent)
    assert isinstance(b, BaseEvent)
    assert isinstance(c, BaseEvent)
    assert max([a, b, c], key=BaseEvent.order_key) is b
    assert max([a, c], key=BaseEvent.order_key) is c  # same instant, greater event_id


def test_format_micros_is_format_utc_of_the_instant() -> None:
    import random

    from rl_export.model.events import format_micros, from_micros

    rng = random.Random(3)
    values = [0, -1, 1, 999_999, 1_000_000, -86_400_000_001, 253402300799_999999]
    values += [rng.randrange(-(10**16), 10**17) for _ in range(2000)]
    values += [rng.randrange(0, 10**17) // 1_000_000 * 1_000_000 for _ in range(200)]
    for value in values:
        assert format_micros(value) == format_utc(from_micros(value)), value
