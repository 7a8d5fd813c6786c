"""The join's fast decoding path agrees with the pydantic models, which stay the contract.

:func:`read_event` decodes with msgspec structs that mirror the models and falls back to the
models for anything it cannot decide. Here every event the tests know, generated ones with
unknown fields and missing optional ones at every level, and every rejection case go through
both, and must come out the same: the same view for an accepted event (the same bytes in
every record, then), the same reason and detail for a rejected one.
"""

from __future__ import annotations

import copy
from datetime import UTC, datetime
from typing import Any

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rl_export.local.synthetic import SHAPES, generate
from rl_export.model.events import (
    EVENT_MODELS,
    PAIR_EVENT_TYPES,
    EventFamily,
    EventRejection,
    RejectReason,
    decode_event,
)
from rl_export.model.eventview import EventView, _fast, _Slow, read_event, reread_event, view_of
from tests.factories import event
from tests.unit.corpora.test_records_unchanged import special_events

NOW = datetime(2026, 6, 1, tzinfo=UTC)
KW: dict[str, Any] = {"max_bytes": 1 << 20, "now": NOW, "future_tolerance_s": 86400.0}


def both(raw: bytes, **kw: Any) -> tuple[Any, Any]:
    """(the fast path's answer, the models' answer as a view or a rejection)."""
    args = KW | kw
    fast = read_event(raw, **args)
    model = decode_event(raw, **args)
    return fast, model if isinstance(model, EventRejection) else view_of(model)


def assert_same(raw: bytes, **kw: Any) -> Any:
    fast, model = both(raw, **kw)
    assert fast == model
    return fast


def test_synthetic_traffic_takes_the_fast_path_and_agrees() -> None:
    events = (
        generate(150, seed=3, shape=SHAPES["standard"], duplicate_rate=0)
        + generate(150, seed=4, shape=SHAPES["small"], duplicate_rate=0)
        + special_events()
        + [event(t) for t in EVENT_MODELS if t not in PAIR_EVENT_TYPES]  # those: the models
    )
    for value in events:
        raw = orjson.dumps(value)
        _fast(raw)  # raises _Slow if the fast path could not decide
        assert_same(raw)


@pytest.mark.parametrize(
    "mutate",
    [
        lambda e: e["rubric"].update(correctness=6),
        lambda e: e["rubric"].update(safety=0),
        lambda e: e["rubric"].update(safety=3.0),
        lambda e: e["rubric"].update(safety=True),
        lambda e: e["rubric"].update(extra=1),
        lambda e: e["rubric"].pop("safety"),
        lambda e: e.update(occurred_at="not a date"),
        lambda e: e.update(occurred_at="2026-01-01T00:00:00"),
        lambda e: e.update(occurred_at="2026-01-01T00:00:00.123456789+02:00"),
        lambda e: e.update(occurred_at="2026-02-30T00:00:00Z"),
        lambda e: e.update(occurred_at=1767225600),
        lambda e: e.pop("trace_id"),
        lambda e: e.update(event_id=""),
        lambda e: e.update(event_id=7),
        lambda e: e.update(org=None),
        lambda e: e.update(labeler=""),
        lambda e: e.update(comment=5),
        lambda e: e.update(event_type="label.deleted"),
        lambda e: e.pop("event_type"),
        lambda e: e.update(extra={"nested": [1, {"x": None}]}),
    ],
)
def test_labels_good_and_bad_get_the_same_answer(mutate: Any) -> None:
    value = event("label.submitted")
    mutate(value)
    assert_same(orjson.dumps(value))


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("messages", [{"role": "robot", "content": "x"}]),
        ("messages", [{"content": "x"}]),
        ("messages", [{"role": "user", "content": 3}]),
        ("messages", [{"role": "user", "content": None, "name": 1}]),
        ("messages", [{"role": "tool", "tool_call_id": 5}]),
        ("messages", [{"role": "assistant", "tool_calls": {"a": 1}}]),
        ("messages", [{"role": "user", "content": [{"type": "text"}], "x": {"y": [1.5e-7]}}]),
        ("messages", "not a list"),
        ("messages", []),
        ("spans", None),
        ("spans", {"a": 1}),
        ("spans", [{"name": "s", "attributes": {"k": [1, 2]}}]),
        ("metadata", None),
        ("metadata", [1]),
        ("metadata", {"latency_ms": 3}),
        ("attachments", None),
        ("attachments", [{"name": "a", "uri": "u", "content_type": "t", "size": 1, "z": 0}]),
        ("attachments", [{"uri": "u", "name": "a", "size": 1, "content_type": "t"}]),
        ("attachments", [{"name": "", "uri": "u", "content_type": "t", "size": 1}]),
        ("attachments", [{"name": "a", "uri": "u", "content_type": "t", "size": -1}]),
        ("attachments", [{"name": "a", "uri": "u", "content_type": "t", "size": 1.0}]),
        ("attachments", [{"name": "a", "uri": "u", "size": 1}]),
        ("agent_version", 4),
        ("scenario", None),
    ],
)
def test_traces_good_and_bad_get_the_same_answer(field: str, value: Any) -> None:
    assert_same(orjson.dumps(event("trace.completed") | {field: value}))


RESULT = {"evaluator": "j", "score": 0.5, "passed": True, "reasoning": "ok"}


@pytest.mark.parametrize(
    "change",
    [
        {"results": []},
        {"results": [RESULT | {"score": 1}]},
        {"results": [RESULT | {"score": 0}]},
        {"results": [RESULT | {"score": 1.5}]},
        {"results": [RESULT | {"score": "0.5"}]},
        {"results": [RESULT | {"score": True}]},
        {"results": [RESULT | {"passed": 1}]},
        {"results": [RESULT | {"reasoning": None}]},
        {"results": [{k: v for k, v in RESULT.items() if k != "reasoning"}]},
        {"results": [{"model": "m", **RESULT}]},
        {"results": [RESULT | {"evaluator": ""}]},
        {"results": ["x"]},
        {"report": {}},
        {"report": None},
        {"report": {"outcomes": [{"type": "g"}], "z": 1}},
        {"report": {"outcomes": [{"severity": 3, "type": "g", "q": [1]}]}},
        {"report": {"outcomes": [{"type": "g", "severity": -1}]}},
        {"report": {"outcomes": [{"type": "g", "decision": "yes"}]}},
        {"report": {"outcomes": [{"type": "g", "turn": True}]}},
        {"report": {"outcomes": [{"turn": 1}]}},
        {"report": {"classifications": [{"type": "c"}]}},
        {"report": {"classifications": [{"type": "c", "assessments": [{"principle_id": "p"}]}]}},
        {"report": {"classifications": [{"type": "c", "assessments": [
            {"explanation": "e", "principle_id": "p", "decision": "partly", "w": 1}]}]}},
        {"report": {"classifications": [{"type": "c", "assessments": [
            {"principle_id": "p", "decision": 3}]}]}},
        {"report": {"classifications": [{"type": "c", "assessments": None}]}},
        {"evaluation_id": ""},
    ],
)  # fmt: skip
def test_evaluations_good_and_bad_get_the_same_answer(change: dict[str, Any]) -> None:
    assert_same(orjson.dumps(event("evaluation.finished") | change))


@pytest.mark.parametrize(
    "data",
    [
        b"{", b"", b"\xff\xfe", b'{"a": 1', b"[1, 2]", b"null",
        b'{"event_type": "label.skipped", "labeler": NaN}',
        b'{"event_type": "label.skipped", "labeler": "a", "x": Infinity}',
        b'{"event_type": "label.skipped", "labeler": "a", "x": 123456789012345678901234567890}',
    ],
)  # fmt: skip
def test_bytes_that_are_not_an_event_get_the_same_reason(data: bytes) -> None:
    assert_same(data)


def test_huge_integers_and_nan_in_a_conversation_get_the_same_answer() -> None:
    big = orjson.dumps(event("trace.completed"))
    for token in (b"123456789012345678901", b"-123456789012345678901", b"1e400"):
        raw = big.replace(b'"Plan my wellness goals"', token)
        assert_same(raw)


@pytest.mark.parametrize(
    ("text", "replacement"),
    [
        (b"Plan my", b"Plan \\ud83d my"),  # a lone surrogate in the conversation
        (b"Plan my", b"Plan \\ud83dx"),
        (b"Plan my", b"Plan \xe9 my"),  # not UTF-8
        (b'"happy_path"', b'"happy_path","metadata":{"k":"\\udc00"}'),
        (b'"happy_path"', b'"happy_path","metadata":{"k":"\xff"}'),
    ],
)
def test_what_msgspec_keeps_raw_and_is_not_text_gets_the_models_answer(
    text: bytes, replacement: bytes
) -> None:
    """The conversation and the metadata are kept raw by the first decode; a lone surrogate
    or bytes that are not UTF-8 in them are the models' to judge, not a crash."""
    raw = orjson.dumps(event("trace.completed"))
    assert text in raw
    assert_same(raw.replace(text, replacement, 1))


@settings(max_examples=30, deadline=None)
@given(
    depth=st.integers(256, 6000),
    where=st.sampled_from([b'"Plan my wellness goals"', b'"happy_path"']),
    kind=st.sampled_from([b"[]", b"{}"]),
)
def test_json_nested_too_deeply_is_a_rejection_not_a_crash(
    depth: int, where: bytes, kind: bytes
) -> None:
    """orjson stops at 254 levels (a TypeError), msgspec and pydantic at Python's recursion
    limit: an event nested deeper once raised out of the decoder on every retry, a poison
    pill that stopped its partition. Now it is dead-lettered, fresh or waiting."""
    raw = orjson.dumps(event("trace.completed"))
    assert where in raw
    opener, closer = kind[:1], kind[1:]
    inner = b"[]" if kind == b"{}" else b""
    nested = (opener + b'"k":') * depth if kind == b"{}" else opener * depth
    deep = nested + inner + closer * depth if kind == b"[]" else nested + b"1" + closer * depth
    raw = raw.replace(where, deep, 1)
    found = read_event(raw, **KW)  # never raises
    assert isinstance(found, EventRejection)
    assert found.reason in {RejectReason.BAD_JSON, RejectReason.INVALID}
    assert isinstance(reread_event(raw), EventView | EventRejection)


def test_topic_key_and_clock_checks_come_out_the_same() -> None:
    raw = orjson.dumps(event("label.submitted"))
    assert_same(raw, family=EventFamily.TRACES)
    assert_same(raw, family=EventFamily.LABELS)
    assert_same(raw, key=b"tr-2")
    assert_same(raw, key=b"tr-1")
    assert_same(orjson.dumps(event("label.skipped", at="2026-06-03T00:00:00Z")))
    assert_same(b"x" * 2000, max_bytes=1024)


def test_an_unusual_event_falls_back_to_the_models() -> None:
    with pytest.raises(_Slow):  # an integer orjson could not write back: the models decide
        _fast(orjson.dumps(event("label.submitted"))[:-1] + b', "x": 123456789012345678901}')
    with pytest.raises(_Slow):
        _fast(b'{"event_type": "label.skipped"')


# --- generated events: unknown fields and optional ones at every level --------------------

_scalars = st.one_of(
    st.none(), st.booleans(), st.integers(-(2**62), 2**62),
    st.floats(allow_nan=False, allow_infinity=False, width=64), st.text(max_size=8),
)  # fmt: skip
_json = st.recursive(
    _scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=5), inner, max_size=3)
    ),
    max_leaves=8,
)
_extras = st.dictionaries(st.sampled_from(["zz", "model", "note", "q"]), _json, max_size=2)


def _maybe(draw: Any, value: dict[str, Any], optional: dict[str, Any]) -> dict[str, Any]:
    for key, choices in optional.items():
        if draw(st.booleans()):
            value[key] = draw(choices)
    value.update(draw(_extras))
    keys = list(value)
    order = draw(st.permutations(keys))
    return {k: value[k] for k in order}


@st.composite
def evaluations(draw: Any) -> dict[str, Any]:
    results = [
        _maybe(draw, {"evaluator": draw(st.sampled_from(["a", "b"])),
                      "score": draw(st.one_of(st.floats(0, 1), st.integers(0, 1))),
                      "passed": draw(st.booleans())},
               {"reasoning": st.one_of(st.none(), st.text(max_size=5))})
        for _ in range(draw(st.integers(0, 3)))
    ]  # fmt: skip
    outcomes = [
        _maybe(draw, {"type": "g"}, {"turn": st.one_of(st.none(), st.integers(0, 5)),
                                     "decision": st.one_of(st.none(), st.booleans()),
                                     "severity": st.integers(0, 4)})
        for _ in range(draw(st.integers(0, 2)))
    ]  # fmt: skip
    assessments = [
        _maybe(draw, {"principle_id": "p"},
               {"decision": st.one_of(st.none(), st.booleans(), st.text(max_size=3)),
                "explanation": st.one_of(st.none(), st.text(max_size=3))})
        for _ in range(draw(st.integers(0, 2)))
    ]  # fmt: skip
    classification = _maybe(
        draw, {"type": "c"}, {"turn": st.integers(0, 3), "assessments": st.just(assessments)}
    )
    report = _maybe(
        draw, {}, {"outcomes": st.just(outcomes), "classifications": st.just([classification])}
    )
    return _maybe(draw, event("evaluation.finished", results=results),
                  {"report": st.just(report)})  # fmt: skip


@st.composite
def traces(draw: Any) -> dict[str, Any]:
    messages = [
        _maybe(draw, {"role": draw(st.sampled_from(["system", "user", "assistant", "tool"]))},
               {"content": st.one_of(st.none(), st.text(max_size=10),
                                     st.lists(st.fixed_dictionaries({"type": st.just("text"),
                                                                     "text": st.text()}))),
                "name": st.one_of(st.none(), st.text(max_size=3)),
                "tool_calls": st.one_of(st.none(), st.lists(_json, max_size=2)),
                "tool_call_id": st.one_of(st.none(), st.text(max_size=3))})
        for _ in range(draw(st.integers(0, 4)))
    ]  # fmt: skip
    attachments = [
        _maybe(draw, {"name": "a", "uri": "s3://b/a", "content_type": "t",
                      "size": draw(st.integers(0, 10))}, {})
        for _ in range(draw(st.integers(0, 2)))
    ]  # fmt: skip
    optional = {
        "attachments": st.just(attachments),
        "spans": st.lists(_json, max_size=2),
        "metadata": st.dictionaries(st.text(max_size=3), _json, max_size=2),
    }
    return _maybe(draw, event("trace.completed", messages=messages), optional)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(value=st.one_of(evaluations(), traces()))
def test_generated_events_get_the_same_answer(value: dict[str, Any]) -> None:
    raw = orjson.dumps(value)
    assert_same(raw)
    assert_same(orjson.dumps(copy.deepcopy(value), option=orjson.OPT_INDENT_2))
