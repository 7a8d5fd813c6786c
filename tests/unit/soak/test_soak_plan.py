"""The soak's plan and verdicts: deterministic, every case is what it claims, checks can fail."""

from __future__ import annotations

from collections import Counter
from datetime import UTC, datetime

import orjson

from rl_export.model.events import EVENT_ADAPTER, EventRejection, RejectReason, decode_event
from rl_export.model.partitioning import partition_for
from tests.harness.fold import expected_final
from tests.soak.soak import SHORT
from tests.soak.soak_checks import check_dead_letters, compare_corpus
from tests.soak.soak_plan import SoakSize, make_plan

START = datetime(2026, 6, 1, tzinfo=UTC)


def test_the_same_seed_gives_the_same_plan_and_another_seed_another() -> None:
    one, again, other = (make_plan(s, SHORT, START) for s in (5, 5, 6))
    assert one.sends == again.sends
    assert one.faults == again.faults
    assert one.sends != other.sends


def test_every_record_is_what_it_claims_to_be() -> None:
    size = SoakSize(duration_s=120, rate=40)
    plan = make_plan(7, size, START)
    kinds: Counter[str] = Counter()
    for send in plan.sends:
        kinds[send.kind] += 1
        assert 0 <= send.at < size.duration_s
        result = decode_event(
            send.value, max_bytes=size.max_event_bytes, now=START, future_tolerance_s=86400,
            key=send.key, family=send.family,
        )  # fmt: skip
        if send.expect in (None, RejectReason.ORG_MISMATCH, RejectReason.INVALID_RUBRIC):
            # valid alone: the join finds the other org's trace, or no such rubric version
            assert not isinstance(result, EventRejection), (send.kind, result)
        else:  # the join rejects it for the reason it is marked with
            assert isinstance(result, EventRejection)
            assert result.reason.value == send.expect
        if send.kind == "misrouted":
            assert send.partition != partition_for(send.key, size.partitions)
    assert {r.value for r in RejectReason} <= set(kinds)
    for kind in ("event", "late", "redelivery", "misrouted", "deletion"):
        assert kinds[kind] > 0, kind


def test_org_mismatches_hit_traces_that_exist_and_never_count() -> None:
    plan = make_plan(8, SoakSize(duration_s=200, rate=20), START)
    valid = [s.value for s in plan.sends if s.expect is None]
    traces = {EVENT_ADAPTER.validate_json(v).trace_id for v in valid}
    mismatched = [orjson.loads(s.value) for s in plan.sends if s.expect == "org_mismatch"]
    assert mismatched
    assert {e["trace_id"] for e in mismatched} <= traces
    with_them = expected_final(valid + [s.value for s in plan.sends if s.expect == "org_mismatch"])
    assert with_them == expected_final(valid)  # they never count


def test_the_faults_are_all_there_and_inside_the_load() -> None:
    size = SoakSize(rate=5)  # the full soak's faults; fewer events, the test stays quick
    plan = make_plan(9, size, START)
    kinds = Counter(f.kind for f in plan.faults)
    assert kinds["kill_worker"] + kinds["kill_join"] == size.kills >= 20
    assert kinds["broker_restart"] == 1
    assert kinds["store_outage"] == 2
    assert kinds["pause_worker"] == 1
    outages = [f for f in plan.faults if f.kind == "store_outage"]
    assert all(10 <= f.seconds <= 30 for f in outages)
    assert all(0 < f.at < size.duration_s for f in plan.faults)


def test_the_corpus_check_sees_missing_extra_and_changed_records() -> None:
    want = {"a": {"trace_id": "a", "revision": 2}, "b": {"trace_id": "b", "revision": 1}}
    assert compare_corpus("c", want, dict(want)) == []
    got = {"a": {"trace_id": "a", "revision": 1}, "z": {"trace_id": "z", "revision": 1}}
    found = compare_corpus("c", want, got)
    assert any("b missing" in f for f in found)
    assert any("z should not be there" in f for f in found)
    assert any("a differs in revision" in f for f in found)


def test_the_dead_letter_check_sees_missing_repeated_wrong_and_valid_ones() -> None:
    meant = {("t", 0, 1): "bad_json", ("t", 0, 2): "future", ("t", 1, 5): "invalid"}
    ok, reasons = check_dead_letters(meant, list(meant.items()))
    assert ok == []
    assert reasons == Counter({"bad_json": 1, "future": 1, "invalid": 1})
    letters = [(("t", 0, 1), "bad_json"), (("t", 0, 1), "bad_json"), (("t", 0, 2), "invalid"),
               (("t", 3, 3), "invalid")]  # fmt: skip
    found, _ = check_dead_letters(meant, letters)
    assert any("is there 2 times" in f for f in found)
    assert any("meant to be future" in f for f in found)
    assert any("valid record" in f for f in found)
    assert any("no dead letter for ('t', 1, 5)" in f for f in found)
