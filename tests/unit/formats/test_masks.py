"""Assistant spans without ``{% generation %}`` markers, and markers added to a template
(issue 55, part 2): found from prefixes of the render, each checked to be preserved."""

from __future__ import annotations

import pytest
from transformers.utils.chat_template_utils import render_jinja_template

from rl_export.formats.chat import Chat
from rl_export.formats.fit import TemplateFit
from rl_export.formats.masks import MaskError, check_marked, mark, prefix_spans
from rl_export.formats.templating import SPECIAL_TOKENS, ChatTemplate
from tests.chattemplates import CONVERSATIONS, TOOLS, template

HF = Chat("hf", split=False)
STABLE = ("qwq_32b", "qwen3_coder", "gemma3_pythonic_tools", "granite_3_tools",
          "llama3_1_json_tools", "deepseek_v3_1", "functionary_v3_1", "olmo3_tools")  # fmt: skip
UNSTABLE = ("phi4_mini_tools", "command_r7b_tool_use", "deepseek_v3_tools")


def fitted(name: str) -> list[tuple[list[dict], list | None]]:
    """Every conversation of the tests as rows made for the template (those it keeps)."""
    fit = TemplateFit.probed(template(name))
    out = []
    for messages in CONVERSATIONS.values():
        for tools in (None, TOOLS):
            row, _ = fit.row("messages", {"messages": HF.apply(messages)}
                             | ({"tools": tools} if tools else {}))  # fmt: skip
            if row is not None:
                out.append((row["messages"], tools))
    return out


@pytest.mark.parametrize("name", STABLE)
def test_prefix_spans_are_each_assistant_message(name: str) -> None:
    chat_template = template(name)
    for messages, tools in fitted(name):
        text, spans = prefix_spans(chat_template, messages, tools)
        assistants = [m for m in messages if m["role"] == "assistant"]
        assert len(spans) == len(assistants)
        for (start, end), message in zip(spans, assistants, strict=True):
            assert message["content"].strip() in text[start:end]
            others = [m["content"] for m in messages if m["role"] != "assistant" and m["content"]]
            learned = text[start:end].replace(message["content"].strip(), "")
            assert not any(o in learned for o in others)  # no prompt text learned


@pytest.mark.parametrize("name", STABLE)
def test_a_marked_template_renders_the_same_text_with_the_spans_as_blocks(name: str) -> None:
    original = template(name)
    marked = mark(original)
    conversations = fitted(name)
    check = check_marked(original, marked, conversations)
    assert check.ok, check.failures
    assert check.checked == len(conversations) > 0
    messages, tools = conversations[-1]
    ours = marked.render_blocks(messages, tools)
    theirs = render_jinja_template(  # type: ignore[misc]  # returns (texts, blocks)
        conversations=[messages], tools=tools, chat_template=marked.text,
        return_assistant_tokens_mask=True, **SPECIAL_TOKENS,
    )  # fmt: skip
    assert ours == (theirs[0][0], theirs[1][0])  # transformers finds the same blocks


@pytest.mark.parametrize("name", UNSTABLE)
def test_a_template_whose_prefixes_change_is_refused(name: str) -> None:
    """Phi-4-mini and Command R7B end every render with an assistant header, DeepSeek V3's
    vLLM template leaves whitespace that moves: no span can be found, and marking fails."""
    conversations = fitted(name)
    messages, tools = conversations[0]
    with pytest.raises(MaskError, match="differently from the beginning"):
        prefix_spans(template(name), messages, tools)
    check = check_marked(template(name), mark(template(name)), conversations)
    assert not check.ok
    assert check.failures


def test_a_marked_template_is_not_marked_again() -> None:
    with pytest.raises(ValueError, match="already marks"):
        mark(mark(template("qwq_32b")))


def test_the_macro_keeps_the_templates_whitespace() -> None:
    """Leading and trailing newlines, indented tags and CRLF render as they do at the top."""
    for text in ("\n  {% for m in messages %}{{ m.content }}\n{% endfor %}\n",
                 "{{ bos_token }}\r\n{% for m in messages %}[{{ m.content }}]{% endfor %}\r\n",
                 "   {%- for m in messages %} {{ m.content }} {% endfor -%}  "):  # fmt: skip
        original = ChatTemplate(text)
        messages = [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]
        assert mark(original).render(messages) == original.render(messages)
        assert check_marked(original, mark(original), [(messages, None)]).ok
