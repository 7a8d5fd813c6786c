"""Chat styles: the shape a chat format's messages take on the way out (pure).

docs/guides/exports.md, "Chat style" (``--chat-style``, API ``chat_style=``, corpus specs,
``rl_export.hf``; formats ``messages``, ``prompt_completion``, ``preference``, ``kto``):

- ``hf`` (the default) is what Hugging Face chat templates and TRL expect: every ``content``
  is a string (the text of its parts joined in order with nothing between them, null becomes
  ``""``, a part that holds no text is left out), tool-call ``arguments`` are JSON objects (a
  string that is valid JSON for an object is parsed; any other string stays as it is), tool
  results are strings. A ``tool_calls`` that is null or empty is left out, because several
  templates (Llama 3.x) test whether the key exists and then index it. An assistant message
  with several tool calls, or with text beside its tool calls, becomes one message for its
  text and one per call, in order (each keeping the message's other keys, ``weight``
  included): Llama 3.x and GPT-OSS render one call per message (Llama refuses more, GPT-OSS
  drops the rest) and neither shows text beside a call as the reply.
- ``openai`` is OpenAI's chat fine-tuning shape: string content as above, ``arguments`` as
  JSON strings (an object is encoded once; a string stays as it is).
- ``raw`` is the messages exactly as received.

``system="merge"`` folds every system message into the first user message, for templates
without a system role (Gemma): their text comes first, in order, then the user's, separated
by a blank line. A conversation without a user message has its system messages turned into
one user message where the first of them was. In the ``raw`` style a merge of a content that
is a list of parts keeps parts (a string becomes one text part).

Every other key of a message is kept as it is, in particular the ``weight`` that
``--mask-failed-turns`` puts on assistant messages. The input is never changed: the
messages returned are new dicts (a non-object item of the list is passed through).

Public interface::

    ChatStyle = Literal["hf", "openai", "raw"];  CHAT_STYLES
    SystemMode = Literal["keep", "merge"];        SYSTEM_MODES
    def restyle(messages, style="hf", system="keep") -> list[dict]
    def content_text(content) -> str               # a content as the hf/openai string
    class Chat(style="hf", system="keep", split=True)   # as one value; .apply(messages)
    HF = Chat()                                    # the default
    def parse_chat(style, system) -> Chat          # ValueError naming what is wrong
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, TypeGuard, cast, get_args

import orjson

ChatStyle = Literal["hf", "openai", "raw"]
SystemMode = Literal["keep", "merge"]
CHAT_STYLES: tuple[str, ...] = get_args(ChatStyle)
SYSTEM_MODES: tuple[str, ...] = get_args(SystemMode)

_MERGE_SEPARATOR = "\n\n"
# Part types whose text is what the model read or wrote (OpenAI chat and responses shapes).
_TEXT_KEYS = ("text", "refusal")


_ABSENT: Any = object()


def _mapping(value: Any) -> TypeGuard[Mapping[str, Any]]:
    """A JSON object: a dict (what a decoder gives, tested first: the ABC check is slow)
    or another mapping."""
    return type(value) is dict or isinstance(value, Mapping)


def _part_text(part: Any) -> str | None:
    """The text of one content part, or None when it holds none (an image, a file...)."""
    if type(part) is dict:  # the usual part, {"type": "text", "text": ...}: at once
        text = part.get("text")
        if type(text) is str:
            return text
    if isinstance(part, str):
        return part
    if _mapping(part):
        for key in _TEXT_KEYS:
            text = part.get(key)
            if isinstance(text, str):
                return text
        if part.get("type") == "tool_result" and "content" in part:
            return content_text(part["content"])  # a tool result given as a part
    return None


def content_text(content: Any) -> str:
    """A message ``content`` as one string: a string as it is, null as ``""``, a list of
    parts as their texts joined in order, any other JSON value as its JSON text."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join([text for text in map(_part_text, content) if text is not None])
    return orjson.dumps(content).decode()


def _arguments_object(arguments: Any) -> Any:
    if isinstance(arguments, str):
        try:
            parsed = orjson.loads(arguments)
        except orjson.JSONDecodeError:
            return arguments
        return parsed if isinstance(parsed, dict) else arguments
    return arguments


def _arguments_string(arguments: Any) -> Any:
    if isinstance(arguments, str) or arguments is None:
        return arguments
    return orjson.dumps(arguments).decode()


def _tool_calls(calls: Any, style: ChatStyle) -> Any:
    if not isinstance(calls, list):
        return calls
    convert = _arguments_object if style == "hf" else _arguments_string
    out = []
    for given in calls:
        if not _mapping(given):
            out.append(given)
            continue
        call = dict(given)
        function = call.get("function")
        if _mapping(function) and "arguments" in function:
            call["function"] = {**function, "arguments": convert(function["arguments"])}
        elif "arguments" in call:  # a flat call, {name, arguments}
            call["arguments"] = convert(call["arguments"])
        out.append(call)
    return out


def _styled(message: Mapping[str, Any], style: ChatStyle) -> dict[str, Any]:
    out = dict(message)
    if style == "raw":
        return out
    content = out.get("content")
    out["content"] = content if type(content) is str else content_text(content)
    calls = out.get("tool_calls", _ABSENT)
    if calls is not _ABSENT:
        if calls is None or calls == []:
            if style == "hf":
                del out["tool_calls"]
        else:
            out["tool_calls"] = _tool_calls(calls, style)
    return out


def _as_parts(content: Any) -> list[Any]:
    if isinstance(content, list):
        return list(content)
    if content is None or content == "":
        return []
    return [{"type": "text", "text": content_text(content)}]


def _split_calls(message: dict[str, Any]) -> list[dict[str, Any]]:
    """An hf assistant message as one message per part: its text, then each tool call."""
    calls = message.get("tool_calls")
    if message.get("role") != "assistant" or not isinstance(calls, list):
        return [message]
    if len(calls) <= 1 and not message.get("content"):
        return [message]
    rest = {k: v for k, v in message.items() if k not in ("content", "tool_calls")}
    out = [{**rest, "content": message["content"]}] if message.get("content") else []
    out += [{**rest, "content": "", "tool_calls": [call]} for call in calls]
    return out


def _merged_content(contents: list[Any]) -> Any:
    present = [c for c in contents if c is not None and c not in ("", [])]
    if all(isinstance(c, str) for c in present):
        return _MERGE_SEPARATOR.join(present)
    parts: list[Any] = []
    for n, content in enumerate(present):
        if n:
            parts.append({"type": "text", "text": _MERGE_SEPARATOR})
        parts.extend(_as_parts(content))
    return parts


def _merge_system(messages: list[Any]) -> list[Any]:
    def is_role(message: Any, role: str) -> bool:
        return isinstance(message, dict) and message.get("role") == role

    systems = [m for m in messages if is_role(m, "system")]
    if not systems:
        return messages
    contents = [m.get("content") for m in systems]
    first_user = next((n for n, m in enumerate(messages) if is_role(m, "user")), None)
    out: list[Any] = []
    if first_user is None:
        placed = False
        for message in messages:
            if is_role(message, "system"):
                if not placed:
                    out.append({"role": "user", "content": _merged_content(contents)})
                    placed = True
                continue
            out.append(message)
        return out
    for n, message in enumerate(messages):
        if is_role(message, "system"):
            continue
        if n == first_user:
            merged = _merged_content([*contents, message.get("content")])
            out.append({**message, "content": merged})
        else:
            out.append(message)
    return out


def restyle(
    messages: Sequence[Mapping[str, Any]],
    style: ChatStyle = "hf",
    system: SystemMode = "keep",
    *,
    split: bool = True,
) -> list[dict[str, Any]]:
    """The messages in a chat style, with the system messages kept or merged (see the
    module); ``split=False`` keeps an ``hf`` assistant message's text and calls in one message
    (a chat template's fit places them: :mod:`rl_export.formats.adapt`). Raises ValueError
    for an unknown style or system mode."""
    if style not in CHAT_STYLES:
        raise ValueError(f"unknown chat style {style!r} (styles: {', '.join(CHAT_STYLES)})")
    if system not in SYSTEM_MODES:
        raise ValueError(f"unknown system mode {system!r} (modes: {', '.join(SYSTEM_MODES)})")
    out: list[Any] = [
        _styled(message, style) if type(message) is dict or _mapping(message) else message
        for message in messages
    ]
    if style == "hf" and split:
        out = [part for m in out for part in (_split_calls(m) if isinstance(m, dict) else [m])]
    if system == "merge":
        out = _merge_system(out)
    return out


@dataclass(frozen=True, slots=True)
class Chat:
    """A chat style and a system mode: how a chat format's messages go out."""

    style: ChatStyle = "hf"
    system: SystemMode = "keep"
    split: bool = True  # hf: an assistant's text and each call in messages of their own

    @property
    def as_received(self) -> bool:
        """Whether the messages go out exactly as received (``raw``, systems kept)."""
        return self.style == "raw" and self.system == "keep"

    def apply(self, messages: Sequence[Any]) -> list[Any]:
        """The messages in this style (:func:`restyle`)."""
        return restyle(messages, self.style, self.system, split=self.split)

    def describe(self) -> str:
        """``hf``, or ``hf, system merged``: how a card or a summary names it."""
        return self.style if self.system == "keep" else f"{self.style}, system merged"


HF = Chat()


def parse_chat(style: str | None = None, system: str | None = None) -> Chat:
    """A chat style and a system mode given as text (None: the default, ``hf`` / ``keep``);
    ValueError naming the unknown value."""
    style = "hf" if style is None else style.strip()
    system = "keep" if system is None else system.strip()
    if style not in CHAT_STYLES:
        raise ValueError(f"unknown chat style {style!r} (chat styles: {', '.join(CHAT_STYLES)})")
    if system not in SYSTEM_MODES:
        raise ValueError(f"unknown system mode {system!r} (modes: {', '.join(SYSTEM_MODES)})")
    return Chat(cast(ChatStyle, style), cast(SystemMode, system))
