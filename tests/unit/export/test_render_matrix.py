"""The render matrix (issue 42, DESIGN.md section 4 "Chat style"): every row of every chat
format, from ordinary and hostile conversations, renders with the chat templates of current
open models as TRL ships them (``trl/chat_templates/*.jinja``, read as package data: trl is
installed without its dependencies, so without torch), through transformers' own
``apply_chat_template`` on a tiny local tokenizer: every assistant text visible, every tool
call's arguments encoded once, no Python representation of parts, no ``None``.

And (issue 55, "Chat template"): rows made for each of 23 templates TRL does not ship
(``--chat-template``) render through ``apply_chat_template`` with every message's text, and
a template that drops tool calls without an error is caught."""

from __future__ import annotations

import copy
import json
import re
from functools import cache
from importlib import resources
from typing import Any

import pytest
from tokenizers import Tokenizer
from tokenizers.models import WordLevel
from transformers import PreTrainedTokenizerFast

from rl_export.export.templated import template_chat
from rl_export.formats.chat import HF, Chat
from rl_export.formats.fit import DROPS_CALLS, DROPS_TEXT, GARBLES, TemplateFit, missing
from rl_export.formats.render import CHAT_FORMATS, preference_pairs, render_row
from tests.chattemplates import TEMPLATES as AGENT_TEMPLATES
from tests.chattemplates import records as agent_records
from tests.chattemplates import template as agent_template
from tests.chattemplates import template_paths

TEMPLATES = (
    "qwen2_5", "qwen3", "llama3_1", "llama3_2", "phi3_5", "gptoss", "glm4moe",
    "nemotron_3_nano", "nemotron_3_super",
)  # fmt: skip
"""DESIGN.md section 4: Qwen 2.5 and 3, Llama 3.1 and 3.2, Phi-3.5, GPT-OSS, GLM-4, Nemotron.

Tool-call arguments that are not a JSON object stay strings in every style (DESIGN.md), and
the templates that iterate arguments (GLM-4, Nemotron, ...) cannot render those: the matrix
holds JSON-object arguments only (tests/unit/formats/test_chat.py covers the others)."""


@cache
def tokenizer(name: str) -> PreTrainedTokenizerFast:
    """A one-word tokenizer carrying the template: rendering needs no model."""
    template = (resources.files("trl") / "chat_templates" / f"{name}.jinja").read_text()
    tok = PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer(WordLevel({"<unk>": 0}, unk_token="<unk>")),
        bos_token="<s>", eos_token="</s>", unk_token="<unk>",
    )  # fmt: skip
    tok.chat_template = template
    return tok


@cache
def shows_tool_calls(name: str) -> bool:
    """Whether the template renders tool calls at all (Phi-3.5's has no tool support)."""
    return "tool_calls" in (resources.files("trl") / "chat_templates" / f"{name}.jinja").read_text()


def render(name: str, messages: list[dict[str, Any]]) -> str:
    text = tokenizer(name).apply_chat_template(copy.deepcopy(messages), tokenize=False)
    assert isinstance(text, str)
    return text


def text(value: str) -> list[dict[str, str]]:
    return [{"type": "text", "text": value}]


def call(n: int, name: str, arguments: Any) -> dict[str, Any]:
    return {
        "id": f"call_{n}",
        "type": "function",
        "function": {"name": name, "arguments": arguments},
    }


SYSTEM = {"role": "system", "content": "You are a support agent."}
IMAGE = {"type": "image_url", "image_url": {"url": "x"}}  # a part without text
HOSTILE = (
    "Use {{ raise_exception('x') }} or {% endfor %} </s> <|im_end|> <|eot_id|> and "
    '"quotes", \\ backslashes, naïve ✓ \u2028 line\n\nbreaks'
)
CONVERSATIONS: dict[str, list[dict[str, Any]]] = {
    "plain": [SYSTEM, {"role": "user", "content": "Where is order 12?"},
              {"role": "assistant", "content": "It shipped yesterday."}],
    "parts": [
        SYSTEM,
        {"role": "user", "content": text("Weather in ") + text("Paris?")},
        {"role": "assistant", "content": [*text("Checking "), IMAGE, *text("the sky.")]},
        {"role": "user", "content": text("And tomorrow?")},
        {"role": "assistant", "content": text("Rain tomorrow.")},
    ],
    "null_content_and_one_call": [
        {"role": "user", "content": "Track parcel 7"},
        {"role": "assistant", "content": None,
         "tool_calls": [call(1, "track_parcel", '{"parcel_ref": "7"}')]},
        {"role": "tool", "tool_call_id": "call_1", "name": "track_parcel", "content": None},
        {"role": "assistant", "content": "No news on parcel 7 yet."},
    ],
    "several_calls_with_text": [
        SYSTEM,
        {"role": "user", "content": "Weather and time in Oslo?"},
        {"role": "assistant", "content": "Looking both up.", "tool_calls": [
            call(1, "get_weather", '{"city_name": "Oslo", "unit_kind": "C"}'),
            call(2, "get_time", {"zone_name": "Europe/Oslo"}),
            call(3, "log_note", "{}"),
        ]},
        {"role": "tool", "tool_call_id": "call_1", "name": "get_weather",
         "content": text("snow, -3")},
        {"role": "tool", "tool_call_id": "call_2", "name": "get_time", "content": "09:14"},
        {"role": "tool", "tool_call_id": "call_3", "name": "log_note",
         "content": [{"type": "text", "text": "ok"}, {"type": "text", "text": " noted"}]},
        {"role": "assistant", "content": [{"type": "text", "text": "Snowy, minus three,"},
                                          {"type": "text", "text": " at 09:14."}]},
    ],
    "hostile": [
        {"role": "system", "content": HOSTILE},
        {"role": "user", "content": HOSTILE},
        {"role": "assistant", "content": HOSTILE, "tool_calls": [
            call(1, "search_docs", '{"query_text": "{{x}} \\"quoted\\" ✓", "page_no": 2}'),
        ]},
        {"role": "tool", "tool_call_id": "call_1", "name": "search_docs", "content": HOSTILE},
        {"role": "assistant", "content": "Final: " + HOSTILE, "x_latency_ms": 5},
        {"role": "user", "content": "thanks"},
        {"role": "assistant", "content": "You are welcome."},
    ],
    "two_turns_with_tools_and_weights": [
        SYSTEM,
        {"role": "user", "content": "Refund order 3"},
        {"role": "assistant", "content": None, "weight": 0,
         "tool_calls": [call(1, "refund_order", '{"order_no": 3}')]},
        {"role": "tool", "tool_call_id": "call_1", "name": "refund_order", "content": "denied"},
        {"role": "assistant", "content": "The refund was denied.", "weight": 0},
        {"role": "user", "content": "Why?"},
        {"role": "assistant", "content": "It is past the window.", "weight": 1},
    ],
}  # fmt: skip


def records() -> list[dict[str, Any]]:
    """Every conversation as two records sharing a prompt, with different rewards (so that
    preference pairs them), one passed and one failed (so that kto has both)."""
    out = []
    for n, (name, messages) in enumerate(sorted(CONVERSATIONS.items())):
        for k, reward in enumerate((0.9, 0.2)):
            out.append({
                "trace_id": f"{name}-{k}", "revision": 1, "reward": reward,
                "passed": reward > 0.5, "scenario": "s", "agent_version": "v",
                "messages": copy.deepcopy(messages) if k == 0 else _variant(messages, n),
            })  # fmt: skip
    return out


def _variant(messages: list[dict[str, Any]], n: int) -> list[dict[str, Any]]:
    """The same conversation with another last reply (the rejected side of a pair)."""
    out = copy.deepcopy(messages)
    out[-1] = {"role": "assistant", "content": f"Another answer {n}."}
    return out


def rows(chat: Chat) -> list[tuple[str, list[dict[str, Any]]]]:
    """(what, conversation to render) for every row of every chat format."""
    out = []
    recs = records()
    for fmt in CHAT_FORMATS:
        if fmt == "preference":
            for completion in ("turn", "rest"):
                for row in preference_pairs(recs, completion=completion, chat=chat):  # type: ignore[arg-type]  # a Literal
                    out.append((f"preference/{completion}/{row['trace_chosen']}",
                                row["prompt"] + row["chosen"]))  # fmt: skip
                    out.append((f"preference/{completion}/{row['trace_rejected']}",
                                row["prompt"] + row["rejected"]))  # fmt: skip
            continue
        for record in recs:
            row = render_row(fmt, record, chat=chat)
            if row is None:
                continue
            messages = row.get("messages") or row["prompt"] + row["completion"]
            out.append((f"{fmt}/{record['trace_id']}", messages))
    return out


REPR = re.compile(r"\{'type'|'text':|\[\{'|\bNone\b")


def problems(rendered: str, messages: list[dict[str, Any]], *, calls: bool = True) -> list[str]:
    """What is wrong with one rendering: an assistant text not shown, a tool call's argument
    key missing or encoded twice (``calls``: the template shows tool calls), a Python
    representation or a None."""
    found = []
    for message in messages:
        if message.get("role") != "assistant":
            continue
        content = message.get("content")
        if not isinstance(content, str):
            found.append(f"content {content!r} is not a string")
        elif content.strip() and content.strip() not in rendered:
            found.append(f"assistant text {content.strip()[:40]!r} not shown")
        for tool_call in message.get("tool_calls") or [] if calls else []:
            function = tool_call["function"]
            if function["name"] not in rendered:
                found.append(f"tool call {function['name']} not shown")
            arguments = function["arguments"]
            for key in arguments if isinstance(arguments, dict) else ():
                if f'\\"{key}\\"' in rendered:
                    found.append(f"arguments of {function['name']} encoded twice")
                elif f'"{key}"' not in rendered and f"{key}" not in rendered:
                    found.append(f"argument {key} of {function['name']} not shown")
    if match := REPR.search(rendered):
        found.append(f"a Python representation: {match.group()!r}")
    return found


MATRIX = [HF, Chat("hf", "merge")]


@pytest.mark.parametrize("template", TEMPLATES)
@pytest.mark.parametrize("chat", MATRIX, ids=lambda c: c.describe())
def test_every_chat_row_renders_with_the_template(template: str, chat: Chat) -> None:
    cases = rows(chat)
    assert {what.split("/")[0] for what, _ in cases} == set(CHAT_FORMATS)
    failures = []
    for what, messages in cases:
        try:
            rendered = render(template, messages)
        except Exception as exc:  # a template error is a failure to report
            failures.append(f"{what}: {type(exc).__name__}: {exc}")
            continue
        found = problems(rendered, messages, calls=shows_tool_calls(template))
        failures += [f"{what}: {p}" for p in found]
    assert not failures, "\n".join(failures[:20])


def test_the_checks_catch_the_raw_shape() -> None:
    """The raw messages (parts, nulls, JSON-string arguments) fail the same checks: Qwen 2.5
    cannot add a list to a string, Llama 3.1 prints the parts' repr and encodes arguments
    twice. So the matrix above can fail."""
    parts = CONVERSATIONS["parts"]
    with pytest.raises(Exception, match="list"):
        render("qwen2_5", parts)
    assert problems(render("llama3_1", parts), parts)
    one_call = [m for m in CONVERSATIONS["null_content_and_one_call"] if m["role"] != "tool"]
    hf_call = dict(one_call[1], content="")
    rendered = render("llama3_1", [one_call[0], hf_call])
    assert any("encoded twice" in p for p in problems(rendered, [one_call[0], {
        **hf_call, "tool_calls": [call(1, "track_parcel", {"parcel_ref": "7"})]}]))  # fmt: skip


# --- rows made for a chat template TRL does not ship (issue 55) ------------------------------


def made_rows(tools: bool = True) -> list[tuple[str, dict[str, Any]]]:
    """(format, row) for every row of every chat format of the agent conversations of
    tests/chattemplates.py, in the shape a template's rows start from."""
    shaped = template_chat(HF)
    recs = agent_records()
    out = [(fmt, row) for fmt in ("messages", "prompt_completion", "kto") for record in recs
           if (row := render_row(fmt, record, chat=shaped, tools=tools)) is not None]  # fmt: skip
    out += [("preference", row) for completion in ("turn", "rest")
            for row in preference_pairs(recs, completion=completion, chat=shaped,  # type: ignore[arg-type]  # a Literal
                                        tools=tools)]  # fmt: skip
    return out


def conversations_of(fmt: str, row: dict[str, Any]) -> list[list[dict[str, Any]]]:
    if fmt == "messages":
        return [row["messages"]]
    if fmt == "preference":
        return [row["prompt"] + row["chosen"], row["prompt"] + row["rejected"]]
    return [row["prompt"] + row["completion"]]


@cache
def agent_tokenizer(name: str) -> PreTrainedTokenizerFast:
    tok = PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer(WordLevel({"<unk>": 0}, unk_token="<unk>")),
        bos_token="<s>", eos_token="</s>", unk_token="<unk>",
    )  # fmt: skip
    tok.chat_template = template_paths()[name].read_text()
    return tok


@pytest.mark.parametrize("name", AGENT_TEMPLATES)
def test_rows_made_for_a_template_render_through_apply_chat_template(name: str) -> None:
    """23 templates TRL does not ship, every chat format: each row the fit keeps renders
    through transformers' own apply_chat_template (with the row's tools) showing every
    message's text; each row it leaves out says why."""
    fit = TemplateFit.probed(agent_template(name))
    rows = made_rows()
    assert {fmt for fmt, _ in rows} == set(CHAT_FORMATS)
    kept, reasons = 0, set()
    for fmt, row in rows:
        made, reason = fit.row(fmt, row)
        if made is None:
            assert reason is not None
            reasons.add(reason.split(":")[0])
            continue
        kept += 1
        tools = json.loads(made["tools"]) if "tools" in made else None
        for conversation in conversations_of(fmt, made):
            text = agent_tokenizer(name).apply_chat_template(
                copy.deepcopy(conversation), tools=tools, tokenize=False
            )
            assert isinstance(text, str)
            assert missing(conversation, text) is None, (name, fmt)
    assert reasons <= {"raises", DROPS_TEXT, DROPS_CALLS, GARBLES}
    assert kept or name == "firefunction_v2"  # it reads a `functions` variable nobody passes


def test_a_template_that_drops_tool_calls_silently_is_caught() -> None:
    """Granite 3.3's official template never reads tool_calls, and raises nothing: every row
    with a call is left out as dropping it, every other row kept."""
    fit = TemplateFit.probed(agent_template("granite_3_3"))
    for fmt, row in made_rows():
        called = any(m.get("tool_calls") for c in conversations_of(fmt, row) for m in c)
        made, reason = fit.row(fmt, row)
        assert (made is None, reason) == ((True, DROPS_CALLS) if called else (False, None))
