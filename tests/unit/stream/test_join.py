"""The pure stream join (DESIGN.md sections 2-4): latest-wins rules, rewards, revisions,
pending events, deletion, state round trips, retention, and order independence.

Every merge in this file goes through :class:`Join`, which also renders each snapshot for
every corpus and validates the result against the record models (field order included).
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rl_export.model.codec import RawJson, dumps
from rl_export.model.events import (
    EVENT_ADAPTER,
    BaseEvent,
    EventRejection,
    RejectReason,
    decode_event,
    format_utc,
    parse_rfc3339,
)
from rl_export.model.records import (
    ERASED_REVISION,
    RULES_VERSION,
    Tombstone,
    TrajectoryRecord,
    render,
)
from rl_export.model.snapshots import decode_snapshot, encode_snapshot
from rl_export.stream.join import (
    JoinConfig,
    MergeResult,
    Pending,
    RawEvent,
    TraceState,
    current_snapshot,
    encode_current,
    expired,
    merge,
)
from rl_export.stream.state import dump_state, expiry_since, load_state
from tests.factories import event, raw

NOW_DT = datetime(2026, 6, 1, tzinfo=UTC)
NOW = NOW_DT.timestamp()
CONFIG = JoinConfig()
SOURCES: tuple[str | None, ...] = (None, "human", "evaluator")
DAY = 86400.0

T0 = "2026-01-01T00:00:00Z"
T1 = "2026-01-01T00:00:01Z"
T2 = "2026-01-01T00:00:02Z"
T3 = "2026-01-01T00:00:03Z"

# DESIGN.md section 4, in the order written there ("records also carry human_labels": last).
RECORD_FIELDS = [
    "trace_id", "org", "project", "reward_source", "revision", "reward", "passed", "rubric",
    "labels_count", "labelers", "skipped_by", "evaluator_scores", "evaluation", "messages",
    "agent_version", "scenario", "attachments", "completed_at", "updated_at", "pass_threshold",
    "rules_version", "human_labels", "metadata",
]  # fmt: skip
TOMBSTONE_FIELDS = ["trace_id", "org", "project", "reward_source", "revision", "deleted"]

TOPIC = {
    "trace.completed": "traces.completed",
    "trace.deleted": "traces.completed",
    "evaluation.finished": "evaluations.finished",
    "label.submitted": "labels.submitted",
    "label.skipped": "labels.submitted",
    "label.retracted": "labels.submitted",
}


# --- builders ------------------------------------------------------------------------------


def trace(eid: str = "t-1", at: str = T0, **fields: Any) -> dict[str, Any]:
    return event("trace.completed", eid, at, **fields)


def delete(eid: str = "d-1", at: str = T1, **fields: Any) -> dict[str, Any]:
    return event("trace.deleted", eid, at, **fields)


def result(evaluator: str, score: float, passed: bool = True, **fields: Any) -> dict[str, Any]:
    return {"evaluator": evaluator, "score": score, "passed": passed, **fields}


def evaluation(
    eid: str = "v-1", at: str = T1, results: list[dict[str, Any]] | None = None, **fields: Any
) -> dict[str, Any]:
    if results is not None:
        fields["results"] = results
    fields.setdefault("evaluation_id", f"ev-{eid}")
    return event("evaluation.finished", eid, at, **fields)


def rubric(c: int, h: int, e: int, s: int) -> dict[str, int]:
    return {"correctness": c, "helpfulness": h, "efficiency": e, "safety": s}


def label(
    eid: str, labeler: str = "ana", at: str = T1, r: tuple[int, int, int, int] = (4, 3, 5, 4)
) -> dict[str, Any]:
    return event("label.submitted", eid, at, labeler=labeler, rubric=rubric(*r))


def retract(eid: str, labeler: str = "ana", at: str = T2) -> dict[str, Any]:
    return event("label.retracted", eid, at, labeler=labeler)


def skip(eid: str, labeler: str = "ana", at: str = T1) -> dict[str, Any]:
    return event("label.skipped", eid, at, labeler=labeler)


def decode(data: bytes) -> BaseEvent:
    decoded = decode_event(data, max_bytes=1 << 20, now=NOW_DT, future_tolerance_s=DAY)
    assert not isinstance(decoded, EventRejection), decoded
    return decoded


# --- checks on every snapshot --------------------------------------------------------------


def check_record(record: dict[str, Any]) -> None:
    """A rendered record is a valid TrajectoryRecord or Tombstone, fields in DESIGN order."""
    if record.get("deleted"):
        assert list(record) == TOMBSTONE_FIELDS == list(Tombstone.model_fields)
        Tombstone.model_validate(record)
    else:
        # ``comparisons`` (section 12) follows, only in the record of a trace compared.
        assert list(record) == RECORD_FIELDS == list(TrajectoryRecord.model_fields)[:-1]
        TrajectoryRecord.model_validate(record)
        # The JSON a trainer reads parses back to the same record.
        TrajectoryRecord.model_validate_json(dumps(record))


def check_snapshot(snapshot: dict[str, Any] | None) -> None:
    if snapshot is None:
        return
    if snapshot["deleted"]:
        assert set(snapshot) == {"trace_id", "org", "project", "revision", "deleted"}
    for source in SOURCES:
        record = render(snapshot, source)
        if source is None:
            assert record is not None  # the traces corpus always has a record
        if record is not None:
            assert record["reward_source"] == source
            check_record(record)


class Join:
    """One trace's state, fed event dicts the way the worker does (bytes -> decode -> merge)."""

    def __init__(self, config: JoinConfig = CONFIG) -> None:
        self.config = config
        self.state: TraceState | None = None
        self.offset = 0

    def send(self, ev: dict[str, Any], *, now: float = NOW) -> MergeResult:
        data = raw(ev)
        where = RawEvent(data, TOPIC[ev["event_type"]], 3, self.offset, 1_700_000_000_000)
        self.offset += 1
        previous = self.state
        res = merge(self.state, decode(data), where, now=now, config=self.config)
        assert previous is None or res.state is previous
        self.state = res.state
        check_snapshot(res.snapshot)
        if res.snapshot is not None:
            assert res.snapshot == current_snapshot(res.state, self.config)
        return res

    def feed(self, *events: dict[str, Any], now: float = NOW) -> list[MergeResult]:
        return [self.send(ev, now=now) for ev in events]

    @property
    def st(self) -> TraceState:
        assert self.state is not None
        return self.state

    @property
    def snap(self) -> dict[str, Any]:
        snapshot = current_snapshot(self.st, self.config)
        assert snapshot is not None
        return snapshot

    def record(self, source: str | None) -> dict[str, Any] | None:
        return render(self.snap, source)  # type: ignore[arg-type]

    def ready(self, source: str | None) -> dict[str, Any]:
        record = self.record(source)
        assert record is not None, f"not ready for {source}"
        return record


def joined(*events: dict[str, Any], config: JoinConfig = CONFIG) -> Join:
    j = Join(config)
    j.feed(*events)
    return j


# --- "latest": trace.completed --------------------------------------------------------------


def test_later_trace_completed_replaces_messages_agent_version_and_scenario() -> None:
    old = trace("t-1", T0, agent_version="v1", scenario="s1", messages=[{"role": "user"}])
    new_messages = [{"role": "user", "content": "again"}, {"role": "assistant", "content": "ok"}]
    attachment = {"name": "a.txt", "uri": "s3://b/a.txt", "content_type": "text/plain", "size": 3}
    new = trace(
        "t-2",
        T2,
        agent_version="v2",
        scenario="s2",
        messages=new_messages,
        attachments=[attachment],
    )
    j = joined(old)
    first = j.ready(None)
    assert (first["agent_version"], first["scenario"], first["completed_at"]) == ("v1", "s1", T0)
    res = j.send(new)
    assert res.outcome == "accepted"
    rec = j.ready(None)
    assert rec["agent_version"] == "v2"
    assert rec["scenario"] == "s2"
    assert rec["messages"] == RawJson(orjson.dumps(new_messages))
    assert rec["attachments"] == [attachment]
    assert rec["completed_at"] == T2
    assert rec["revision"] == 2


def test_older_trace_completed_arriving_later_does_not_replace() -> None:
    j = joined(trace("t-2", T2, agent_version="v2", scenario="s2"))
    res = j.send(trace("t-1", T0, agent_version="v1", scenario="s1", messages=[]))
    assert res.outcome == "accepted"
    assert res.snapshot is not None
    assert res.snapshot["revision"] == 2  # it counts, but does not win
    rec = j.ready(None)
    assert (rec["agent_version"], rec["scenario"], rec["completed_at"]) == ("v2", "s2", T2)
    assert rec["messages"].value() == trace()["messages"]
    assert rec["updated_at"] == T2


@pytest.mark.parametrize("reverse", [False, True])
def test_trace_tie_on_occurred_at_is_broken_by_greater_event_id(reverse: bool) -> None:
    events = [trace("t-a", T1, agent_version="a"), trace("t-b", T1, agent_version="b")]
    j = joined(*(reversed(events) if reverse else events))
    assert j.ready(None)["agent_version"] == "b"


@pytest.mark.parametrize("reverse", [False, True])
@pytest.mark.parametrize(
    ("early", "late"),
    [
        # 01:30+02:00 is 23:30Z the day before: older, though its wall clock and id are greater.
        (("z", "2026-01-01T01:30:00+02:00"), ("a", "2026-01-01T00:00:00Z")),
        # 01:00Z is older than 00:30-02:00 (= 02:30Z).
        (("z", "2026-01-01T01:00:00Z"), ("a", "2026-01-01T00:30:00-02:00")),
        # The same instant written two ways: a tie, broken by the greater event_id.
        (("a", "2026-01-01T00:00:00Z"), ("b", "2026-01-01T02:00:00+02:00")),
    ],
)
def test_occurred_at_offsets_are_compared_in_utc(
    reverse: bool, early: tuple[str, str], late: tuple[str, str]
) -> None:
    events = [trace(early[0], early[1], agent_version="early"), trace(late[0], late[1])]
    events[1]["agent_version"] = "late"
    j = joined(*(reversed(events) if reverse else events))
    rec = j.ready(None)
    assert rec["agent_version"] == "late"
    expected = format_utc(parse_rfc3339(late[1]))
    assert expected.endswith("Z")
    assert rec["completed_at"] == expected
    greatest = max(parse_rfc3339(early[1]), parse_rfc3339(late[1]))
    assert rec["updated_at"] == format_utc(greatest)


def test_event_id_tie_break_is_string_order() -> None:
    # "e-9" > "e-10" as strings: "greater event_id" compares the ids as given.
    j = joined(trace("e-10", T1, agent_version="ten"), trace("e-9", T1, agent_version="nine"))
    assert j.ready(None)["agent_version"] == "nine"


# --- evaluations ---------------------------------------------------------------------------


@pytest.mark.parametrize("reverse", [False, True])
def test_latest_evaluation_is_current(reverse: bool) -> None:
    older = evaluation("v-1", T1, [result("judge", 0.2, False)], evaluation_id="ev-old")
    newer = evaluation("v-2", T2, [result("judge", 0.9, True)], evaluation_id="ev-new")
    j = joined(trace(), *([newer, older] if reverse else [older, newer]))
    rec = j.ready("evaluator")
    assert rec["evaluation"]["evaluation_id"] == "ev-new"
    assert rec["evaluation"]["occurred_at"] == T2
    assert rec["evaluator_scores"] == {"judge": 0.9}
    assert (rec["reward"], rec["passed"]) == (0.9, True)
    assert rec["revision"] == 3


@pytest.mark.parametrize("reverse", [False, True])
def test_evaluation_tie_is_broken_by_greater_event_id(reverse: bool) -> None:
    a = evaluation("v-a", T1, [result("judge", 0.1)], evaluation_id="ev-a")
    b = evaluation("v-b", T1, [result("judge", 0.3)], evaluation_id="ev-b")
    j = joined(trace(), *([b, a] if reverse else [a, b]))
    assert j.ready("evaluator")["evaluation"]["evaluation_id"] == "ev-b"
    assert j.ready("evaluator")["reward"] == 0.3


@pytest.mark.parametrize(
    ("scores", "expected"),
    [
        ([0.25, 0.75, 0.5], 0.5),
        ([1.0], 1.0),
        ([0.0, 0.0], 0.0),
        ([0.2, 0.4], (0.2 + 0.4) / 2),
    ],
)
def test_evaluator_reward_is_the_mean_score(scores: list[float], expected: float) -> None:
    results = [result(f"j{i}", s) for i, s in enumerate(scores)]
    j = joined(trace(), evaluation(results=results))
    assert j.ready("evaluator")["reward"] == expected


def test_evaluator_reward_is_summed_in_evaluator_name_order() -> None:
    # Listed c, b, a. Summed as listed the mean is 0.20000000000000004; in name order
    # (a, b, c) it is 0.19999999999999998: the rule makes it independent of the list order.
    listed = [result("c", 0.1), result("b", 0.2), result("a", 0.3)]
    in_name_order = (0.3 + 0.2) + 0.1
    assert in_name_order / 3 != ((0.1 + 0.2) + 0.3) / 3  # the two orders really differ
    j1 = joined(trace(), evaluation(results=listed))
    j2 = joined(trace(), evaluation(results=list(reversed(listed))))
    assert j1.ready("evaluator")["reward"] == in_name_order / 3
    assert j2.ready("evaluator")["reward"] == in_name_order / 3


@pytest.mark.parametrize(
    ("passes", "expected"),
    [([True], True), ([True, True, True], True), ([True, False, True], False), ([False], False)],
)
def test_evaluator_passed_means_every_result_passed(passes: list[bool], expected: bool) -> None:
    results = [result(f"j{i}", 0.9, p) for i, p in enumerate(passes)]
    assert joined(trace(), evaluation(results=results)).ready("evaluator")["passed"] is expected


def test_evaluator_scores_and_evaluation_view_keep_reasoning_and_report() -> None:
    report = {
        "outcomes": [{"type": "goal_met", "turn": 2, "decision": True, "severity": 3}],
        "classifications": [
            {
                "type": "policy",
                "turn": 1,
                "assessments": [
                    {"principle_id": "p-7", "decision": False, "explanation": "leaked a name"}
                ],
            }
        ],
    }
    results = [
        result("safety", 0.25, False, reasoning="it leaked a name"),
        result("helpful", 0.75, True, reasoning="solved it"),
    ]
    ev = evaluation("v-9", "2026-01-01T03:00:00.5+03:00", results, report=report)
    j = joined(trace(), ev, label("l-1"))
    for source in SOURCES:
        rec = j.ready(source)
        assert rec["evaluator_scores"] == {"helpful": 0.75, "safety": 0.25}
        view = rec["evaluation"]
        assert view["evaluation_id"] == "ev-v-9"
        assert view["occurred_at"] == "2026-01-01T00:00:00.500000Z"
        assert sorted(view["results"], key=lambda r: r["evaluator"]) == [
            results[1],
            results[0],
        ]
        assert view["report"] == report
    assert j.ready("evaluator")["reward"] == 0.5
    assert j.ready("evaluator")["passed"] is False


def test_evaluation_without_results_does_not_make_the_trace_ready() -> None:
    j = joined(trace(), evaluation(results=[]))
    assert j.snap["evaluator"] is None
    assert j.record("evaluator") is None
    rec = j.ready(None)
    assert rec["evaluator_scores"] is None
    assert rec["revision"] == 2


def test_latest_evaluation_without_results_makes_the_trace_not_ready_again() -> None:
    j = joined(trace(), evaluation("v-1", T1, [result("judge", 0.8)]))
    assert j.record("evaluator") is not None
    j.send(evaluation("v-2", T2, []))
    assert j.record("evaluator") is None
    # An older scored evaluation arriving late does not bring it back.
    j.send(evaluation("v-0", T0, [result("judge", 0.8)]))
    assert j.record("evaluator") is None
    assert j.snap["revision"] == 4


def test_both_sources_carry_rubric_and_evaluator_scores() -> None:
    j = joined(trace(), evaluation(results=[result("judge", 0.5)]), label("l-1", r=(3, 3, 3, 3)))
    human, evaluator = j.ready("human"), j.ready("evaluator")
    for rec in (human, evaluator, j.ready(None)):
        assert rec["rubric"] == dict.fromkeys(rubric(3, 3, 3, 3), 3.0)
        assert rec["evaluator_scores"] == {"judge": 0.5}
        assert rec["labelers"] == ["ana"]
        assert rec["labels_count"] == 1
    assert (human["reward"], human["passed"]) == (0.6, False)
    assert (evaluator["reward"], evaluator["passed"]) == (0.5, True)


# --- labels --------------------------------------------------------------------------------


def test_one_labeler_all_threes_gives_exactly_0_6() -> None:
    rec = joined(trace(), label("l-1", r=(3, 3, 3, 3))).ready("human")
    assert rec["reward"] == 0.6
    assert rec["passed"] is False
    assert rec["rubric"] == rubric(3, 3, 3, 3)
    assert rec["labelers"] == ["ana"]
    assert rec["labels_count"] == 1
    assert rec["pass_threshold"] == 0.7
    assert rec["rules_version"] == RULES_VERSION


def test_two_labelers_reward_is_sum_over_20_times_labelers() -> None:
    j = joined(trace(), label("l-1", "ana", r=(4, 3, 5, 4)), label("l-2", "bob", r=(5, 5, 5, 4)))
    rec = j.ready("human")
    assert rec["reward"] == 35 / 40 == 0.875
    assert rec["passed"] is True
    assert rec["rubric"] == {
        "correctness": 4.5,
        "helpfulness": 4.0,
        "efficiency": 5.0,
        "safety": 4.0,
    }
    assert rec["labelers"] == ["ana", "bob"]
    assert rec["labels_count"] == 2


def test_three_labelers_rubric_means_and_reward() -> None:
    j = joined(
        trace(),
        label("l-1", "ana", r=(1, 2, 3, 4)),
        label("l-2", "bob", r=(5, 5, 5, 5)),
        label("l-3", "cy", r=(2, 2, 2, 2)),
    )
    rec = j.ready("human")
    assert rec["reward"] == 38 / 60
    assert rec["passed"] is False
    assert rec["rubric"] == {
        "correctness": 8 / 3,
        "helpfulness": 3.0,
        "efficiency": 10 / 3,
        "safety": 11 / 3,
    }


@pytest.mark.parametrize(
    ("rubrics", "passed"),
    [
        ([(4, 4, 3, 3)], True),  # 14/20 = 0.7 exactly
        ([(4, 3, 3, 3)], False),  # 0.65
        ([(4, 4, 3, 3), (4, 4, 3, 3)], True),  # 28/40
        ([(5, 5, 5, 5), (2, 2, 2, 2)], True),  # 28/40
        ([(5, 5, 5, 5), (2, 2, 2, 1)], False),  # 27/40
        ([(5, 5, 4, 4), (3, 3, 3, 3), (4, 4, 3, 3)], True),  # 42/60
    ],
)
def test_human_passed_at_exactly_the_threshold(
    rubrics: list[tuple[int, int, int, int]], passed: bool
) -> None:
    labels = [label(f"l-{i}", f"u{i}", r=r) for i, r in enumerate(rubrics)]
    rec = joined(trace(), *labels).ready("human")
    total = sum(sum(r) for r in rubrics)
    assert rec["reward"] == total / (20 * len(rubrics))
    assert rec["passed"] is passed


def test_human_pass_threshold_is_a_setting() -> None:
    config = JoinConfig(human_pass_threshold=0.9)
    j = joined(trace(), label("l-1", r=(5, 5, 4, 4)), config=config)
    assert (j.ready("human")["reward"], j.ready("human")["passed"]) == (0.9, True)
    j.send(label("l-2", "bob", r=(5, 5, 4, 3)))
    rec = j.ready("human")
    assert (rec["reward"], rec["passed"], rec["pass_threshold"]) == (35 / 40, False, 0.9)
    assert j.ready(None)["pass_threshold"] == 0.9


def test_labelers_are_sorted() -> None:
    j = joined(trace(), label("l-1", "zoe"), label("l-2", "ana"), label("l-3", "mia"))
    assert j.ready("human")["labelers"] == ["ana", "mia", "zoe"]
    assert j.ready("human")["labels_count"] == 3


@pytest.mark.parametrize("reverse", [False, True])
def test_labels_hold_each_current_label_as_submitted_sorted_by_labeler(reverse: bool) -> None:
    events = [
        {**label("l-1", "zoe", T1, r=(1, 2, 3, 4)), "comment": "missed the refund"},
        label("l-2", "ana", T2, r=(5, 5, 4, 5)),
        label("l-3", "mia", T1),
        retract("r-1", "mia", T2),  # mia's latest is a retraction: no label
        {**label("l-4", "bo", T1, r=(2, 2, 2, 2)), "comment": "old"},
        label("l-5", "bo", T3, r=(3, 3, 3, 3)),  # bo's latest has no comment
        skip("s-1", "cy"),
    ]
    j = joined(trace(), *(reversed(events) if reverse else events))
    for source in (None, "human"):
        assert j.ready(source)["human_labels"] == [
            {"labeler": "ana", "rubric": rubric(5, 5, 4, 5), "comment": None, "occurred_at": T2},
            {"labeler": "bo", "rubric": rubric(3, 3, 3, 3), "comment": None, "occurred_at": T3},
            {"labeler": "zoe", "rubric": rubric(1, 2, 3, 4), "comment": "missed the refund",
             "occurred_at": T1},
        ]  # fmt: skip
    assert j.ready("human")["labelers"] == ["ana", "bo", "zoe"]


def test_an_unlabeled_record_has_empty_labels() -> None:
    assert (
        joined(trace(), evaluation(results=[result("j", 0.5)])).ready("evaluator")["human_labels"]
        == []
    )


@pytest.mark.parametrize("reverse", [False, True])
def test_relabel_replaces_the_labelers_label(reverse: bool) -> None:
    first = label("l-1", "ana", T1, r=(1, 1, 1, 1))
    second = label("l-2", "ana", T2, r=(5, 5, 5, 5))
    j = joined(trace(), *([second, first] if reverse else [first, second]))
    rec = j.ready("human")
    assert (rec["reward"], rec["passed"]) == (1.0, True)
    assert rec["labelers"] == ["ana"]
    assert rec["labels_count"] == 1
    assert rec["rubric"] == rubric(5, 5, 5, 5)
    assert rec["revision"] == 3


def test_retraction_as_latest_means_no_label() -> None:
    j = joined(trace(), label("l-1", "ana", T1), retract("r-1", "ana", T2))
    assert j.snap["human"] is None
    assert j.record("human") is None
    rec = j.ready(None)
    assert (rec["rubric"], rec["labelers"], rec["labels_count"]) == (None, [], 0)
    assert rec["revision"] == 3


def test_older_submit_after_a_retraction_does_not_resurrect_the_label() -> None:
    j = joined(trace(), retract("r-1", "ana", T2))
    j.send(label("l-1", "ana", T1))
    assert j.record("human") is None
    assert j.snap["revision"] == 3
    # A newer one does.
    j.send(label("l-2", "ana", T3, r=(5, 5, 5, 5)))
    assert j.ready("human")["reward"] == 1.0


def test_retraction_older_than_the_label_does_not_remove_it() -> None:
    j = joined(trace(), label("l-1", "ana", T2), retract("r-1", "ana", T1))
    assert j.ready("human")["labelers"] == ["ana"]


@pytest.mark.parametrize(
    ("submit_id", "retract_id", "labeled"), [("l-b", "l-a", True), ("l-a", "l-b", False)]
)
@pytest.mark.parametrize("reverse", [False, True])
def test_label_tie_is_broken_by_greater_event_id(
    submit_id: str, retract_id: str, labeled: bool, reverse: bool
) -> None:
    events = [label(submit_id, "ana", T1), retract(retract_id, "ana", T1)]
    j = joined(trace(), *(reversed(events) if reverse else events))
    assert (j.record("human") is not None) is labeled


def test_retracting_one_of_two_labels_leaves_the_other() -> None:
    j = joined(
        trace(),
        label("l-1", "ana", r=(5, 5, 5, 5)),
        label("l-2", "bob", r=(3, 3, 3, 3)),
        retract("r-1", "ana"),
    )
    rec = j.ready("human")
    assert (rec["reward"], rec["labelers"], rec["labels_count"]) == (0.6, ["bob"], 1)
    assert rec["rubric"] == rubric(3, 3, 3, 3)


def test_skips_are_per_labeler_and_sorted() -> None:
    j = joined(trace(), skip("s-1", "zoe"), skip("s-2", "ana"), skip("s-3", "zoe", T2))
    rec = j.ready(None)
    assert rec["skipped_by"] == ["ana", "zoe"]
    assert rec["revision"] == 4  # every skip counts
    assert j.record("human") is None  # a skip is not a label
    j.send(label("l-1", "bob"))
    human = j.ready("human")
    assert human["skipped_by"] == ["ana", "zoe"]
    assert human["labelers"] == ["bob"]
    assert human["labels_count"] == 1


# --- readiness -----------------------------------------------------------------------------


def test_human_readiness_follows_the_current_labels() -> None:
    j = joined(trace())
    assert j.record("human") is None
    assert j.record("evaluator") is None
    j.send(label("l-1", "ana", T1))
    assert j.ready("human")["revision"] == 2
    j.send(retract("r-1", "ana", T2))
    assert j.record("human") is None
    rec = j.ready(None)
    assert rec["revision"] == 3
    assert rec["updated_at"] == T2


def test_traces_corpus_always_has_a_record_without_reward() -> None:
    steps = [trace(), label("l-1"), evaluation(results=[result("j", 1.0)]), retract("r-1")]
    j = Join()
    for ev in steps:
        j.send(ev)
        rec = j.ready(None)
        assert (rec["reward_source"], rec["reward"], rec["passed"]) == (None, None, None)
        assert rec["revision"] == j.st.revision


# --- revision and duplicates ---------------------------------------------------------------


def test_revision_counts_every_distinct_accepted_event() -> None:
    j = Join()
    events = [
        trace("t-1", T0),
        skip("s-1", "bob"),
        label("l-1", "ana"),
        retract("r-1", "ana"),
        evaluation("v-1", T1, []),
        trace("t-0", "2025-01-01T00:00:00Z"),  # older: counts, does not win
        label("l-2", "ana", T0),  # older than the retraction: counts, changes nothing
    ]
    for n, ev in enumerate(events, start=1):
        res = j.send(ev)
        assert res.outcome == "accepted"
        assert res.accepted == 1
        assert res.snapshot is not None
        assert res.snapshot["revision"] == n == j.st.revision


def test_duplicate_emits_the_current_snapshot_with_the_same_revision() -> None:
    events = [trace("t-1"), label("l-1"), evaluation("v-1", T2, [result("j", 0.5)])]
    j = joined(*events)
    before, snapshot = dump_state(j.st), j.snap
    for ev in [events[0], events[1], events[2], events[0]]:
        res = j.send(ev)
        assert res.outcome == "duplicate"
        assert res.snapshot == snapshot
        assert res.snapshot is not None
        assert res.snapshot["revision"] == 3
        assert res.accepted == 0
        assert not res.rejected
        assert dump_state(j.st) == before


def test_duplicate_with_different_content_is_still_a_duplicate() -> None:
    j = joined(trace(), label("l-1", r=(5, 5, 5, 5)))
    before = dump_state(j.st)
    res = j.send(label("l-1", r=(1, 1, 1, 1), at=T3))
    assert res.outcome == "duplicate"
    assert dump_state(j.st) == before
    assert j.ready("human")["reward"] == 1.0


@pytest.mark.parametrize("field", ["org", "project"])
def test_event_after_the_trace_with_another_org_or_project_is_rejected(field: str) -> None:
    j = joined(trace(), label("l-1"))
    before = dump_state(j.st)
    foreign = label("l-2", "bob", T3, r=(1, 1, 1, 1)) | {field: "other"}
    data = raw(foreign)
    where = RawEvent(data, "labels.submitted", 5, 42, 123)
    res = merge(j.state, decode(data), where, now=NOW, config=CONFIG)
    assert res.outcome == "rejected"
    assert res.snapshot is None
    assert res.accepted == 0
    assert len(res.rejected) == 1
    got_raw, rejection = res.rejected[0]
    assert got_raw == where
    assert rejection.reason is RejectReason.ORG_MISMATCH
    assert dump_state(j.st) == before
    assert j.ready("human")["labelers"] == ["ana"]
    # Redelivered, it is rejected again, never a duplicate of something accepted.
    again = merge(j.state, decode(data), where, now=NOW, config=CONFIG)
    assert again.outcome == "rejected"
    assert dump_state(j.st) == before


# --- events before their trace -------------------------------------------------------------


def test_events_before_the_trace_wait_then_count() -> None:
    j = Join()
    early = [
        label("l-1", "ana", T1, r=(3, 3, 3, 3)),
        skip("s-1", "bob"),
        evaluation("v-1", T3, [result("judge", 0.5)]),
    ]
    for ev in early:
        res = j.send(ev)
        assert res.outcome == "pending"
        assert res.snapshot is None
        assert res.accepted == 0
        assert not res.rejected
    assert current_snapshot(j.st, CONFIG) is None
    assert j.st.revision == 0
    # A redelivered pending event is a duplicate and emits nothing.
    res = j.send(early[0])
    assert (res.outcome, res.snapshot) == ("duplicate", None)
    assert len(j.st.pending) == 3

    res = j.send(trace("t-1", T0))
    assert res.outcome == "accepted"
    assert res.accepted == 4
    assert not res.rejected
    assert res.snapshot is not None
    assert res.snapshot["revision"] == 4
    assert j.st.pending == []
    assert j.st.first_pending_at is None
    human = j.ready("human")
    assert (human["reward"], human["skipped_by"], human["updated_at"]) == (0.6, ["bob"], T3)
    assert j.ready("evaluator")["reward"] == 0.5
    assert j.ready(None)["completed_at"] == T0


@pytest.mark.parametrize("field", ["org", "project"])
def test_pending_event_of_another_org_or_project_is_rejected_when_the_trace_arrives(
    field: str,
) -> None:
    j = Join()
    j.send(label("l-1", "ana", T1))
    foreign = label("l-2", "bob", "2026-03-01T00:00:00Z") | {field: "other"}
    foreign_delete = delete("d-9", T2) | {field: "other"}
    assert j.send(foreign).outcome == "pending"
    assert j.send(foreign_delete).outcome == "pending"
    pending_raw = [p.raw for p in j.st.pending[1:]]
    assert [r.offset for r in pending_raw] == [1, 2]

    res = j.send(trace("t-1", T0))
    assert res.outcome == "accepted"
    assert res.accepted == 2
    assert [r for r, _ in res.rejected] == pending_raw
    assert [r.value for r, _ in res.rejected] == [raw(foreign), raw(foreign_delete)]
    assert all(rej.reason is RejectReason.ORG_MISMATCH for _, rej in res.rejected)
    assert res.snapshot is not None
    assert res.snapshot["revision"] == 2
    assert not res.snapshot["deleted"]  # the foreign deletion never counted
    assert j.st.seen == {"l-1", "t-1"}
    rec = j.ready("human")
    assert rec["labelers"] == ["ana"]
    assert rec["updated_at"] == T1  # the rejected event's later occurred_at is not counted
    # Redelivered after the trace, it is rejected again.
    assert j.send(foreign).outcome == "rejected"
    assert j.st.revision == 2


def test_pending_event_that_no_longer_decodes_is_rejected_when_the_trace_arrives() -> None:
    # Only possible if the validation rules changed while it waited (e.g. a state restored
    # by a newer version): it is dead-lettered with its decode reason and never counts.
    bad = label("l-1") | {"rubric": rubric(6, 1, 1, 1)}
    where = RawEvent(raw(bad), "labels.submitted", 1, 7, None)
    j = Join()
    j.state = TraceState("tr-1", pending=[Pending("l-1", where)], first_pending_at=NOW)
    res = j.send(trace())
    assert res.outcome == "accepted"
    assert [(r, rej.reason) for r, rej in res.rejected] == [(where, RejectReason.INVALID)]
    assert res.snapshot is not None
    assert res.snapshot["revision"] == 1
    assert j.st.seen == {"t-1"}


def test_trace_of_another_org_than_the_first_trace_is_rejected() -> None:
    j = joined(trace("t-1", T0))
    res = j.send(trace("t-2", T2, org="other", agent_version="v9"))
    assert res.outcome == "rejected"
    assert res.rejected[0][1].reason is RejectReason.ORG_MISMATCH
    assert j.ready(None)["agent_version"] == "v4"


# --- deletion ------------------------------------------------------------------------------


def test_deletion_turns_the_snapshot_into_a_tombstone() -> None:
    j = joined(trace(), label("l-1"), evaluation(results=[result("j", 0.5)]))
    res = j.send(delete("d-1", T2))
    assert res.outcome == "accepted"
    # The tombstone wins over any revision of the trace, on whichever chain it is.
    tomb = {"trace_id": "tr-1", "org": "acme", "project": "bot", "revision": ERASED_REVISION,
            "deleted": True}  # fmt: skip
    assert res.snapshot == tomb
    assert j.st.deleted_revision == 4  # the revision it was deleted at, kept in the state
    for source in SOURCES:
        rec = render(tomb, source)  # type: ignore[arg-type]
        assert rec == {**tomb, "reward_source": source}
        assert rec is not None
        assert list(rec) == TOMBSTONE_FIELDS
        Tombstone.model_validate(rec)
    # Only the tombstone is kept: nothing of the trace remains in the state.
    st = j.st
    assert (st.trace, st.evaluation, st.labels, st.skipped_by) == (None, None, {}, set())
    assert b"wellness" not in dump_state(st)


def test_events_after_deletion_are_counted_but_change_and_emit_nothing() -> None:
    j = joined(trace(), delete("d-1", T1))
    tomb = j.snap
    for n, ev in enumerate(
        [
            label("l-1", at=T3),
            trace("t-2", T3, agent_version="v9"),
            evaluation("v-1", T3, [result("j", 1.0)]),
            skip("s-1"),
            retract("r-1"),
            delete("d-2", T3),
        ],
        start=3,
    ):
        res = j.send(ev)
        assert res.outcome == "ignored"
        assert res.snapshot is None
        assert res.accepted == 1
        assert j.st.revision == n
        assert j.snap == tomb  # the tombstone as it was
    st = j.st
    assert (st.trace, st.evaluation, st.labels, st.skipped_by) == (None, None, {}, set())
    # Another org is still dead-lettered after deletion.
    assert j.send(label("l-9", at=T3) | {"org": "other"}).outcome == "rejected"
    assert j.st.revision == 8


def test_duplicate_after_deletion_reemits_the_tombstone() -> None:
    j = joined(trace("t-1"), label("l-1"), delete("d-1", T2), label("l-2", "bob", T3))
    assert j.st.revision == 4
    expected = {"trace_id": "tr-1", "org": "acme", "project": "bot",
                "revision": ERASED_REVISION, "deleted": True}  # fmt: skip
    for ev in [delete("d-1", T2), trace("t-1"), label("l-2", "bob", T3)]:
        res = j.send(ev)
        assert (res.outcome, res.snapshot) == ("duplicate", expected)
    assert j.st.revision == 4


TOMB = {"trace_id": "tr-1", "org": "acme", "project": "bot", "revision": ERASED_REVISION,
        "deleted": True}  # fmt: skip


def test_a_deletion_before_the_trace_emits_its_tombstone_at_once_and_again_when_it_arrives(
) -> None:  # fmt: skip
    """The join has no trace for it (backfilled by replay, expired, another run's): the
    deletion's tombstone goes out now, and the trace, when it comes, arrives deleted."""
    j = Join()
    assert j.send(label("l-1")).outcome == "pending"
    res = j.send(delete("d-1", T2))
    assert (res.outcome, res.snapshot) == ("pending", TOMB)
    res = j.send(skip("s-1", "bob", T3))
    assert (res.outcome, res.snapshot) == ("pending", None)
    assert j.send(delete("d-1", T2)).snapshot == TOMB  # a redelivery: the same tombstone
    assert j.send(label("l-1")).snapshot == TOMB  # any duplicate re-emits it
    res = j.send(trace("t-1", T0))
    assert res.outcome == "accepted"
    assert res.accepted == 4
    assert res.snapshot == TOMB
    assert j.st.pending == []
    assert j.st.deleted
    res = j.send(trace("t-2", T3))
    assert (res.outcome, res.snapshot, j.st.revision) == ("ignored", None, 5)
    assert j.send(delete("d-1", T2)).snapshot == TOMB


def test_a_deletion_of_another_org_before_the_trace_erases_there_not_here() -> None:
    """An early deletion names its org/project's tombstone; when the trace comes and is
    another's, the deletion is rejected like any early event of another org: the trace
    lives in its own project."""
    j = Join()
    res = j.send(delete("d-9", T2) | {"org": "other"})
    assert res.snapshot == {**TOMB, "org": "other"}
    res = j.send(trace("t-1", T0))
    assert [orjson.loads(r.value)["event_id"] for r, _ in res.rejected] == ["d-9"]
    assert res.snapshot is not None
    assert not res.snapshot["deleted"]
    assert (res.snapshot["org"], res.snapshot["revision"]) == ("acme", 1)


# --- updated_at and completed_at -----------------------------------------------------------


def test_updated_at_is_the_greatest_accepted_occurred_at_in_utc() -> None:
    j = joined(trace("t-1", "2026-01-01T05:00:00+05:00"))  # 00:00Z
    assert j.ready(None)["updated_at"] == T0
    assert j.ready(None)["completed_at"] == T0
    j.send(label("l-1", at="2026-01-01T00:00:00.25-01:00"))  # 01:00:00.25Z
    assert j.ready(None)["updated_at"] == "2026-01-01T01:00:00.250000Z"
    j.send(skip("s-1", "bob", at=T3))  # older than the label: updated_at does not go back
    assert j.ready(None)["updated_at"] == "2026-01-01T01:00:00.250000Z"
    j.send(trace("t-0", "2025-12-31T00:00:00Z"))
    rec = j.ready(None)
    assert rec["updated_at"] == "2026-01-01T01:00:00.250000Z"
    assert rec["completed_at"] == T0  # the current trace's occurred_at
    j.send(trace("t-2", "2026-01-02T00:00:00+00:00"))
    rec = j.ready(None)
    assert (rec["completed_at"], rec["updated_at"]) == ("2026-01-02T00:00:00Z",) * 2


# --- records -------------------------------------------------------------------------------


def test_full_record_validates_with_fields_in_design_order() -> None:
    attachment = {
        "name": "log",
        "uri": "s3://b/log",
        "content_type": "text/plain",
        "size": 0,
        "sha": "x",
    }
    j = joined(
        trace("t-1", T0, attachments=[attachment], metadata={"k": 1}, extra_field=True),
        evaluation("v-1", T1, [result("a", 0.5, reasoning=None), result("b", 1.0, extra=1)]),
        label("l-1", "ana", T2),
        label("l-2", "bob", T2, r=(1, 1, 1, 1)),
        skip("s-1", "cy"),
    )
    for source in SOURCES:
        rec = j.ready(source)
        assert list(rec) == RECORD_FIELDS
        model = TrajectoryRecord.model_validate(rec)
        assert model.model_dump(mode="json")["attachments"] == [attachment]
        assert rec["trace_id"] == "tr-1"
        assert (rec["org"], rec["project"]) == ("acme", "bot")


def test_messages_pass_through_exactly() -> None:
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": None},
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "hi"},
                {"type": "image_url", "image_url": {"url": "x"}},
            ],
        },
        {
            "role": "assistant",
            "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
            ],
        },
        {"tool_call_id": "c1", "role": "tool", "content": "42", "name": "f", "custom": {"a": 1}},
        {"role": "assistant", "content": "", "name": None},
    ]
    j = joined(trace(messages=messages), label("l-1"), evaluation(results=[result("j", 1.0)]))
    for source in SOURCES:
        rec = j.ready(source)
        assert rec["messages"].value() == messages
        # Byte-for-byte: no key added, dropped, null-filled or reordered.
        assert dumps(rec["messages"]) == orjson.dumps(messages)
        assert "content" not in rec["messages"].value()[2]
    reloaded = current_snapshot(load_state(dump_state(j.st)), CONFIG)
    assert reloaded is not None
    assert dumps(reloaded["messages"]) == orjson.dumps(messages)


# --- state ---------------------------------------------------------------------------------


def _state(name: str) -> TraceState:
    if name == "pending":
        pending = Join()
        pending.send(label("l-1", "ana"), now=NOW - 50)
        pending.send(evaluation("v-1", T1, [result("j", 0.5, reasoning="é ✓ \u2028")]), now=NOW)
        pending.send(delete("d-1"), now=NOW + 1)
        return pending.st
    if name == "live":
        return joined(
            trace(
                "t-1", T0, attachments=[{"name": "a", "uri": "u", "content_type": "", "size": 1}]
            ),
            evaluation(
                "v-1",
                T1,
                [result("j", 0.5, reasoning="ok")],
                report={"outcomes": [{"type": "x"}], "classifications": []},
            ),
            label("l-1", "ana"),
            {**label("l-2", "dee"), "comment": "tone: \u2028 <b>curt</b>"},
            retract("r-1", "bob"),
            skip("s-1", "cy"),
        ).st
    assert name == "deleted"
    return joined(trace(), label("l-1"), delete("d-1"), label("l-2", "bob", T3)).st


@pytest.mark.parametrize("name", ["pending", "live", "deleted"])
def test_dump_and_load_state_round_trip(name: str) -> None:
    state = _state(name)
    data = dump_state(state)
    loaded = load_state(data)
    assert loaded == state
    assert dump_state(loaded) == data
    assert current_snapshot(loaded, CONFIG) == current_snapshot(state, CONFIG)
    if name == "pending":
        assert [p.raw for p in loaded.pending] == [p.raw for p in state.pending]
        assert [p.raw.offset for p in loaded.pending] == [0, 1, 2]
        assert loaded.pending[0].raw.topic == "labels.submitted"
        assert loaded.pending[0].raw.partition == 3
        assert loaded.pending[0].raw.timestamp_ms == 1_700_000_000_000
        assert loaded.first_pending_at == NOW - 50


def test_loaded_pending_state_joins_like_the_original() -> None:
    original = Join()
    original.feed(label("l-1"), skip("s-1", "bob"), evaluation(results=[result("j", 0.5)]))
    copy = Join()
    copy.state = load_state(dump_state(original.st))
    a, b = original.send(trace()), copy.send(trace())
    assert a.snapshot == b.snapshot
    assert a.snapshot is not None
    assert a.snapshot["revision"] == 4
    assert dump_state(original.st) == dump_state(copy.st)


def test_state_keeps_no_raw_spans_but_the_metadata_the_records_carry() -> None:
    spans = [{"name": "secret-span", "attributes": {"k": "secret-attr"}}]
    j = joined(trace(spans=spans, metadata={"tier": "gold", "n": 3}))
    data = dump_state(j.st)
    for secret in (b"secret-span", b"secret-attr"):
        assert secret not in data
    assert load_state(data) == j.st
    assert j.ready(None)["metadata"] == {"tier": "gold", "n": 3}


def test_a_trace_without_metadata_has_an_empty_object_and_an_older_state_none() -> None:
    j = joined(trace())
    assert j.ready(None)["metadata"] == {}
    assert j.st.trace is not None
    j.st.trace.metadata = None  # a state kept before the join kept metadata
    loaded = load_state(dump_state(j.st))
    assert loaded == j.st
    assert "metadata" not in j.ready(None)


def test_load_state_rejects_an_unknown_version() -> None:
    with pytest.raises(ValueError, match="version"):
        load_state(orjson.dumps({"v": 99, "id": "tr-1"}))
    data = dump_state(joined(trace()).st)
    with pytest.raises(ValueError, match="version"):
        load_state(b"\x09" + data[1:])


def test_a_version_2_state_loads_as_the_state_it_was() -> None:
    """Tables written before version 3 (one JSON object, messages on a second line)."""
    st = joined(
        trace(attachments=[{"name": "a", "uri": "s3://b/a", "content_type": "t", "size": 1}]),
        evaluation(results=[result("j", 0.5), result("i", 1.0, False)],
                   report={"outcomes": [{"type": "g", "decision": True}]}),
        label("l-1"), retract("r-1", "bob"), skip("s-1", "cy"),
    ).st  # fmt: skip
    assert st.evaluation is not None
    assert st.trace is not None
    view = st.evaluation.view.value()
    old = {
        "v": 2, "id": st.trace_id, "org": st.org, "project": st.project,
        "seen": sorted(st.seen), "pending": [], "first_pending_at": None,
        "trace": [list(st.trace.key), st.trace.agent_version, st.trace.scenario,
                  st.trace.attachments.value()],
        "evaluation": [list(st.evaluation.key), st.evaluation.evaluation_id, view["results"],
                       view["report"]],
        "labels": {k: [list(v.key), None if v.rubric is None else list(v.rubric)]
                   for k, v in sorted(st.labels.items())},
        "skipped_by": sorted(st.skipped_by), "updated_at": st.updated_at,
        "deleted_at": None, "deleted_revision": 0,
    }  # fmt: skip
    loaded = load_state(orjson.dumps(old) + b"\n" + st.trace.messages.data)
    st.trace.metadata = None  # version 2 did not keep it
    assert loaded == st
    assert dump_state(loaded) == dump_state(st)


def test_encode_current_is_the_encoded_current_snapshot() -> None:
    for state in (_state("pending"), _state("live"), _state("deleted")):
        fast = encode_current(state, CONFIG)
        plain = current_snapshot(state, CONFIG)
        if plain is None:
            assert fast is None
            continue
        assert fast is not None
        assert decode_snapshot(fast[0]) == decode_snapshot(encode_snapshot(plain)[0])


BIG = b"123456789012345678901234567890"
BIG_TRACE = (
    b'{"event_id":"t-1","event_type":"trace.completed","occurred_at":"2026-01-01T00:00:00Z",'
    b'"org":"acme","project":"bot","trace_id":"tr-1","agent_version":"v","scenario":"s",'
    b'"messages":[{"role":"tool","content":null,"x":NUMBER}]}'
)


def test_an_integer_beyond_64_bits_is_rejected_not_stored() -> None:
    # orjson cannot write such an integer back, so the state could not be stored.
    data = BIG_TRACE.replace(b"NUMBER", BIG)
    decoded = decode_event(data, max_bytes=1 << 20, now=NOW_DT, future_tolerance_s=DAY)
    assert isinstance(decoded, EventRejection)
    assert decoded.reason == RejectReason.INVALID
    assert "64-bit" in decoded.detail


def test_a_19_digit_integer_within_range_is_kept() -> None:
    data = BIG_TRACE.replace(b"NUMBER", b"9223372036854775807")
    res = merge(None, decode(data), RawEvent(data), now=NOW, config=CONFIG)
    loaded = load_state(dump_state(res.state))
    assert loaded.trace is not None
    assert loaded.trace.messages.value()[0]["x"] == 9223372036854775807


@pytest.mark.parametrize("literal", [b"NaN", b"Infinity", b"-Infinity"])
def test_non_json_numbers_are_rejected_as_bad_json(literal: bytes) -> None:
    data = BIG_TRACE.replace(b"NUMBER", literal)
    decoded = decode_event(data, max_bytes=1 << 20, now=NOW_DT, future_tolerance_s=DAY)
    assert isinstance(decoded, EventRejection)
    assert decoded.reason == RejectReason.BAD_JSON


def test_the_word_infinity_in_text_is_fine() -> None:
    data = BIG_TRACE.replace(b"NUMBER", b'"to Infinity and beyond, NaN times"')
    assert not isinstance(
        decode_event(data, max_bytes=1 << 20, now=NOW_DT, future_tolerance_s=DAY), EventRejection
    )


# --- retention -----------------------------------------------------------------------------


def test_orphans_expire_after_retention_from_the_first_pending_event() -> None:
    orphan_retention, tomb_retention = 7 * DAY, 2 * DAY
    j = Join()
    j.send(label("l-1"), now=1000.0)
    j.send(skip("s-1"), now=1000.0 + 5 * DAY)  # a later one does not restart the clock
    assert j.st.first_pending_at == 1000.0
    assert expired(j.st, 1000.0 + 7 * DAY - 1, orphan_retention, tomb_retention) is None
    assert expired(j.st, 1000.0 + 7 * DAY, orphan_retention, tomb_retention) == "orphan"
    assert expired(j.st, 1000.0 + 70 * DAY, orphan_retention, tomb_retention) == "orphan"
    # Once the trace arrives it is live and never expires.
    j.send(trace(), now=1000.0 + 6 * DAY)
    for later in (1000.0 + 7 * DAY, 1e12):
        assert expired(j.st, later, orphan_retention, tomb_retention) is None
    assert expired(joined(trace()).st, 1e12, 0.0, 0.0) is None


def test_tombstones_expire_after_tombstone_retention() -> None:
    j = Join()
    j.send(trace(), now=1000.0)
    j.send(delete(), now=2000.0)
    assert j.st.deleted_at == 2000.0
    assert expired(j.st, 2000.0 + DAY - 1, 0.0, DAY) is None
    assert expired(j.st, 2000.0 + DAY, 0.0, DAY) == "tombstone"
    # Later events do not restart the clock.
    j.send(label("l-1"), now=2000.0 + DAY / 2)
    assert expired(j.st, 2000.0 + DAY, 1e12, DAY) == "tombstone"


def test_deletion_before_the_trace_is_an_orphan_until_the_trace_then_a_tombstone() -> None:
    j = Join()
    j.send(delete(), now=1000.0)
    assert expired(j.st, 1000.0 + DAY, DAY, 10 * DAY) == "orphan"
    j.send(trace(), now=3000.0)
    assert j.st.deleted
    assert expired(j.st, 3000.0 + 10 * DAY - 1, DAY, 10 * DAY) is None
    assert expired(j.st, 3000.0 + 10 * DAY, DAY, 10 * DAY) == "tombstone"


# --- order independence (property tests) ---------------------------------------------------

# A small set of instants so that ties happen; some are the same instant written two ways.
AT = (
    "2026-01-01T00:00:00Z",
    "2026-01-01T02:00:00+02:00",  # = the one above
    "2026-01-01T00:00:01Z",
    "2025-12-31T23:00:01-01:00",  # = the one above
    "2026-01-01T00:00:00.5Z",
)
LABELERS = ("ana", "bob", "cy")
SCORES = (0.0, 0.1, 0.2, 0.3, 0.7, 1.0)
PROPERTY = settings(
    max_examples=200, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow]
)

rubrics = st.tuples(*[st.integers(1, 5)] * 4)
evaluator_results = st.lists(
    st.tuples(st.sampled_from(("a", "b", "c")), st.sampled_from(SCORES), st.booleans()),
    max_size=3,
    unique_by=lambda r: r[0],
)
label_specs = st.tuples(
    st.sampled_from(("label.submitted", "label.retracted", "label.skipped")),
    st.sampled_from(LABELERS),
    rubrics,
)
foreign_specs = st.tuples(
    st.sampled_from(("label.submitted", "evaluation.finished", "trace.deleted", "label.skipped")),
    st.sampled_from(("org", "project")),
)


@st.composite
def trace_events(
    draw: st.DrawFn, *, allow_delete: bool = True, foreign: tuple[int, int] = (0, 0)
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Return (own events, foreign events) of trace tr-1, with unique event_ids."""
    kinds: list[tuple[str, Any]] = [("trace", None)] * draw(st.integers(1, 2))
    kinds += [("eval", r) for r in draw(st.lists(evaluator_results, max_size=2))]
    kinds += [("label", s) for s in draw(st.lists(label_specs, max_size=6))]
    if allow_delete and draw(st.booleans()):
        kinds.append(("delete", None))
    n_own = len(kinds)
    kinds += [
        ("foreign", s)
        for s in draw(st.lists(foreign_specs, min_size=foreign[0], max_size=foreign[1]))
    ]
    ids = draw(st.permutations([f"e{i:02d}" for i in range(len(kinds))]))
    events: list[dict[str, Any]] = []
    for eid, (kind, spec) in zip(ids, kinds, strict=True):
        at = draw(st.sampled_from(AT))
        if kind == "trace":
            events.append(
                trace(
                    eid,
                    at,
                    agent_version=f"v-{eid}",
                    scenario=f"s-{eid}",
                    messages=[{"role": "user", "content": eid}],
                )
            )
        elif kind == "eval":
            results = [result(n, s, p, reasoning=f"r-{n}") for n, s, p in spec]
            events.append(evaluation(eid, at, results))
        elif kind == "label":
            event_type, labeler, r = spec
            fields: dict[str, Any] = {"labeler": labeler}
            if event_type == "label.submitted":
                fields["rubric"] = rubric(*r)
            events.append(event(event_type, eid, at, **fields))
        elif kind == "delete":
            events.append(delete(eid, at))
        else:
            event_type, field = spec
            events.append(event(event_type, eid, at, **{field: "other"}))
    return events[:n_own], events[n_own:]


def arrivals(draw: st.DrawFn, events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A random arrival order of ``events`` with a few redeliveries mixed in."""
    order = list(draw(st.permutations(events)))
    n = len(order)
    for src, dst in draw(st.lists(st.tuples(st.integers(0, n - 1), st.integers(0, n)), max_size=4)):
        order.insert(dst, order[src])
    return order


def _key(ev: dict[str, Any]) -> tuple[datetime, str]:
    return (parse_rfc3339(ev["occurred_at"]), ev["event_id"])


def fold(order: list[dict[str, Any]], decoded: dict[str, BaseEvent]) -> dict[str, Any]:
    """Merge ``order`` one by one, checking per-step invariants; return what happened."""
    state: TraceState | None = None
    seen_ids: set[str] = set()
    rejected: list[str] = []
    last_revision = 0
    for offset, ev in enumerate(order):
        data = raw(ev)
        res = merge(
            state, decoded[ev["event_id"]], RawEvent(data, "t", 0, offset), now=NOW, config=CONFIG
        )
        assert state is None or res.state is state
        state = res.state
        eid = ev["event_id"]
        if eid in seen_ids:
            assert res.outcome in {"duplicate", "rejected"}
        if res.outcome == "duplicate":
            assert eid in seen_ids
            assert res.snapshot == current_snapshot(state, CONFIG)
        if res.outcome == "pending" and ev["event_type"] == "trace.deleted":
            assert res.snapshot is not None  # a deletion's tombstone does not wait
            assert res.snapshot["deleted"]
        elif res.outcome in {"pending", "ignored", "rejected"}:
            assert res.snapshot is None
        if res.outcome == "accepted":
            assert res.snapshot is not None
        seen_ids.add(eid)
        for where, rejection in res.rejected:
            assert rejection.reason is RejectReason.ORG_MISMATCH
            rejected.append(orjson.loads(where.value)["event_id"])
        assert state.revision >= last_revision  # revision only grows
        last_revision = state.revision
        check_snapshot(res.snapshot)
        if res.snapshot is not None and not res.snapshot["deleted"]:
            assert res.snapshot["revision"] == state.revision
        if res.snapshot is not None and res.snapshot["deleted"]:
            assert res.snapshot["revision"] == ERASED_REVISION
    assert state is not None
    return {
        "state": state,
        "dump": dump_state(state),
        "snapshot": current_snapshot(state, CONFIG),
        "rejected": rejected,
    }


def expected_snapshot(own: list[dict[str, Any]]) -> dict[str, Any]:
    """An independent oracle of DESIGN section 3 for a live trace's snapshot."""
    t = max((e for e in own if e["event_type"] == "trace.completed"), key=_key)
    evals = [e for e in own if e["event_type"] == "evaluation.finished"]
    current_eval = max(evals, key=_key) if evals else None
    latest: dict[str, dict[str, Any]] = {}
    for e in sorted(
        (e for e in own if e["event_type"] in ("label.submitted", "label.retracted")), key=_key
    ):
        latest[e["labeler"]] = e
    current = {k: e["rubric"] for k, e in latest.items() if e["event_type"] == "label.submitted"}
    out: dict[str, Any] = {
        "revision": len(own),
        "agent_version": t["agent_version"],
        "messages": RawJson(orjson.dumps(t["messages"])),
        "completed_at": format_utc(parse_rfc3339(t["occurred_at"])),
        "updated_at": format_utc(max(parse_rfc3339(e["occurred_at"]) for e in own)),
        "skipped_by": sorted({e["labeler"] for e in own if e["event_type"] == "label.skipped"}),
        "labelers": sorted(current),
        "labels_count": len(current),
        "human": None,
        "rubric": None,
        "evaluator": None,
        "evaluator_scores": None,
        "evaluation_id": None if current_eval is None else current_eval["evaluation_id"],
    }
    if current:
        n = len(current)
        sums = {d: sum(r[d] for r in current.values()) for d in rubric(1, 1, 1, 1)}
        reward = sum(sums.values()) / (20 * n)
        out["human"] = {"reward": reward, "passed": reward >= 0.7}
        out["rubric"] = {d: s / n for d, s in sums.items()}
    if current_eval is not None and current_eval["results"]:
        results = sorted(current_eval["results"], key=lambda r: r["evaluator"])
        total = 0.0
        for r in results:
            total += r["score"]
        out["evaluator"] = {
            "reward": total / len(results),
            "passed": all(r["passed"] for r in results),
        }
        out["evaluator_scores"] = {r["evaluator"]: r["score"] for r in results}
    return out


def check_against_oracle(snapshot: dict[str, Any], own: list[dict[str, Any]]) -> None:
    expected = expected_snapshot(own)
    got = {k: snapshot[k] for k in expected if k != "evaluation_id"}
    got["evaluation_id"] = (
        None if snapshot["evaluation"] is None else snapshot["evaluation"]["evaluation_id"]
    )
    assert got == expected


def without_deleted_revision(dump: bytes) -> bytes:
    """A dumped state with ``deleted_revision`` cleared (it depends on arrival order)."""
    state = load_state(dump)
    state.deleted_revision = 0
    return dump_state(state)


@PROPERTY
@given(events=trace_events(), data=st.data())
def test_join_does_not_depend_on_arrival_order(
    events: tuple[list[dict[str, Any]], list[dict[str, Any]]], data: st.DataObject
) -> None:
    own, _ = events
    decoded = {e["event_id"]: EVENT_ADAPTER.validate_json(raw(e)) for e in own}
    runs = [fold(own, decoded)] + [fold(arrivals(data.draw, own), decoded) for _ in range(2)]
    deleted = any(e["event_type"] == "trace.deleted" for e in own)
    for run in runs:
        state = run["state"]
        assert state.revision == len(own)
        assert state.seen == {e["event_id"] for e in own}
        assert state.pending == []
        assert run["rejected"] == []
        assert state.deleted is deleted
        if deleted:
            # The tombstone, whenever the deletion came (the revision the trace was deleted
            # at, kept in the state, depends on that; nothing else does).
            assert run["snapshot"] == TOMB
            assert 1 <= state.deleted_revision <= len(own)
        else:
            check_against_oracle(run["snapshot"], own)
    first = runs[0]
    for run in runs[1:]:
        if deleted:
            assert without_deleted_revision(run["dump"]) == without_deleted_revision(first["dump"])
        else:
            assert run["dump"] == first["dump"]
            assert run["snapshot"] == first["snapshot"]


@PROPERTY
@given(events=trace_events(foreign=(1, 3)), data=st.data())
def test_events_of_another_org_are_rejected_in_every_order(
    events: tuple[list[dict[str, Any]], list[dict[str, Any]]], data: st.DataObject
) -> None:
    own, foreign = events
    foreign_ids = {e["event_id"] for e in foreign}
    decoded = {e["event_id"]: EVENT_ADAPTER.validate_json(raw(e)) for e in own + foreign}
    reference = fold(own, decoded)
    for _ in range(3):
        run = fold(arrivals(data.draw, own + foreign), decoded)
        state = run["state"]
        assert set(run["rejected"]) == foreign_ids
        assert not state.seen & foreign_ids
        assert state.revision == len(own)
        assert state.pending == []
        if state.deleted:
            assert without_deleted_revision(run["dump"]) == without_deleted_revision(
                reference["dump"]
            )
        else:
            assert run["dump"] == reference["dump"]
            assert run["snapshot"] == reference["snapshot"]


def test_expiry_since_reads_the_states_head_alone() -> None:
    """What a restore asks of every state it applies, without loading it (versions 3 and 2)."""
    orphan = Join()
    orphan.send(label("l-1", "ana"), now=NOW - 50)
    states = [orphan.st, *(_state(name) for name in ("pending", "live", "deleted"))]
    seen: set[str | None] = set()
    for state in states:
        want = expired(state, now=1e12, orphan_retention_s=0, tombstone_retention_s=0)
        since = expiry_since(dump_state(state))
        seen.add(want)
        assert (None if since is None else since[0]) == want
        if since is not None:
            assert since[1] == (state.deleted_at if want == "tombstone" else state.first_pending_at)
        old = {"v": 2, "trace": None if state.trace is None else [], "deleted_at": state.deleted_at,
               "first_pending_at": state.first_pending_at}  # fmt: skip
        assert expiry_since(orjson.dumps(old) + b"\n[]") == since
    assert seen == {None, "orphan", "tombstone"}
