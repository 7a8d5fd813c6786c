"""Blind, redacted queue items: no other labeler's names, ratings, comments or human reward,
nor anything that counts or dates their work (an item's bytes do not depend on it)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import orjson
from hypothesis import given
from hypothesis import strategies as st

from rl_export.labeling.blind import COUNTING_FIELDS, HUMAN_FIELDS, blind, queue_item
from rl_export.model.codec import dumps
from rl_export.model.eventview import EventView, read_event
from rl_export.model.records import render
from rl_export.privacy.redact import redactor
from rl_export.stream.join import JoinConfig, RawEvent, TraceState, current_snapshot, merge
from tests.factories import event, raw
from tests.records import record as make_record

SECRET = "AKIAIOSFODNN7EXAMPLE"


def labeled(**extra: Any) -> dict[str, Any]:
    record = make_record("tr-1", source=None, reward=None, passed=None)
    record.update(
        rubric={"correctness": 2.0, "helpfulness": 3.0, "efficiency": 4.0, "safety": 5.0},
        labels_count=2, labelers=["ana-7", "bo-7"], skipped_by=["cy-7"],
        labels=[
            {"labeler": "ana-7", "rubric": {"correctness": 1, "helpfulness": 2, "efficiency": 3,
                                          "safety": 4}, "comment": "ana thinks it is wrong",
             "occurred_at": "2026-12-01T00:00:00Z"},
            {"labeler": "bo-7", "rubric": {"correctness": 3, "helpfulness": 4, "efficiency": 5,
                                         "safety": 5}, "comment": None,
             "occurred_at": "2026-12-01T00:01:00Z"},
        ],
        **extra,
    )  # fmt: skip
    return record


def test_blind_nulls_every_field_that_carries_another_labeler() -> None:
    record = labeled(human_labels=[{"labeler": "ana-7"}])
    out = blind(record)
    for name in (*HUMAN_FIELDS, *COUNTING_FIELDS):
        if name != "comparisons":  # not in this record: blind adds no field (below)
            assert out[name] is None, name
    text = orjson.dumps(out).decode()
    for leak in ("ana-7", "bo-7", "cy-7", "thinks it is wrong"):
        assert leak not in text
    assert out["messages"] == record["messages"]
    assert out["evaluation"] == record["evaluation"]
    assert record["labelers"] == ["ana-7", "bo-7"]  # the input is left as it was


def test_blind_hides_a_human_reward_and_keeps_an_evaluator_one() -> None:
    human = blind(labeled(reward_source="human", reward=0.7, passed=True))
    assert (human["reward"], human["passed"]) == (None, None)
    judged = blind(labeled(reward_source="evaluator", reward=0.7, passed=True))
    assert (judged["reward"], judged["passed"]) == (0.7, True)


def test_blind_adds_no_field_a_record_lacks() -> None:
    record = {"trace_id": "t", "messages": []}
    assert blind(record) == record


def test_a_queue_item_is_blind_and_redacted() -> None:
    record = labeled()
    record["messages"] = [{"role": "user", "content": f"my key is {SECRET}"}]
    line = orjson.dumps(record)
    item, counts = queue_item(line, blinded=True, scrub=redactor(("secrets",)))
    out = orjson.loads(item)
    assert SECRET not in item.decode()
    assert "[REDACTED:SECRETS]" in out["messages"][0]["content"]
    assert counts == {"secrets": 1}
    assert out["labelers"] is None
    assert out["labels"] is None


def test_an_item_that_is_not_blind_keeps_the_labels_and_is_still_redacted() -> None:
    record = labeled()
    record["labels"][0]["comment"] = f"key {SECRET}"
    item, counts = queue_item(orjson.dumps(record), blinded=False, scrub=redactor(("secrets",)))
    out = orjson.loads(item)
    assert out["labelers"] == ["ana-7", "bo-7"]
    assert SECRET not in out["labels"][0]["comment"]
    assert counts == {"secrets": 1}


def test_a_project_that_redacts_nothing_only_blinds() -> None:
    record = labeled()
    record["messages"] = [{"role": "user", "content": SECRET}]
    item, counts = queue_item(orjson.dumps(record), blinded=True, scrub=None)
    assert SECRET in item.decode()
    assert counts == {}
    assert orjson.loads(item)["rubric"] is None


def test_a_handle_changes_with_what_the_item_shows_and_only_with_it() -> None:
    scrub = redactor(("secrets",))
    first, _ = queue_item(orjson.dumps(labeled()), blinded=True, scrub=scrub)
    again, _ = queue_item(orjson.dumps(labeled()), blinded=True, scrub=scrub)
    assert first == again
    handle = orjson.loads(first)["handle"]
    assert len(handle) == 32
    assert list(orjson.loads(first))[-1] == "handle"
    edited = labeled()
    edited["messages"] = [{"role": "user", "content": "another question"}]
    other, _ = queue_item(orjson.dumps(edited), blinded=True, scrub=scrub)
    assert orjson.loads(other)["handle"] != handle


# --- generated: any other labelers' work leaves a blind item as it was ----------------------

NOW = datetime(2026, 6, 1, tzinfo=UTC)
ORIGIN = RawEvent(b"", "labels.submitted", 0, 0, None)
ratings = st.integers(min_value=1, max_value=5)
work = st.lists(
    st.tuples(
        st.sampled_from(["label.submitted", "label.skipped", "label.retracted"]),
        st.sampled_from(["ana", "bo", "cy", "dee"]),
        st.tuples(ratings, ratings, ratings, ratings),
        st.one_of(st.none(), st.text(max_size=20)),  # a comment
        st.integers(min_value=2, max_value=59),  # seconds past the trace
    ),
    max_size=8,
)


def traces_item(events: list[dict[str, Any]]) -> bytes:
    """The blind queue item of a trace after ``events``, through the join and the record
    the ``traces`` corpus holds (the path the worker and the web service take)."""
    state: TraceState | None = None
    for ev in events:
        view = read_event(raw(ev), max_bytes=1 << 20, now=NOW, future_tolerance_s=86400.0)
        assert isinstance(view, EventView), view
        state = merge(state, view, ORIGIN, now=NOW.timestamp(), config=JoinConfig()).state
    assert state is not None
    snapshot = current_snapshot(state, JoinConfig())
    assert snapshot is not None
    record = render(snapshot, None)
    assert record is not None
    item, _ = queue_item(dumps(record), blinded=True, scrub=redactor(("secrets",)))
    return item


@given(work=work)
def test_a_blind_item_is_the_same_bytes_whatever_other_labelers_did(
    work: list[tuple[str, str, tuple[int, int, int, int], str | None, int]],
) -> None:
    trace = [
        event("trace.completed", "t-1", "2026-01-01T00:00:00Z"),
        event("evaluation.finished", "v-1", "2026-01-01T00:00:01Z"),
    ]
    labels = []
    for n, (kind, labeler, (c, h, e, s), comment, second) in enumerate(work):
        fields: dict[str, Any] = {"labeler": labeler}
        if kind == "label.submitted":
            fields["rubric"] = {"correctness": c, "helpfulness": h, "efficiency": e,
                                "safety": s}  # fmt: skip
            if comment is not None:
                fields["comment"] = comment
        labels.append(event(kind, f"w-{n}", f"2026-01-01T00:00:{second:02d}Z", **fields))
    assert traces_item(trace + labels) == traces_item(trace)
