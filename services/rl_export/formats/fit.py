"""Rows made for a chat template, or the reason they cannot be (pure).

A :class:`TemplateFit` is a template, what it requires (:func:`~rl_export.formats.probes.
probe`, once) and how the trainer reads the rows (:class:`~rl_export.formats.adapt.Reading`).
For each row of a chat format it:

1. adapts the conversation (:func:`~rl_export.formats.adapt.adapt`): plain dict operations;
2. renders it as the trainer does, with the row's ``tools`` (the trace's) when it has them:
   ``messages`` whole; ``prompt_completion`` and ``kto`` the prompt with the generation
   prompt, then prompt and completion together, the completion being what follows their
   common prefix (TRL's rule); ``preference`` the prompt, then the prompt with each reply;
3. checks that every message's text is in the output, where the trainer takes it from:
   each content (trimmed; as written, or JSON- or Python-escaped), each tool call's function
   name, and each key and value of its arguments. verl's Parquet (``verl_parquet``) also
   renders the messages one at a time as verl does and checks that, together, they are the
   whole render.

The row comes back adapted (its ``tools`` as JSON text, which TRL parses, in JSON Lines), or
None with the reason (:data:`REASONS`): ``raises: <the template's message>``, ``drops
text``, ``drops tool calls``, ``garbles arguments`` (no form of the arguments renders
cleanly), ``renders differently one message at a time`` (verl).

Public interface::

    class TemplateFit(template, requirements, reading=Reading())
        TemplateFit.probed(template, reading=Reading(), merge_system=False)  # probes once
        .row(fmt, row) -> (row | None, reason | None)
        .adaptations() -> list[str]
    def missing(messages, rendered) -> str | None
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import orjson

from rl_export.formats.adapt import Reading, Requirements, adapt, split_at
from rl_export.formats.probes import probe
from rl_export.formats.templating import ChatTemplate

DROPS_TEXT = "drops text"
DROPS_CALLS = "drops tool calls"
GARBLES = "garbles arguments"
VERL_SPLIT = "renders differently one message at a time"
REASONS = ("raises: <message>", DROPS_TEXT, DROPS_CALLS, GARBLES, VERL_SPLIT)
"""Why a row is left out (``raises:`` is followed by the template's message)."""
_REASON_CHARS = 160


def raises(exc: BaseException) -> str:
    """The reason of a row the template raised on: its message's first line, cut short."""
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    if len(text) > _REASON_CHARS:
        text = text[: _REASON_CHARS - 1] + "…"
    return f"raises: {text}"


def _found(text: str, rendered: str, start: int) -> int:
    """Where ``text`` ends in the output, at its first place from ``start``: as written, or
    escaped as JSON or as a Python string; -1 when it is not there."""
    found = rendered.find(text, start)
    length = len(text)
    # An escaped form is at least as long as the text: it can come first only with room.
    # Printable ASCII without quotes or backslashes has no escaped form but itself.
    if (found < 0 or found - start >= length) and not _plain(text):
        end = found if found >= 0 else len(rendered)
        for form in (json.dumps(text, ensure_ascii=False), json.dumps(text), repr(text)):
            if form[1:-1] != text:
                at = rendered.find(form[1:-1], start, end)
                if at >= 0:
                    found, length, end = at, len(form) - 2, at
    return found + length if found >= 0 else -1


def _plain(text: str) -> bool:
    """Whether JSON and Python escape nothing in ``text`` (its forms are the text)."""
    return (
        text.isascii() and text.isprintable()
        and '"' not in text and "'" not in text and "\\" not in text
    )  # fmt: skip


def _leaves(value: Any) -> list[str]:
    """The keys and scalar values of a tool call's arguments, as text to look for."""
    if isinstance(value, str):
        return [value.strip()] if value.strip() else []
    if isinstance(value, bool):
        return []  # true / True: either is the value
    if isinstance(value, int | float):
        return [str(value)]
    out: list[str] = []
    if isinstance(value, dict):
        for key, item in value.items():
            out += _leaves(key) + _leaves(item)
    elif isinstance(value, list):
        for item in value:
            out += _leaves(item)
    return out


def _arguments(function: dict[str, Any]) -> Any:
    arguments = function.get("arguments")
    if isinstance(arguments, str):
        try:
            return orjson.loads(arguments)
        except orjson.JSONDecodeError:
            return arguments
    return arguments


def _pieces(message: dict[str, Any]) -> list[tuple[str, str]]:
    """What of a message must be in the output, and the reason when it is not: its text, and
    each tool call's function name and its arguments' keys and values."""
    pieces = []
    content = message.get("content")
    if type(content) is str and content.strip():
        pieces.append((content.strip(), DROPS_TEXT))
    return pieces + _call_pieces(message)


def _call_pieces(message: dict[str, Any]) -> list[tuple[str, str]]:
    """A message's pieces (:func:`_pieces`) but its text: its tool calls'."""
    pieces = []
    for call in message.get("tool_calls") or ():
        if type(call) is not dict:
            continue
        function = call.get("function")
        function = function if type(function) is dict else call
        name = function.get("name")
        if type(name) is str and name:
            pieces.append((name, DROPS_CALLS))
        pieces += [(leaf, DROPS_CALLS) for leaf in _leaves(_arguments(function))]
    return pieces


def missing(messages: Sequence[Any], rendered: str) -> str | None:
    """The first thing of the messages the output lacks (``drops text``, ``drops tool
    calls``), or None when every text is there. A message's pieces are looked for after
    where the pieces of the messages before it were found (in any order within it): a tool
    name or an argument shown only in the tool definitions, or a text shown only before its
    place, does not count."""
    start = 0
    find = rendered.find
    for message in messages:
        if type(message) is not dict:
            continue
        end = start
        # _pieces(message) in order, its text (the usual piece) looked for here.
        content = message.get("content")
        if type(content) is str:
            text = content.strip()
            if text:
                found = find(text, start)
                # As written, where no escaped form can come first (_found).
                if found >= 0 and (found - start < len(text) or _plain(text)):
                    found += len(text)
                else:
                    found = _found(text, rendered, start)
                    if found < 0:
                        return DROPS_TEXT
                end = max(end, found)
        if message.get("tool_calls"):
            for text, reason in _call_pieces(message):
                found = find(text, start)
                if found >= 0 and (found - start < len(text) or _plain(text)):
                    found += len(text)
                else:
                    found = _found(text, rendered, start)
                    if found < 0:
                        return reason
                end = max(end, found)
        start = end
    return None


def _has_calls(messages: Sequence[Any]) -> bool:
    return any(isinstance(m, dict) and m.get("tool_calls") for m in messages)


def _common_prefix(a: str, b: str) -> int:
    """The length of the longest common prefix (slices compared, a binary search)."""
    lo, hi = 0, min(len(a), len(b))
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if a[:mid] == b[:mid]:
            lo = mid
        else:
            hi = mid - 1
    return lo


class TemplateFit:
    """A template, what it requires, and how the trainer reads the rows (the module)."""

    def __init__(
        self, template: ChatTemplate, requirements: Requirements, reading: Reading | None = None
    ) -> None:
        self.template = template
        self.requirements = requirements
        self.reading = reading or Reading()
        self._verl_parts: tuple[str, str] | None = None

    @classmethod
    def probed(
        cls, template: ChatTemplate, reading: Reading | None = None, *, merge_system: bool = False
    ) -> TemplateFit:
        """The fit of a template, its requirements found by probes (once, here)."""
        reading = reading or Reading()
        return cls(template, probe(template, reading, merge_system=merge_system), reading)

    def __reduce__(self) -> tuple[Any, ...]:
        return TemplateFit, (self.template, self.requirements, self.reading)

    def adaptations(self) -> list[str]:
        """What every row gets (the card's and the manifest's list)."""
        return self.requirements.adaptations()

    # --- one conversation ------------------------------------------------------------------

    def _render(self, messages: list[Any], tools: Any, prompt: bool = False) -> str:
        return self.template.render(messages, tools, add_generation_prompt=prompt)

    def _shown(self, messages: list[Any], tools: Any) -> tuple[list[Any], Any]:
        return self.reading.view(messages, tools if isinstance(tools, list) else None)

    def _out(self, row: dict[str, Any], **columns: Any) -> dict[str, Any]:
        out = {**row, **columns}
        tools = row.get("tools")
        if tools is not None and self.reading.kind == "jsonl":
            out["tools"] = orjson.dumps(tools).decode()  # TRL reads tools given as JSON text
        return out

    def _messages(self, row: dict[str, Any]) -> tuple[dict[str, Any] | None, str | None]:
        adapted, _ = adapt(row["messages"], self.requirements)
        if self.requirements.garbles_arguments and _has_calls(adapted):
            return None, GARBLES
        shown, tools = self._shown(adapted, row.get("tools"))
        try:
            rendered = self._render(shown, tools)
        except Exception as exc:  # the template's own error: the row's reason
            return None, raises(exc)
        reason = missing(shown, rendered)
        if reason is None and self.reading.kind == "verl_parquet":
            reason = self._verl(shown, tools, rendered)
        if reason is not None:
            return None, reason
        return self._out(row, messages=adapted), None

    def _split(
        self, prompt: list[Any], replies: list[list[Any]], tools: Any
    ) -> tuple[list[Any], list[list[Any]]] | str:
        """The prompt and each reply adapted and checked as TRL renders them (the module's
        step 2), or the reason they cannot be."""
        adapted_prompt: list[Any] | None = None
        adapted_replies = []
        for reply in replies:
            conversation, origins = adapt([*prompt, *reply], self.requirements)
            head, tail = split_at(conversation, origins, len(prompt))
            adapted_prompt = head if adapted_prompt is None else adapted_prompt
            adapted_replies.append(tail)
        assert adapted_prompt is not None
        if self.requirements.garbles_arguments and (
            _has_calls(adapted_prompt) or any(map(_has_calls, adapted_replies))
        ):
            return GARBLES
        shown_prompt, shown_tools = self._shown(adapted_prompt, tools)
        last = shown_prompt[-1] if shown_prompt else None
        asks = isinstance(last, dict) and last.get("role") in ("user", "tool")
        try:
            prompt_text = self._render(shown_prompt, shown_tools, prompt=asks)
            fulls = [
                self._render(self._shown([*adapted_prompt, *r], tools)[0], shown_tools)
                for r in adapted_replies
            ]
        except Exception as exc:  # the template's own error: the row's reason
            return raises(exc)
        start = len(prompt_text)
        for full in fulls:
            start = min(start, _common_prefix(prompt_text, full))
        reason = missing(shown_prompt, prompt_text)
        for reply, full in zip(adapted_replies, fulls, strict=True):
            reason = reason or missing(self._shown(reply, None)[0], full[start:])
        if reason is not None:
            return reason
        return adapted_prompt, adapted_replies

    def row(self, fmt: str, row: dict[str, Any]) -> tuple[dict[str, Any] | None, str | None]:
        """The row adapted to the template, or None and why it cannot be (the module)."""
        if fmt == "messages":
            return self._messages(row)
        if fmt in ("prompt_completion", "kto"):
            made = self._split(row["prompt"], [row["completion"]], row.get("tools"))
            if isinstance(made, str):
                return None, made
            prompt, (completion,) = made
            return self._out(row, prompt=prompt, completion=completion), None
        if fmt == "preference":
            made = self._split(row["prompt"], [row["chosen"], row["rejected"]], row.get("tools"))
            if isinstance(made, str):
                return None, made
            prompt, (chosen, rejected) = made
            return self._out(row, prompt=prompt, chosen=chosen, rejected=rejected), None
        raise ValueError(f"a chat template applies to the chat formats, not {fmt!r}")

    # --- verl's message-at-a-time rendering ------------------------------------------------

    def _verl_apply(self, messages: list[Any], tools: Any) -> str:
        """verl's ``apply_chat_template``: a template that refuses a lone message gets an
        empty user message first, cut off again."""
        try:
            return self._render(messages, tools)
        except Exception:  # verl's own fallback catches everything
            dummy = [{"role": "user", "content": [{"type": "text", "text": ""}]}]
            before = self._render(dummy, tools)
            return self._render([*dummy, *messages], tools)[len(before) :]

    def _verl(self, messages: list[Any], tools: Any, whole: str) -> str | None:
        """verl's MultiTurnSFTDataset renders each message alone (the first with the tools),
        cuts the system prompt off all but the first, and refuses a row whose pieces do not
        make the whole render (its ``sanity_check``; compared here as text). It learns an
        assistant message's piece but for its first tokens, as many as the generation
        prompt has: a piece that does not start with it would lose some of the reply."""
        empty = [{"role": "user", "content": ""}]
        try:
            if self._verl_parts is None:
                one, two = self._render(empty, None), self._render(empty * 2, None)
                asking = self._render(empty, None, prompt=True)
                self._verl_parts = (one[: len(one) - (len(two) - len(one))], asking[len(one) :])
            system_prompt, generation_prompt = self._verl_parts
            pieces = []
            for n, message in enumerate(messages):
                piece = self._verl_apply([message], tools if n == 0 else None)
                if n and message.get("role") != "system":
                    if not piece.startswith(system_prompt):
                        return VERL_SPLIT
                    piece = piece[len(system_prompt) :]
                if message.get("role") == "assistant" and not piece.startswith(generation_prompt):
                    return VERL_SPLIT
                pieces.append(piece)
        except Exception as exc:  # verl would raise on this row
            return raises(exc)
        return None if "".join(pieces) == whole else VERL_SPLIT
