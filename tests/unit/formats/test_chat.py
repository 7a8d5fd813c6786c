"""Chat styles (DESIGN.md section 4, "Chat style"): hf, openai, raw and the system merge."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from rl_export.formats.chat import CHAT_STYLES, content_text, restyle

SYSTEM = {"role": "system", "content": "Be brief."}
USER = {
    "role": "user",
    "content": [{"type": "text", "text": "Hi "}, {"type": "text", "text": "there"}],
}


def call(arguments: Any, n: int = 1) -> dict[str, Any]:
    return {"id": f"c{n}", "type": "function", "function": {"name": "f", "arguments": arguments}}


CONVERSATION: list[dict[str, Any]] = [
    SYSTEM,
    USER,
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [call('{"q": "x"}', 1), call("not json", 2), call({"k": 1}, 3)],
        "weight": 0,
    },
    {
        "role": "tool",
        "tool_call_id": "c1",
        "name": "f",
        "content": [{"type": "text", "text": "42"}],
    },
    {
        "role": "assistant",
        "content": [
            {"type": "text", "text": "The answer"},
            {"type": "image_url", "image_url": {}},
            {"type": "text", "text": " is 42."},
        ],
        "weight": 1,
    },
]


def test_hf_flattens_content_and_parses_arguments() -> None:
    before = copy.deepcopy(CONVERSATION)
    out = restyle(CONVERSATION)
    assert before == CONVERSATION  # pure
    # the three calls of one message: one message each (Llama 3.x, GPT-OSS: one per message)
    assert [m["content"] for m in out] == ["Be brief.", "Hi there", "", "", "", "42",
                                           "The answer is 42."]  # fmt: skip
    assert [[c["function"]["arguments"] for c in m["tool_calls"]] for m in out[2:5]] == [
        [{"q": "x"}],
        ["not json"],
        [{"k": 1}],
    ]
    assert [m["weight"] for m in out[2:5]] == [0, 0, 0]
    assert out[6]["weight"] == 1
    assert (out[5]["tool_call_id"], out[5]["name"]) == ("c1", "f")


def test_hf_splits_text_beside_tool_calls() -> None:
    message = {"role": "assistant", "content": "Looking.", "tool_calls": [call("{}")], "x": 1}
    assert restyle([message]) == [
        {"role": "assistant", "content": "Looking.", "x": 1},
        {"role": "assistant", "content": "", "tool_calls": [call({})], "x": 1},
    ]
    one = {"role": "assistant", "content": None, "tool_calls": [call("{}")]}
    assert restyle([one]) == [{"role": "assistant", "content": "", "tool_calls": [call({})]}]
    assert len(restyle([message], "openai")) == 1  # openai keeps the message whole


def test_openai_encodes_arguments_once() -> None:
    out = restyle(CONVERSATION, "openai")
    assert [c["function"]["arguments"] for c in out[2]["tool_calls"]] == [
        '{"q": "x"}',
        "not json",
        '{"k":1}',
    ]
    assert all(isinstance(m["content"], str) for m in out)
    assert out[2]["weight"] == 0


def test_raw_is_as_received() -> None:
    assert restyle(CONVERSATION, "raw") == CONVERSATION


@pytest.mark.parametrize("style", CHAT_STYLES)
def test_a_non_object_argument_string_stays_a_string(style: Any) -> None:
    message = {"role": "assistant", "content": "", "tool_calls": [call("[1, 2]"), call("7")]}
    out = restyle([message], style)
    calls = [c for m in out for c in m["tool_calls"]]
    assert [c["function"]["arguments"] for c in calls] == ["[1, 2]", "7"]


def test_hf_drops_empty_tool_calls_only() -> None:
    out = restyle(
        [
            {"role": "assistant", "content": "a", "tool_calls": None},
            {"role": "assistant", "content": "b", "tool_calls": []},
        ]
    )
    assert out == [{"role": "assistant", "content": "a"}, {"role": "assistant", "content": "b"}]
    assert "tool_calls" in restyle([{"role": "assistant", "content": "a", "tool_calls": None}],
                                   "openai")[0]  # fmt: skip


def test_content_text() -> None:
    assert content_text(None) == ""
    assert content_text("x") == "x"
    assert content_text(["a", {"type": "refusal", "refusal": "no"}, {"type": "x"}]) == "ano"
    assert content_text({"a": 1}) == '{"a":1}'


@pytest.mark.parametrize("style", ["hf", "openai"])
def test_merge_folds_every_system_message_into_the_first_user(style: Any) -> None:
    messages: list[dict[str, Any]] = [
        SYSTEM,
        {"role": "system", "content": None},
        USER,
        {"role": "assistant", "content": "ok"},
        {"role": "user", "content": "again"},
    ]
    out = restyle(messages, style, "merge")
    assert out == [
        {"role": "user", "content": "Be brief.\n\nHi there"},
        {"role": "assistant", "content": "ok"},
        {"role": "user", "content": "again"},
    ]


def test_merge_raw_keeps_parts() -> None:
    out = restyle([SYSTEM, USER], "raw", "merge")
    assert out == [
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "Be brief."},
                {"type": "text", "text": "\n\n"},
                *USER["content"],
            ],
        }
    ]


def test_merge_without_a_user_message_makes_one() -> None:
    out = restyle([SYSTEM, {"role": "assistant", "content": "ok"}], "hf", "merge")
    assert out == [{"role": "user", "content": "Be brief."}, {"role": "assistant", "content": "ok"}]


def test_merge_without_system_changes_nothing() -> None:
    assert restyle(CONVERSATION[1:], "hf", "merge") == restyle(CONVERSATION[1:])


def test_unknown_style_or_mode() -> None:
    with pytest.raises(ValueError, match="chat style"):
        restyle([], "chatml")  # type: ignore[arg-type]  # the check under test
    with pytest.raises(ValueError, match="system mode"):
        restyle([], "hf", "drop")  # type: ignore[arg-type]  # the check under test
