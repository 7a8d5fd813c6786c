"""The turn rule and per-turn masks (DESIGN.md section 4, "Turns and per-turn masks"), and the
OpenAI chat fine-tuning rules on ``weight`` that every masked row keeps."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rl_export.formats.render import MASK_FORMATS, corpus_row, render_row
from rl_export.formats.turns import (
    TurnMask,
    outside_turns,
    parse_mask_types,
    turn_numbers,
    weigh,
)
from rl_export.model.codec import RawJson, dumps
from tests.records import record

SYSTEM = {"role": "system", "content": "Be brief."}


def user(text: str) -> dict[str, Any]:
    return {"role": "user", "content": text}


def assistant(text: str | None, **more: Any) -> dict[str, Any]:
    return {"role": "assistant", "content": text, **more}


def call(n: int) -> dict[str, Any]:
    return assistant(None, tool_calls=[{"id": f"c{n}", "type": "function",
                                        "function": {"name": "f", "arguments": "{}"}}])  # fmt: skip


def result(n: int) -> dict[str, Any]:
    return {"role": "tool", "tool_call_id": f"c{n}", "content": "ok"}


# system, then three turns: a tool call in the first, two assistant messages in the second.
CONVERSATION = [
    SYSTEM,
    user("one"), call(1), result(1), assistant("done 1"),
    user("two"), assistant("part a"), assistant("part b"),
    user("three"), assistant("done 3"),
]  # fmt: skip


def outcome(turn: Any, decision: bool | None, kind: str = "goal_met") -> dict[str, Any]:
    return {"type": kind, "turn": turn, "decision": decision}


def report(*outcomes: dict[str, Any]) -> dict[str, Any]:
    return {"outcomes": list(outcomes), "classifications": []}


def weights(messages: list[dict[str, Any]]) -> list[int | None]:
    return [m.get("weight") for m in messages]


def test_turn_n_is_the_nth_user_message_and_what_follows_it() -> None:
    assert turn_numbers(CONVERSATION) == [0, 1, 1, 1, 1, 2, 2, 2, 3, 3]
    assert turn_numbers([SYSTEM, assistant("hello first")]) == [0, 0]
    assert turn_numbers([]) == []


def test_a_failing_outcome_weighs_its_turns_assistant_messages_zero() -> None:
    weighed = weigh(CONVERSATION, report(outcome(2, False)), TurnMask())
    #                                   sys   u1    call  tool  a1  u2    a2a a2b u3    a3
    assert weights(weighed.messages) == [None, None, 1, None, 1, None, 0, 0, None, 1]
    assert weighed.outside == 0
    weighed = weigh(CONVERSATION, report(outcome(1, False), outcome(3, False)), TurnMask())
    assert weights(weighed.messages) == [None, None, 0, None, 0, None, 1, 1, None, 0]


def test_passing_and_undecided_outcomes_mask_nothing() -> None:
    for decision in (True, None):
        weighed = weigh(CONVERSATION, report(outcome(2, decision)), TurnMask())
        assert weights(weighed.messages) == [None, None, 1, None, 1, None, 1, 1, None, 1]
    no_report = weigh(CONVERSATION, None, TurnMask())
    assert weights(no_report.messages) == weights(weighed.messages)


def test_mask_types_pick_the_outcomes_that_mask() -> None:
    both = report(outcome(1, False, "tool_use"), outcome(2, False, "tone"))
    only_tone = weigh(CONVERSATION, both, TurnMask(frozenset({"tone"})))
    assert weights(only_tone.messages) == [None, None, 1, None, 1, None, 0, 0, None, 1]
    neither = weigh(CONVERSATION, both, TurnMask(frozenset({"safety"})))
    assert 0 not in weights(neither.messages)
    assert parse_mask_types("tone, tool_use") == frozenset({"tone", "tool_use"})
    assert parse_mask_types(None) is None
    assert parse_mask_types(["tone"]) == frozenset({"tone"})
    with pytest.raises(ValueError, match="empty outcome type"):
        parse_mask_types("tone,,x")


@pytest.mark.parametrize("turn", [0, -1, 4, 99])
def test_an_outcome_outside_the_conversation_masks_nothing_and_is_counted(turn: int) -> None:
    weighed = weigh(CONVERSATION, report(outcome(turn, False), outcome(2, True)), TurnMask())
    assert 0 not in weights(weighed.messages)
    assert weighed.outside == 1
    assert outside_turns(CONVERSATION, report(outcome(turn, False)), TurnMask()) == 1
    # Only failing outcomes count: a passing one past the end is no mask that went missing.
    assert weigh(CONVERSATION, report(outcome(turn, True)), TurnMask()).outside == 0


def test_an_outcome_without_a_turn_is_about_the_whole_run() -> None:
    weighed = weigh(CONVERSATION, report(outcome(None, False)), TurnMask())
    assert 0 not in weights(weighed.messages)
    assert weighed.outside == 0


def test_assistant_messages_before_the_first_user_message_belong_to_no_turn() -> None:
    messages = [SYSTEM, assistant("Hi, how can I help?"), user("x"), assistant("y")]
    weighed = weigh(messages, report(outcome(1, False)), TurnMask())
    assert weights(weighed.messages) == [None, 1, None, 0]
    assert weigh([SYSTEM, assistant("hi")], report(outcome(1, False)), TurnMask()).outside == 1


def test_messages_are_kept_as_received_but_for_the_weight() -> None:
    original = copy.deepcopy(CONVERSATION)
    weighed = weigh(CONVERSATION, report(outcome(2, False)), TurnMask())
    assert original == CONVERSATION  # nothing given was changed
    stripped = [{k: v for k, v in m.items() if k != "weight"} for m in weighed.messages]
    assert stripped == original
    assert weighed.messages[0] is CONVERSATION[0]  # untouched messages are not even copied


def test_a_weight_that_came_with_the_messages_is_overwritten_or_dropped() -> None:
    messages = [user("x") | {"weight": 1}, assistant("y", weight=7), {"role": "tool", "weight": 0}]
    weighed = weigh(messages, report(outcome(1, False)), TurnMask())
    assert weighed.messages == [user("x"), assistant("y", weight=0), {"role": "tool"}]


def test_masked_rows_of_both_formats() -> None:
    rec = record("tr-1", outcomes=[outcome(1, False), outcome(5, False)])
    messages = render_row("messages", rec, mask=TurnMask())
    assert messages is not None
    #                          sys   u1    call tool a1 u2    a2
    assert weights(messages["messages"]) == [None, None, 0, None, 0, None, 1]
    pc = render_row("prompt_completion", rec, mask=TurnMask())
    assert pc is not None
    assert pc["prompt"] + pc["completion"] == messages["messages"]
    assert pc["prompt"][-1]["role"] == "user"
    assert weights(pc["completion"]) == [1]
    # From a corpus row's raw messages (the sink's records) too.
    raw = {**rec, "messages": RawJson(dumps(rec["messages"]))}
    assert render_row("messages", raw, mask=TurnMask()) == messages
    row = corpus_row("messages", rec, mask=TurnMask())
    assert row is not None
    assert (list(row), row["messages"]) == (["trace_id", "revision", "messages"],
                                            messages["messages"])  # fmt: skip
    for fmt in ("trajectory", "kto", "executions", "rl_prompts"):
        assert fmt not in MASK_FORMATS
        with pytest.raises(ValueError, match="turn masks apply to messages and prompt"):
            render_row(fmt, rec, mask=TurnMask())


# --- OpenAI's chat fine-tuning rules on every row --------------------------------------------

ROLES = st.sampled_from(["system", "user", "assistant", "tool"])
MESSAGE = st.builds(
    lambda role, content, weight: (
        {"role": role, "content": content} | ({"weight": weight} if weight is not None else {})
    ),
    ROLES,
    st.one_of(st.none(), st.text(max_size=5), st.just([{"type": "text", "text": "t"}])),
    st.one_of(st.none(), st.integers(-1, 2)),
)
OUTCOME = st.builds(
    outcome,
    st.one_of(st.none(), st.integers(-2, 8)),
    st.one_of(st.none(), st.booleans()),
    st.sampled_from(["goal_met", "tone"]),
)


@settings(max_examples=300, deadline=None)
@given(
    messages=st.lists(MESSAGE, max_size=12),
    outcomes=st.lists(OUTCOME, max_size=6),
    types=st.one_of(st.none(), st.just(frozenset({"tone"}))),
)
def test_openai_weight_rules_hold_on_every_row(
    messages: list[dict[str, Any]], outcomes: list[dict[str, Any]], types: frozenset[str] | None
) -> None:
    mask = TurnMask(types)
    weighed = weigh(messages, report(*outcomes), mask)
    assert len(weighed.messages) == len(messages)
    users = sum(m["role"] == "user" for m in messages)
    failing = [o["turn"] for o in outcomes if mask.failing(o) and isinstance(o["turn"], int)]
    assert weighed.outside == sum(not 1 <= t <= users for t in failing)
    turns = turn_numbers(messages)
    for message, weighted, turn in zip(messages, weighed.messages, turns, strict=True):
        assert weighted["role"] == message["role"]
        if message["role"] == "assistant":
            # weight only on assistant messages, and always 0 or 1 there; 0 only in a turn
            # (turn 0, before the first user message, is no turn: an outcome naming it is
            # outside the conversation)
            assert weighted["weight"] == (0 if turn >= 1 and turn in failing else 1)
        else:
            assert "weight" not in weighted
        rest = {k: v for k, v in message.items() if k != "weight"}
        assert {k: v for k, v in weighted.items() if k != "weight"} == rest
