"""Pairs to compare and the comparison queue's rules (rl_export.labeling.pairs)."""

from __future__ import annotations

import hashlib
import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rl_export.labeling.pairs import (
    CHOICES,
    FLIPPED,
    Pair,
    PairTrace,
    choice_of,
    compare_space,
    head,
    in_queue,
    order_key,
    ordered,
    pair_key,
    pairs_of,
    prompt_key,
    short,
    voters_of,
)
from rl_export.labeling.settings import LabelingSettings
from rl_export.model.pairs import pair_id

DIFFERENT = LabelingSettings()
ANY = LabelingSettings(pair_versions="any")


def test_the_pair_id_is_section_12s() -> None:
    expected = hashlib.sha256(b"t-1\nt-2").hexdigest()[:16]
    assert pair_id("t-1", "t-2") == expected
    assert len(expected) == 16


@given(st.text(min_size=1), st.text(min_size=1), st.sampled_from(CHOICES))
def test_ordering_flips_a_and_b_with_the_traces(x: str, y: str, choice: str) -> None:
    if x == y:
        with pytest.raises(ValueError, match="two different traces"):
            ordered(x, y, choice)  # type: ignore[arg-type]
        return
    a, b, said = ordered(x, y, choice)  # type: ignore[arg-type]
    assert a < b
    assert {a, b} == {x, y}
    chosen = {"a": x, "b": y}.get(choice)  # the trace the client chose, if any
    assert {"a": a, "b": b}.get(said) == chosen
    assert said == (choice if x < y else FLIPPED[choice])  # type: ignore[index]


def test_the_prompt_is_up_to_and_including_the_first_user_message_exactly() -> None:
    system = {"role": "system", "content": "be brief"}
    ask = {"role": "user", "content": "hi"}
    one = [system, ask, {"role": "assistant", "content": "hello"}]
    two = [{"content": "be brief", "role": "system"}, ask, {"role": "assistant", "content": "yo"}]
    assert prompt_key(one) == prompt_key(two)  # the same prompt, other answers, key order
    assert prompt_key([ask]) != prompt_key(one)  # without the system message: another prompt
    assert prompt_key([system, {"role": "user", "content": "hi "}]) != prompt_key(one)
    assert prompt_key([system]) is None
    assert prompt_key(None) is None
    assert pair_key({"messages": one}, DIFFERENT) == prompt_key(one)
    scenario = LabelingSettings(pair_on="scenario")
    assert pair_key({"messages": one, "scenario": "s1"}, scenario) == "s1"
    assert pair_key({"messages": one}, scenario) is None


def _trace(n: int, key: str, version: str, reward: float | None = None) -> PairTrace:
    return PairTrace(f"t{n:03d}", key, version, reward, n)


def test_a_small_group_gives_every_pair_of_different_versions() -> None:
    traces = [_trace(1, "k", "v1"), _trace(2, "k", "v1"), _trace(3, "k", "v2"),
              _trace(4, "other", "v2")]  # fmt: skip
    found = {(p.trace_a, p.trace_b) for p in pairs_of(traces, DIFFERENT, partners=4)}
    assert found == {("t001", "t003"), ("t002", "t003")}
    found = {(p.trace_a, p.trace_b) for p in pairs_of(traces, ANY, partners=4)}
    assert found == {("t001", "t002"), ("t001", "t003"), ("t002", "t003")}


traces_st = st.lists(
    st.builds(PairTrace, st.text("abcdef", min_size=1, max_size=4), st.sampled_from("xyz"),
              st.sampled_from(["v1", "v2", "v3", None]),
              st.one_of(st.none(), st.floats(0, 1)), st.integers(0, 10**6)),
    unique_by=lambda t: t.trace_id, max_size=40,
)  # fmt: skip


@settings(max_examples=200, deadline=None)
@given(traces_st, st.sampled_from([DIFFERENT, ANY]), st.integers(1, 5))
def test_pairs_follow_the_rule(traces: list[PairTrace], rule: LabelingSettings,
                               partners: int) -> None:  # fmt: skip
    """Every pair shares a key, has its versions differ when it must, is ordered and named
    by its id, appears once; at most ``partners`` per trace it starts from; and a group small
    enough has every allowed pair."""
    by_id = {t.trace_id: t for t in traces}
    found = pairs_of(traces, rule, partners)
    assert len({p.pair_id for p in found}) == len(found)
    for p in found:
        a, b = by_id[p.trace_a], by_id[p.trace_b]
        assert p.trace_a < p.trace_b
        assert p.pair_id == pair_id(p.trace_a, p.trace_b)
        assert a.key == b.key
        if rule.pair_versions == "different":
            assert a.agent_version != b.agent_version
        assert p.completed_us == max(a.completed_us, b.completed_us)
    assert len(found) <= len(traces) * partners
    for key in {t.key for t in traces}:
        group = [t for t in traces if t.key == key]
        if len(group) <= partners + 1:
            allowed = {
                tuple(sorted((x.trace_id, y.trace_id)))
                for x, y in itertools.combinations(group, 2)
                if rule.pair_versions == "any" or x.agent_version != y.agent_version
            }
            assert {(p.trace_a, p.trace_b) for p in found if by_id[p.trace_a].key == key} == allowed


@given(st.frozensets(st.sampled_from("abcdef")), st.frozensets(st.sampled_from("abcdef")),
       st.sampled_from("abcdef"), st.integers(1, 4))  # fmt: skip
def test_the_queue_never_puts_a_pair_over_its_target(
    voters: frozenset[str], holders: frozenset[str], labeler: str, k: int
) -> None:
    """A labeler who takes a pair from their queue never makes its votes and others' claims
    more than k (the claims' slots guard the race: rl_export.labeling.claims)."""
    if in_queue(labeler, voters, holders, k):
        assert labeler not in voters
        assert len(voters | holders | {labeler}) <= k
    else:
        assert labeler in voters or len((voters | holders) - {labeler}) >= k
    assert short(voters, k) == (len(voters) < k)


def test_uncertain_puts_the_closest_evaluator_rewards_first() -> None:
    pairs = [Pair("p1", "a", "b", 0.5, 1), Pair("p2", "a", "c", None, 0),
             Pair("p3", "b", "c", 0.1, 5), Pair("p4", "b", "d", 0.1, 2)]  # fmt: skip
    got = [p.pair_id for p in sorted(pairs, key=order_key("uncertain", "ana"))]
    assert got == ["p4", "p3", "p1", "p2"]
    assert [p.pair_id for p in sorted(pairs, key=order_key("oldest", "ana"))] == [
        "p2", "p1", "p4", "p3"
    ]  # fmt: skip
    shuffled = {lab: [p.pair_id for p in sorted(pairs, key=order_key("random", lab))]
                for lab in ("ana", "bo", "cy", "dee")}  # fmt: skip
    assert len({tuple(v) for v in shuffled.values()}) > 1  # each labeler a shuffle of their own


def test_the_head_leaves_out_compared_and_full_pairs() -> None:
    pairs = [Pair(f"p{n}", "a", "b", None, n) for n in range(5)]
    two = LabelingSettings(comparisons_per_pair=2)
    voters = {"p0": {"ana"}, "p1": {"bo", "cy"}}
    holders = {"p2": {"bo", "cy"}, "p3": {"bo"}}
    got = head(pairs, "ana", voters=voters, holders=holders, settings=two, limit=10)
    assert [p.pair_id for p in got] == ["p3", "p4"]
    got = head(pairs, "ana", voters=voters, holders=holders, settings=two, limit=1)
    assert [p.pair_id for p in got] == ["p3"]


def test_records_say_who_compared_and_what() -> None:
    entries = [
        {"pair_id": "p1", "other": "z", "outcome": "win", "labeler": "ana"},
        {"pair_id": "p2", "other": "a", "outcome": "win", "labeler": "bo"},
        {"pair_id": "p2", "other": "a", "outcome": "tie", "labeler": "cy"},
    ]  # fmt: skip
    assert voters_of({"trace_id": "m", "comparisons": entries}) == {"p1": {"ana"},
                                                                    "p2": {"bo", "cy"}}  # fmt: skip
    assert [choice_of(e, "m") for e in entries] == ["a", "b", "tie"]  # m is p2's trace_b
    assert compare_space("bot") == "bot/compare"
