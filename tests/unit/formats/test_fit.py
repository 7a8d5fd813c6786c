"""Rows made for a chat template (issue 55): what probes find a template requires, how a
conversation is adapted to it, and the check that every message's text is in the render."""

from __future__ import annotations

import copy
import json
import re
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rl_export.formats.adapt import ALPHABETS, IdShape, Requirements, adapt, derive_id, split_at
from rl_export.formats.chat import Chat
from rl_export.formats.fit import DROPS_CALLS, DROPS_TEXT, GARBLES, TemplateFit, _plain, missing
from rl_export.formats.probes import probe
from rl_export.formats.templating import ChatTemplate
from tests.chattemplates import CONVERSATIONS, TEMPLATES, template

HF = Chat("hf", split=False)


def found(name: str) -> Requirements:
    return probe(template(name))


def test_probes_find_what_each_template_requires() -> None:
    """Found by rendering, never by name: the research's findings (FINDINGS.md of the issue)
    are what the probes say."""
    nine = IdShape(9, "alnum")
    mistral = found("mistral_nemo_2407")
    assert (mistral.call_ids, mistral.merge_system) == (nine, True)  # last [INST] only
    assert found("mistral_small_3_2").call_ids == nine
    assert not found("mistral_small_3_2").merge_system  # it has [SYSTEM_PROMPT]
    assert found("olmo3_tools").tool_names  # "Function X returned:"
    assert found("phi4_mini_tools").arguments == "string"  # a dict would be printed as repr
    coder = found("qwen3_coder")
    assert (coder.arguments, coder.text_with_calls, coder.calls_per_message) == (
        "object", "together", "many")  # fmt: skip
    llama = found("llama3_1_json_tools")  # one call per message, text beside calls dropped
    assert (llama.calls_per_message, llama.text_with_calls) == ("one", "split")
    assert found("hermes_3_tool_use") == Requirements(calls_per_message="many")
    assert not found("granite_3_3").garbles_arguments  # it drops calls: the rows say so


def test_a_template_that_names_itself_otherwise_is_probed_the_same() -> None:
    """The name plays no part: Mistral Nemo's text under another name needs the same."""
    text = template("mistral_nemo_2407").text
    assert probe(ChatTemplate(text, "qwen")) == found("mistral_nemo_2407")


@pytest.mark.parametrize("name", TEMPLATES)
def test_rows_kept_render_every_text_and_rows_left_out_say_why(name: str) -> None:
    fit = TemplateFit.probed(template(name))
    for messages in CONVERSATIONS.values():
        row, reason = fit.row("messages", {"messages": HF.apply(messages)})
        if row is None:
            assert reason is not None
            assert reason in (DROPS_TEXT, DROPS_CALLS, GARBLES) or reason.startswith("raises: ")
            continue
        rendered = fit.template.render(row["messages"])
        assert missing(row["messages"], rendered) is None


def test_a_template_that_drops_tool_calls_silently_is_caught() -> None:
    """Granite 3.3 never reads tool_calls: no error, and the calls are gone. So is a template
    written here that shows only text."""
    only_text = ChatTemplate(
        "{% for m in messages %}<{{ m.role }}>{{ m.content }}</{{ m.role }}>{% endfor %}"
    )
    called = {"messages": HF.apply(CONVERSATIONS["openai_call"])}
    for chat_template in (template("granite_3_3"), only_text):
        fit = TemplateFit.probed(chat_template)
        assert fit.template.render(called["messages"])  # renders without an error
        assert fit.row("messages", called) == (None, DROPS_CALLS)
        plain = {"messages": HF.apply(CONVERSATIONS["plain"])}
        assert fit.row("messages", plain)[1] is None


def test_a_template_that_drops_text_is_caught() -> None:
    drops_system = ChatTemplate(
        "{% for m in messages %}{% if m.role != 'system' %}{{ m.content }}{% endif %}{% endfor %}"
    )
    fit = TemplateFit(drops_system, Requirements())  # not probed: nothing merged
    assert fit.row("messages", {"messages": HF.apply(CONVERSATIONS["plain"])}) == (
        None, DROPS_TEXT)  # fmt: skip
    probed = TemplateFit.probed(drops_system)
    assert probed.requirements.merge_system  # probes see it and merge
    row, reason = probed.row("messages", {"messages": HF.apply(CONVERSATIONS["plain"])})
    assert reason is None
    assert row is not None
    assert row["messages"][0]["content"].startswith("You are a careful support agent")


def test_mistral_rows_get_nine_character_ids_the_same_in_call_and_result() -> None:
    fit = TemplateFit.probed(template("mistral_nemo_2407"))
    row, reason = fit.row("messages", {"messages": HF.apply(CONVERSATIONS["openai_call"])})
    assert reason is None
    assert row is not None
    (call,) = row["messages"][1]["tool_calls"]
    assert re.fullmatch(r"[A-Za-z0-9]{9}", call["id"])
    assert row["messages"][2]["tool_call_id"] == call["id"]
    assert row["messages"][0]["role"] == "user"  # the system prompt merged into it
    again, _ = fit.row("messages", {"messages": HF.apply(CONVERSATIONS["openai_call"])})
    assert again == row  # stable


def test_reused_ids_become_distinct_and_results_follow_their_calls() -> None:
    req = Requirements(call_ids=IdShape(9), tool_names=True, calls_per_message="many")
    messages, _ = adapt(HF.apply(CONVERSATIONS["parallel_calls_reused_ids"]), req)
    calls = [c for m in messages for c in m.get("tool_calls") or []]
    results = [m for m in messages if m["role"] == "tool"]
    assert len({c["id"] for c in calls}) == 3  # "call_0" twice: two ids
    assert [r["tool_call_id"] for r in results] == [c["id"] for c in calls]
    assert [r["name"] for r in results] == ["lookup_order"] * 3
    no_ids, _ = adapt(HF.apply(CONVERSATIONS["no_ids"]), req)
    assert no_ids[1]["tool_calls"][0]["id"] == no_ids[2]["tool_call_id"]


def test_layouts_place_text_and_calls_as_asked() -> None:
    messages = HF.apply(CONVERSATIONS["text_beside_calls"])
    together, _ = adapt(messages, Requirements(text_with_calls="together"))
    split, origins = adapt(messages, Requirements(text_with_calls="split"))
    assert len(together) == len(messages)
    assert len(split) == len(messages) + 2  # each text in a message of its own
    assert split[1] == {"role": "assistant", "content": "Let me look it up first."}
    assert split[2]["content"] == ""
    assert split[2]["tool_calls"]
    assert origins[:4] == [0, 1, 1, 2]
    head, tail = split_at(split, origins, 2)
    assert head == split[:3]
    assert tail == split[3:]


def test_arguments_as_strings_and_the_input_unchanged() -> None:
    messages = HF.apply(CONVERSATIONS["text_beside_calls"])
    before = copy.deepcopy(messages)
    req = Requirements(arguments="string", merge_system=True, call_ids=IdShape(12, "digits"))
    out, _ = adapt(messages, req)
    assert messages == before
    call = next(c for m in out for c in m.get("tool_calls") or [])
    assert call["function"]["arguments"] == '{"order":7}'
    assert re.fullmatch(r"[0-9]{12}", call["id"])


id_text = st.one_of(st.none(), st.sampled_from(["call_0", "call_1", "x"]), st.text(max_size=12))


@settings(max_examples=200, deadline=None)
@given(st.lists(st.lists(id_text, min_size=1, max_size=3), min_size=1, max_size=5),
       st.sampled_from([IdShape(9), IdShape(6, "digits"), IdShape(8, "lower_alnum")]))  # fmt: skip
def test_new_ids_are_unique_stable_and_shared_by_call_and_result(
    turns: list[list[str | None]], shape: IdShape
) -> None:
    """Any ids (repeated, missing, odd): every call gets an id of the shape, unique in the
    conversation; each result the id of its call; the same input, the same ids."""
    messages: list[dict[str, Any]] = [{"role": "user", "content": "go"}]
    for ids in turns:
        calls = [{"type": "function", "function": {"name": f"f{n}", "arguments": {}},
                  **({"id": i} if i is not None else {})} for n, i in enumerate(ids)]  # fmt: skip
        messages.append({"role": "assistant", "content": "", "tool_calls": calls})
        messages += [{"role": "tool", "content": "r", **({"tool_call_id": i} if i else {})}
                     for i in ids]  # fmt: skip
    req = Requirements(call_ids=shape, calls_per_message="many", tool_names=True)
    out, _ = adapt(messages, req)
    made = [c["id"] for m in out for c in m.get("tool_calls") or []]
    answered = [m["tool_call_id"] for m in out if m["role"] == "tool"]
    assert len(set(made)) == len(made)
    assert sorted(answered) == sorted(made)
    alphabet = set(ALPHABETS[shape.alphabet])
    assert all(len(i) == shape.length and set(i) <= alphabet for i in made)
    assert adapt(messages, req) == (out, _)
    # each result answers its own call (by id; the oldest unanswered one without)
    names = [m["name"] for m in out if m["role"] == "tool"]
    assert names == [f"f{n}" for ids in turns for n, _ in enumerate(ids)]


def test_derived_ids_depend_on_the_original() -> None:
    shape = IdShape(9)
    assert derive_id("call_1", 0, shape) == derive_id("call_1", 0, shape)
    assert derive_id("call_1", 0, shape) != derive_id("call_2", 0, shape)
    assert derive_id("call_1", 0, shape) != derive_id("call_1", 1, shape)


def test_the_check_reads_escaped_text_and_every_argument() -> None:
    messages = [
        {"role": "user", "content": 'Say "hi"\nthen stop'},
        {"role": "assistant", "content": "", "tool_calls": [
            {"function": {"name": "f", "arguments": {"city": "Oslo", "days": 3}}}]},
    ]  # fmt: skip
    shown = '{"content": "Say \\"hi\\"\\nthen stop"} f(city="Oslo", days=3)'
    assert missing(messages, shown) is None
    assert missing(messages, shown.replace("Oslo", "")) == DROPS_CALLS
    assert missing(messages, shown.replace("days=3", "")) == DROPS_CALLS
    assert missing(messages, shown.replace("then", "")) == DROPS_TEXT


@settings(max_examples=500)
@given(st.text())
def test_text_taken_as_plain_has_no_escaped_form_but_itself(text: str) -> None:
    """The check's shortcut (no escaped forms looked for) holds only where JSON, JSON in
    ASCII and Python would all write the text as it is."""
    if _plain(text):
        forms = (json.dumps(text, ensure_ascii=False), json.dumps(text), repr(text))
        assert {form[1:-1] for form in forms} == {text}
    for escaped in ('"', "\\", "'", "\n", "\u2028", "é"):
        assert not _plain(text + escaped)


def test_split_formats_are_checked_as_trl_renders_them() -> None:
    """prompt_completion: the completion's text must be in what follows the prompt's render;
    a template that shows the last reply only inside the prompt fails."""
    fit = TemplateFit.probed(template("qwq_32b"))
    messages = HF.apply(CONVERSATIONS["openai_call"])
    row, reason = fit.row("prompt_completion", {
        "prompt": messages[:2], "completion": messages[2:], "reward": 1.0, "passed": True,
        "trace_id": "t"})  # fmt: skip
    assert reason is None
    assert row is not None
    assert row["completion"][0]["tool_calls"]
    pairs, reason = fit.row("preference", {
        "prompt": messages[:2], "chosen": messages[2:], "rejected": [
            {"role": "assistant", "content": "No idea."}],
        "score_chosen": 1.0, "score_rejected": 0.0, "trace_chosen": "a", "trace_rejected": "b",
    })  # fmt: skip
    assert reason is None
    assert pairs is not None
