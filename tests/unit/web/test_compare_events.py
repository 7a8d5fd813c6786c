"""The comparison events the API publishes (section 2's ``label.compared`` and its retraction
``label.uncompared``) and the overlay's fresh votes, which the comparison queue reads."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import orjson
from hypothesis import given
from hypothesis import strategies as st

from rl_export.labeling.pairs import CHOICES
from rl_export.model.events import LabelCompared, LabelSubmitted, Rubric
from rl_export.model.pairs import pair_id
from rl_export.web.labels import (
    comparison_retracted,
    encode,
    label_compared,
    label_submitted,
)
from rl_export.web.overlay import Overlay, note_label_event

NOW = datetime(2026, 3, 1, 12, 30, tzinfo=UTC)
ids = st.text(st.characters(min_codepoint=33, max_codepoint=126), min_size=1, max_size=8)


@given(ids, ids, st.sampled_from(CHOICES), st.one_of(st.none(), st.integers(1, 3)))
def test_a_comparison_names_its_traces_in_order_and_keeps_the_clients_choice(
    first: str, second: str, choice: str, strength: int | None
) -> None:
    if first == second:
        return
    event = label_compared("acme", "bot", first, second, "ana", choice=choice,  # type: ignore[arg-type]
                           strength=strength, rubric=None, rubric_version=0, comment=None,
                           now=NOW)  # fmt: skip
    value = orjson.loads(encode(event))
    assert value["event_type"] == "label.compared"
    assert value["trace_a"] < value["trace_b"]
    assert value["trace_id"] == value["trace_a"]
    assert {value["trace_a"], value["trace_b"]} == {first, second}
    assert "labeler" in value
    assert value.get("strength") == strength
    # The trace the client preferred is the trace the event prefers.
    chose = {"a": first, "b": second}.get(choice)
    said = {"a": value["trace_a"], "b": value["trace_b"]}.get(value["choice"])
    assert said == chose
    if choice in ("tie", "both_bad"):
        assert value["choice"] == choice


def test_a_retraction_is_keyed_like_the_comparison_it_retracts() -> None:
    event = comparison_retracted("acme", "bot", "t1", "t2", labeler="ana", now=NOW)
    value = orjson.loads(encode(event))
    assert value == {**value, "event_type": "label.uncompared", "trace_id": "t1",
                     "trace_a": "t1", "trace_b": "t2", "labeler": "ana"}  # fmt: skip


def test_the_joins_mirror_and_notices_are_not_votes_again() -> None:
    """The labels topic also carries the join's mirror of a comparison (for trace_b's
    partition) and its pair.void notices: the overlay counts the vote once."""
    overlay = Overlay(ttl_s=10, clock=lambda: 0.0)
    compared = label_compared("acme", "bot", "t1", "t2", "ana", choice="a", strength=None,
                              rubric=None, rubric_version=0, comment=None, now=NOW)  # fmt: skip
    mirror = LabelCompared.model_validate(
        {**compared.model_dump(), "trace_id": "t2", "mirror": True, "choice": "b"}
    )
    note_label_event(overlay, encode(mirror))
    void = {"event_type": "pair.void", "event_id": f"{pair_id('t1', 't2')}/void/t1",
            "occurred_at": NOW.isoformat(), "org": "acme", "project": "bot", "trace_id": "t2",
            "trace_a": "t1", "trace_b": "t2"}  # fmt: skip
    note_label_event(overlay, orjson.dumps(void))
    assert overlay.votes.fresh("acme", "bot") == {}
    note_label_event(overlay, encode(compared))
    assert overlay.votes.fresh("acme", "bot") == {pair_id("t1", "t2"): {"ana": True}}


def test_fresh_votes_follow_the_latest_action_and_leave_labels_alone() -> None:
    clock = [0.0]
    overlay = Overlay(ttl_s=10, clock=lambda: clock[0])
    compared = label_compared("acme", "bot", "t2", "t1", "ana", choice="a", strength=None,
                              rubric=None, rubric_version=0, comment=None, now=NOW)  # fmt: skip
    pid = pair_id("t1", "t2")
    note_label_event(overlay, encode(compared))  # as another instance's tail would
    assert overlay.votes.fresh("acme", "bot") == {pid: {"ana": True}}
    assert overlay.votes.traces(pid) == ("t1", "t2")
    older = comparison_retracted("acme", "bot", "t1", "t2", labeler="ana",
                                 now=NOW - timedelta(seconds=1))  # fmt: skip
    overlay.note(older)  # older than the comparison: changes nothing
    rubric = Rubric(correctness=5, helpfulness=4, efficiency=3, safety=5).model_dump()
    label: LabelSubmitted = label_submitted("acme", "bot", "t1", "ana", rubric=rubric,
                                            comment=None, now=NOW)  # fmt: skip
    overlay.note(label)
    assert overlay.votes.fresh("acme", "bot") == {pid: {"ana": True}}
    overlay.note(comparison_retracted("acme", "bot", "t1", "t2", labeler="ana",
                                      now=NOW + timedelta(seconds=1)))  # fmt: skip
    assert overlay.votes.fresh("acme", "bot") == {pid: {"ana": False}}
    assert overlay.ask("acme", "bot", "ana") == (["t1"], [])  # a comparison's retraction
    # is no retraction of ana's label of t1
    clock[0] = 11.0
    overlay.expire()
    assert overlay.votes.fresh("acme", "bot") == {}
    assert overlay.votes.traces(pid) is None
