"""The join with rubric versions (docs/guides/rubrics.md): labels checked against their version
(``invalid_rubric`` otherwise), versions read from the store once, rewards from exact fractions
whatever the order, adjudications, and records that keep each label's version and reward.

The processor runs over a :class:`MemoryStore` holding the versions, as the worker does over
its store (:class:`~rl_export.corpora.rubrics.RubricVersions`)."""

from __future__ import annotations

from datetime import UTC, datetime
from fractions import Fraction
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rl_export.corpora.rubrics import RubricVersions, version_key
from rl_export.corpora.store import MemoryStore
from rl_export.model.codec import dumps_line
from rl_export.model.errors import StoreError
from rl_export.model.events import RejectReason
from rl_export.model.records import TrajectoryRecord, render
from rl_export.model.rubrics import RubricSpec, label_reward
from rl_export.model.snapshots import decode_snapshot
from rl_export.stream.join import JoinConfig, snapshot_from_record
from rl_export.stream.state import dump_state, load_state
from tests.factories import RUBRIC, event
from tests.unit.model.test_rubrics import ALL_KINDS
from tests.unit.stream.test_processor import Harness, label, trace

NOW = datetime(2026, 1, 2, tzinfo=UTC)
V1 = RubricSpec.model_validate(ALL_KINDS)
V2 = RubricSpec.model_validate(
    {"questions": [{"name": "quality", "title": "Quality", "kind": "rating", "min": 0, "max": 10}]}
)
ANSWERS_1 = {"quality": 3, "tone": "warm", "solved": False, "notes": "slow but right"}


async def harness(*specs: RubricSpec) -> tuple[Harness, MemoryStore]:
    """A processor whose store holds ``specs`` as versions 1, 2, ... of acme/bot."""
    store = MemoryStore()
    versions = RubricVersions(store)
    for spec in specs:
        await versions.create("acme", "bot", spec, by="admin", now=NOW)
    h = Harness()
    h.processor.rubrics.source = RubricVersions(store)  # a join reads them afresh
    return h, store


def answered(event_id: str, labeler: str, version: int, answers: dict[str, Any], *,
             at: str = "2026-01-01T00:00:05Z", **fields: Any) -> dict[str, Any]:  # fmt: skip
    return label(event_id, labeler=labeler, rubric=answers, rubric_version=version, at=at, **fields)


def last_snapshot(h: Harness, trace_id: str = "tr-1") -> dict[str, Any]:
    key = trace_id.encode()
    value = next(v for k, v, _ in reversed(h.emitter.snapshots) if k == key)
    return decode_snapshot(value)


def human_record(h: Harness) -> dict[str, Any]:
    record = render(last_snapshot(h), "human")
    assert record is not None
    TrajectoryRecord.model_validate_json(dumps_line(record))  # the contract's model
    return record


async def test_a_label_of_a_version_carries_its_version_answers_and_exact_reward() -> None:
    h, _ = await harness(V1)
    result = await h.run(trace(), answered("l-1", "ana", 1, ANSWERS_1))
    assert result.rejected == []
    record = human_record(h)
    reward = label_reward(V1, ANSWERS_1)
    assert record["reward"] == float(reward)
    assert record["passed"] is (float(reward) >= 0.7)
    (entry,) = record["human_labels"]
    assert entry == {
        "labeler": "ana", "rubric": {"quality": 3, "tone": 1.0, "solved": 0, "notes": None},
        "comment": None, "occurred_at": "2026-01-01T00:00:05Z", "rubric_version": 1,
        "kind": "label", "answers": ANSWERS_1, "reward": float(reward),
    }  # fmt: skip
    assert record["rubric"] == {"quality": 3.0, "tone": 1.0, "solved": 0.0, "notes": None}


@pytest.mark.parametrize(
    ("version", "answers", "detail"),
    [
        (1, {**ANSWERS_1, "quality": 9}, "rubric.quality: 9 is outside 1..4 (rubric version 1)"),
        (1, {"quality": 2}, "rubric.tone: required"),
        (1, {**ANSWERS_1, "correctness": 4}, "rubric.correctness: not a question"),
        (2, {"quality": 11}, "rubric.quality: 11 is outside 0..10"),
        (3, {"quality": 1}, "rubric version 3 of acme/bot does not exist"),
    ],
)
async def test_answers_that_do_not_fit_their_version_are_dead_lettered(
    version: int, answers: dict[str, Any], detail: str
) -> None:
    h, _ = await harness(V1, V2)
    bad = h.message(answered("l-1", "ana", version, answers))
    result = await h.run(trace(), bad)
    ((sent, rejection),) = result.rejected
    assert rejection.reason is RejectReason.INVALID_RUBRIC
    assert detail in rejection.detail
    assert sent.value == bad.value  # the original bytes, for a replay once fixed
    assert h.metric("rl_export_dead_letters_total", reason="invalid_rubric") == 1
    assert last_snapshot(h)["revision"] == 1  # it never counted
    assert h.state("tr-1").labels == {}


async def test_a_label_waiting_for_its_trace_is_checked_when_it_arrives() -> None:
    h, _ = await harness(V1)
    first = await h.run(answered("l-1", "ana", 1, {"quality": 0}))
    assert [r.reason for _, r in first.rejected] == [RejectReason.INVALID_RUBRIC]
    await h.run(answered("l-2", "bo", 1, ANSWERS_1))
    await h.run(trace())
    assert [e["labeler"] for e in human_record(h)["human_labels"]] == ["bo"]


async def test_a_label_for_an_old_version_after_a_change_keeps_its_version_and_reward() -> None:
    h, store = await harness(V1)
    await h.run(trace(), answered("l-1", "ana", 1, ANSWERS_1, at="2026-01-01T00:00:01Z"))
    await RubricVersions(store).create("acme", "bot", V2, by="admin", now=NOW)  # version 2
    await h.run(
        answered("l-2", "bo", 2, {"quality": 7}, at="2026-01-01T00:00:02Z"),
        answered("l-3", "cy", 1, {**ANSWERS_1, "quality": 1}, at="2026-01-01T00:00:03Z"),
    )
    record = human_record(h)
    entries = {e["labeler"]: e for e in record["human_labels"]}
    assert {k: e["rubric_version"] for k, e in entries.items()} == {"ana": 1, "bo": 2, "cy": 1}
    rewards = [label_reward(V1, ANSWERS_1), Fraction(7, 10),
               label_reward(V1, {**ANSWERS_1, "quality": 1})]  # fmt: skip
    assert entries["ana"]["reward"] == float(rewards[0])
    assert record["reward"] == float(sum(rewards, Fraction(0)) / 3)
    # The means are those of the newest label's version (cy: version 1), over its labels.
    assert record["rubric"]["quality"] == 2.0
    assert record["rubric"]["notes"] is None


async def test_an_adjudication_is_the_human_reward_and_the_labels_stay() -> None:
    h, _ = await harness()
    low = dict(RUBRIC, correctness=1, helpfulness=1)
    await h.run(trace(), label("l-1", labeler="ana"), label("l-2", labeler="bo", rubric=low))
    before = human_record(h)
    decision = {"correctness": 5, "helpfulness": 5, "efficiency": 5, "safety": 5}
    result = await h.run(label("a-1", labeler="rev", rubric=decision, kind="adjudication",
                               comment="ana is right", at="2026-01-01T00:00:09Z"))  # fmt: skip
    assert result.rejected == []
    record = human_record(h)
    assert (record["reward"], record["passed"]) == (1.0, True)
    assert record["labelers"] == before["labelers"] == ["ana", "bo"]
    assert record["labels_count"] == 2
    assert record["rubric"] == before["rubric"]
    kinds = [(e["labeler"], e.get("kind", "label")) for e in record["human_labels"]]
    assert kinds == [("ana", "label"), ("bo", "label"), ("rev", "adjudication")]
    adjudication = record["human_labels"][2]
    assert adjudication["rubric_version"] == 0
    assert adjudication["reward"] == 1.0
    # A later adjudication (any reviewer) replaces it; the state keeps it across a restart.
    await h.run(label("a-2", labeler="rev2", rubric=low, kind="adjudication",
                      at="2026-01-01T00:00:10Z"))  # fmt: skip
    assert human_record(h)["reward"] == float(Fraction(sum(low.values()), 20))
    assert h.state("tr-1").adjudication is not None
    assert h.state("tr-1").adjudication[0] == "rev2"  # type: ignore[index]


async def test_store_failures_fail_the_batch_and_lose_nothing() -> None:
    h, store = await harness(V1)

    class Down(RubricVersions):
        async def fetch(self, org: str, project: str, version: int) -> RubricSpec | None:
            raise StoreError("the store is away")

    h.processor.rubrics.source = Down(store)
    batch = [h.message(trace()), h.message(answered("l-1", "ana", 1, ANSWERS_1))]
    with pytest.raises(StoreError):
        await h.processor.process(batch, now=NOW.timestamp())
    assert h.emitter.snapshots == []
    assert h.table.data == {}
    h.processor.rubrics.source = RubricVersions(store)
    result = await h.processor.process(batch, now=NOW.timestamp())
    assert result.rejected == []
    assert human_record(h)["labels_count"] == 1


async def test_versions_are_read_once() -> None:
    h, store = await harness(V1)
    reads: list[str] = []
    original = store.get

    async def counted(key: str) -> bytes:
        reads.append(key)
        return await original(key)

    store.get = counted  # type: ignore[method-assign]
    for n in range(5):
        await h.run(trace(f"t-{n}", trace_id=f"tr-{n}"),
                    answered(f"l-{n}", "ana", 1, ANSWERS_1, trace_id=f"tr-{n}"))  # fmt: skip
    assert reads == [version_key("acme", "bot", 1)]


def test_states_with_answers_and_an_adjudication_round_trip() -> None:
    from rl_export.stream.humans import LabelView
    from rl_export.stream.join import TraceState

    st_ = TraceState("tr", "acme", "bot", seen={"a"})
    st_.labels["ana"] = LabelView((1, "a"), None, "why", dict(ANSWERS_1), 1)
    st_.labels["bo"] = LabelView((2, "b"), (1, 2, 3, 4), "c")
    st_.labels["cy"] = LabelView((3, "c"), None)
    st_.adjudication = ("rev", LabelView((4, "d"), None, None, {"quality": 2}, 2))
    assert load_state(dump_state(st_)) == st_


# --- order independence ------------------------------------------------------------------------

EVENTS = [
    ("ana", 0, dict(RUBRIC)),
    ("bo", 1, ANSWERS_1),
    ("cy", 2, {"quality": 4}),
    ("ana", 1, {**ANSWERS_1, "tone": "rude"}),
    ("dee", 0, dict(RUBRIC, safety=1)),
]


@settings(max_examples=25, deadline=None)
@given(st.permutations(range(len(EVENTS) + 3)), st.booleans())
async def test_the_record_is_the_same_whatever_the_arrival_order(
    order: list[int], adjudicate: bool
) -> None:
    """Mixed versions, a relabel, a retraction, an adjudication and the trace, in any order:
    one record, byte for byte, whose reward is the exact mean (or the adjudication's)."""
    events = [answered(f"l-{n}", who, v, a, at=f"2026-01-01T00:00:{10 + n:02d}Z")
              for n, (who, v, a) in enumerate(EVENTS)]  # fmt: skip
    events.append(event("label.retracted", "r-1", "2026-01-01T00:00:30Z", labeler="dee"))
    events.append(answered("a-1", "rev", 2, {"quality": 9}, kind="adjudication")
                  if adjudicate else trace("t-2", at="2026-01-01T00:00:00Z"))  # fmt: skip
    events.append(trace())
    lines = []
    for permutation in (list(range(len(events))), order):
        h, _ = await harness(V1, V2)
        for n in permutation:
            await h.run(events[n])
        lines.append(dumps_line(human_record(h)))
    assert lines[0] == lines[1]
    record = orjson.loads(lines[0])
    rude = label_reward(V1, {**ANSWERS_1, "tone": "rude"})
    expected = Fraction(9, 10) if adjudicate else (
        rude + label_reward(V1, ANSWERS_1) + Fraction(4, 10)) / 3  # fmt: skip
    assert record["reward"] == float(expected)


async def test_a_backfill_computes_the_same_records_from_the_traces_corpus() -> None:
    """``snapshot_from_record`` (the sink's backfill) gives each source's record again, byte for
    byte, from the traces record and the versions its labels name."""
    h, store = await harness(V1, V2)
    await h.run(trace(), answered("l-1", "ana", 1, ANSWERS_1),
                answered("l-2", "bo", 2, {"quality": 3}), label("l-3", labeler="cy"))  # fmt: skip
    snapshot = last_snapshot(h)
    traces = render(snapshot, None)
    assert traces is not None
    rubrics = RubricVersions(store)
    for version in (1, 2):
        await rubrics.get("acme", "bot", version)
    rebuilt = snapshot_from_record(orjson.loads(dumps_line(traces)), rubrics.known)
    for source in ("human", "evaluator", None):
        assert dumps_line(render(rebuilt, source)) == dumps_line(render(snapshot, source))  # type: ignore[arg-type]


def test_join_config_keeps_version_0_built_in() -> None:
    assert JoinConfig().rubrics.spec("any", "project", 0) is not None
