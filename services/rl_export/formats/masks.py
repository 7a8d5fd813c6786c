"""Where each assistant message is in a rendered conversation, without ``{% generation %}``
markers, and a template with markers made from one without (pure).

Assistant-only loss needs the characters of each assistant message in the render. A template
with ``{% generation %}`` blocks says so itself; for one without, the render of prefixes does.
For the *n*-th message, an assistant one:

1. the conversation before it renders as the beginning of the whole (it is *preserved*);
2. rendered with the generation prompt, it starts the same, and the message starts after the
   part of the generation prompt the whole conversation has there too (TRL's rule for a
   prompt: a template may add to the generation prompt what a finished turn lacks, Qwen's
   empty ``<think></think>``);
3. the conversation up to and including it, trailing whitespace aside, is preserved too, and
   ends where the message ends (its end-of-turn token included); for the last message, it
   is the beginning of the conversation with one more user message (a template that
   appends a header after every render would otherwise have it learned).

:func:`prefix_spans` raises :class:`MaskError` when a prefix is not preserved (a template that
appends a turn after the last message, or renders earlier turns differently as the
conversation grows): no mask can be derived then.

:func:`mark` writes that rule into the template itself: the original becomes a macro, rendered
whole and for each assistant message's prefixes, and the whole render is output with each
assistant message's span (found by the same rule) in a ``{% generation %}`` block. TRL's
``assistant_only_loss`` (and transformers' ``return_assistant_tokens_mask``) then take the
spans from the blocks.
:func:`check_marked` renders conversations with both templates: the marked one must give the
same text, and blocks that are the prefix spans; ``rl-export template mark`` refuses a
template for which any conversation that renders fails this.

Public interface::

    class MaskError(ValueError)
    def prefix_spans(template, messages, tools=None) -> (text, [(start, end), ...])
    def mark(template) -> ChatTemplate
    def check_marked(original, marked, conversations) -> MarkCheck
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from rl_export.formats.templating import ChatTemplate

_MACRO = "rl_export_original"
_WRAPPER = """{%- set rl_full = MACRO(messages, add_generation_prompt) -%}
{%- set rl = namespace(at=0, start=0) -%}
{%- for rl_message in messages -%}
{%- if rl_message.role == 'assistant' -%}
{%- set rl_before = MACRO(messages[:loop.index0], false)|length -%}
{%- set rl.start = rl_before -%}
{%- for rl_char in MACRO(messages[:loop.index0], true)[rl_before:] -%}
{%- if rl_full[rl.start:rl.start + 1] != rl_char -%}{%- break -%}{%- endif -%}
{%- set rl.start = rl.start + 1 -%}
{%- endfor -%}
{%- set rl_end = MACRO(messages[:loop.index], false).rstrip()|length -%}
{{- rl_full[rl.at:rl.start] -}}
{%- generation -%}{{- rl_full[rl.start:rl_end] -}}{%- endgeneration -%}
{%- set rl.at = rl_end -%}
{%- endif -%}
{%- endfor -%}
{{- rl_full[rl.at:] -}}""".replace("MACRO", _MACRO)


class MaskError(ValueError):
    """A conversation's assistant spans cannot be found from prefixes of its render."""


def prefix_spans(
    template: ChatTemplate, messages: Sequence[Any], tools: Sequence[Any] | None = None
) -> tuple[str, list[tuple[int, int]]]:
    """The conversation rendered, and each assistant message's character span in it (the
    module); MaskError when a prefix does not render as the beginning of the whole."""
    whole = template.render(messages, tools)
    spans = []
    for n, message in enumerate(messages):
        if not isinstance(message, dict) or message.get("role") != "assistant":
            continue
        before = template.render(messages[:n], tools)
        asking = template.render(messages[:n], tools, add_generation_prompt=True)
        upto = template.render(messages[: n + 1], tools).rstrip()
        start = len(before) + _common(asking[len(before) :], whole, len(before))
        if not (whole.startswith(before) and asking.startswith(before)
                and whole.startswith(upto) and len(upto) >= start):  # fmt: skip
            raise MaskError(
                f"{template.name} renders the conversation before or up to message {n + 1} "
                "(an assistant one) differently from the beginning of the whole "
                "conversation: its masks cannot be found from prefixes"
            )
        if n == len(messages) - 1 and not _continued(template, messages, tools, upto):
            raise MaskError(
                f"{template.name} renders something after the last message that another "
                "message would not follow: its masks cannot be found from prefixes"
            )
        spans.append((start, len(upto)))
    return whole, spans


_NEXT = {"role": "user", "content": "rl-export: the next message"}


def _continued(
    template: ChatTemplate, messages: Sequence[Any], tools: Sequence[Any] | None, upto: str
) -> bool:
    """The render up to the last message begins the render with one more user message (a
    template that refuses that one is not held to it)."""
    try:
        longer = template.render([*messages, _NEXT], tools)
    except Exception:  # a template with rules on what may follow: not checked
        return True
    return longer.startswith(upto)


def _common(prompt: str, whole: str, at: int) -> int:
    """How many characters of the generation prompt ``whole`` has at ``at``."""
    for n, char in enumerate(prompt):
        if at + n >= len(whole) or whole[at + n] != char:
            return n
    return len(prompt)


def _macro_body(text: str) -> str:
    """The template's text as a macro's body that renders as the template does at the top:
    newlines as jinja reads them, its final newline dropped (``keep_trailing_newline`` is
    off), a newline first (eaten by ``trim_blocks``: the first line then starts a line, for
    ``lstrip_blocks``), and an empty output last (nothing to strip before ``endmacro``)."""
    text = text.replace("\r\n", "\n").replace("\r", "\n")
    if text.endswith("\n"):
        text = text[:-1]
    return "\n" + text + "{{ '' }}"


def mark(template: ChatTemplate) -> ChatTemplate:
    """The template with each assistant message's span in a ``{% generation %}`` block (the
    module). ValueError for one that has blocks already."""
    if template.has_generation:
        raise ValueError(f"{template.name} already marks assistant output with "
                         "{% generation %} blocks")  # fmt: skip
    text = (f"{{% macro {_MACRO}(messages, add_generation_prompt) %}}"
            f"{_macro_body(template.text)}{{% endmacro %}}\n{_WRAPPER}")  # fmt: skip
    return ChatTemplate(text, f"{template.name}-marked", template.tokens)


@dataclass
class MarkCheck:
    """What rendering conversations with a template and its marked copy found."""

    checked: int = 0  # conversations the original renders
    failures: list[str] = field(default_factory=list)  # what went wrong, per conversation

    @property
    def ok(self) -> bool:
        return self.checked > 0 and not self.failures


def check_marked(
    original: ChatTemplate,
    marked: ChatTemplate,
    conversations: Iterable[tuple[Sequence[Any], Sequence[Any] | None]],
) -> MarkCheck:
    """Render each ``(messages, tools)`` with both: the same text, and blocks that are the
    prefix spans (the module). Conversations the original cannot render are not counted."""
    check = MarkCheck()
    for n, (messages, tools) in enumerate(conversations, 1):
        try:
            expected = original.render(messages, tools)
        except Exception:  # the original refuses it: not a conversation to mark
            continue
        check.checked += 1
        try:
            _, spans = prefix_spans(original, messages, tools)
            got, blocks = marked.render_blocks(messages, tools)
        except Exception as exc:  # a prefix that does not render, or renders differently
            check.failures.append(f"conversation {n}: {exc}")
            continue
        if got != expected:
            check.failures.append(f"conversation {n}: the marked template renders other text")
        elif blocks != spans:
            check.failures.append(f"conversation {n}: the blocks are not the assistant "
                                  "messages")  # fmt: skip
    return check
