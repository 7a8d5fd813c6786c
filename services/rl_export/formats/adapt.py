"""Adapting a conversation to what a chat template requires (pure dict operations).

What a template requires is found by rendering probes (:mod:`rl_export.formats.probes`) and
held in a :class:`Requirements`; :func:`adapt` applies it to one conversation. The input is
the conversation in the ``hf`` chat style with an assistant's text and tool calls kept in
one message (``Chat(split=False)``): string content, tool-call arguments as JSON objects. The
adaptations, each only where the template was found to need it:

- **tool call ids** (``call_ids``): every call gets a new id of the length and alphabet the
  template accepts, derived from its original id (and the how-many-th use of that id it is)
  by SHA-256, so the same input always gives the same ids; unique within the conversation
  (a collision is hashed again); a tool result gets the id of its call. A call without an
  id gets one derived from its place among the conversation's calls.
- **tool message names** (``tool_names``): a tool message without a ``name`` gets its call's
  function name.
- **text beside calls** (``text_with_calls``): ``together`` keeps an assistant's text and
  its calls in one message; ``split`` puts the text in a message of its own before them.
- **calls per message** (``calls_per_message``): ``many`` keeps a message's calls together;
  ``one`` gives each call a message of its own.
- **arguments** (``arguments``): ``object`` (as given) or ``string`` (JSON text).
- **system messages** (``merge_system``): folded into the first user message
  (:func:`rl_export.formats.chat.restyle`'s ``system="merge"``).

A tool result's call is the unanswered call with its ``tool_call_id`` (the oldest, when an
id is used twice), or, without one, the oldest unanswered call. Every other key of a message
(``weight`` included) is kept, on each message a split makes. The input is never changed.

Public interface::

    IdShape(length, alphabet)                 # alphabet: a key of ALPHABETS
    Requirements(...)                         # what a template needs; .adaptations()
    def adapt(messages, req) -> (messages, origins)   # origins[i]: index in the input
    def split_at(messages, origins, boundary) -> (head, tail)
    Reading(kind="jsonl" | "verl_parquet")    # how a trainer reads rows back: .view(...)
    def verl_messages(messages) -> list       # a conversation as verl's Parquet holds it
    def verl_tools(tools) -> list | None
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

import orjson

from rl_export.formats.chat import restyle

ALPHABETS: dict[str, str] = {
    "alnum": "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789",
    "lower_alnum": "abcdefghijklmnopqrstuvwxyz0123456789",
    "digits": "0123456789",
}
"""The alphabets a tool call id may be rewritten in, by name."""


@dataclass(frozen=True, slots=True)
class IdShape:
    """Tool call ids of ``length`` characters of ``ALPHABETS[alphabet]``."""

    length: int
    alphabet: str = "alnum"

    def describe(self) -> str:
        return f"{self.length} characters of [{_ranges(ALPHABETS[self.alphabet])}]"


def _ranges(alphabet: str) -> str:
    parts = []
    for lo, hi in (("A", "Z"), ("a", "z"), ("0", "9")):
        if lo in alphabet:
            parts.append(f"{lo}-{hi}")
    return "".join(parts)


@dataclass(frozen=True, slots=True)
class Requirements:
    """What a template was found to require (the defaults: the ``hf`` chat style's shape)."""

    call_ids: IdShape | None = None
    tool_names: bool = False
    text_with_calls: Literal["together", "split"] = "split"
    calls_per_message: Literal["many", "one"] = "one"
    arguments: Literal["object", "string"] = "object"
    merge_system: bool = False
    garbles_arguments: bool = False  # neither form of the arguments renders cleanly

    def adaptations(self) -> list[str]:
        """What is applied to every row, in words (for the card and the manifest); an
        empty list when the rows keep the ``hf`` chat style's shape."""
        out = []
        if self.merge_system:
            out.append("system messages merged into the first user message (the template "
                       "drops them, moves them or has no system role)")  # fmt: skip
        if self.call_ids is not None:
            out.append(f"tool call ids rewritten as {self.call_ids.describe()}, derived "
                       "from the original ids by SHA-256, the same in a call and its "
                       "result")  # fmt: skip
        if self.tool_names:
            out.append("tool messages named after their call's function")
        if self.text_with_calls == "together":
            out.append("text beside tool calls kept in the calls' message")
        if self.calls_per_message == "many":
            out.append("parallel tool calls kept in one message")
        if self.arguments == "string":
            out.append("tool-call arguments as JSON strings")
        return out

    def as_dict(self) -> dict[str, Any]:
        return {
            "call_ids": None if self.call_ids is None else
            {"length": self.call_ids.length, "alphabet": self.call_ids.alphabet},
            "tool_names": self.tool_names, "text_with_calls": self.text_with_calls,
            "calls_per_message": self.calls_per_message, "arguments": self.arguments,
            "merge_system": self.merge_system, "garbles_arguments": self.garbles_arguments,
        }  # fmt: skip


def derive_id(original: str, nth: int, shape: IdShape, attempt: int = 0) -> str:
    """A new id for the ``nth`` use of ``original`` (``attempt`` > 0: after a collision)."""
    alphabet = ALPHABETS[shape.alphabet]
    digest = hashlib.sha256(f"{original}\0{nth}\0{attempt}".encode("utf-8", "surrogatepass"))
    number = int.from_bytes(digest.digest(), "big")
    base = len(alphabet)
    chars = []
    for _ in range(shape.length):
        number, digit = divmod(number, base)
        chars.append(alphabet[digit])
    return "".join(chars)


def _function(call: dict[str, Any]) -> dict[str, Any]:
    """Where a call's name and arguments are: ``function`` (OpenAI's shape) or the call."""
    function = call.get("function")
    return function if isinstance(function, dict) else call


class _Calls:
    """The calls of a conversation as they are met, and which are still unanswered."""

    def __init__(self, shape: IdShape | None) -> None:
        self.shape = shape
        self.used: set[str] = set()
        self.uses: dict[str, int] = {}
        self.count = 0
        self.open: list[tuple[Any, str | None, Any]] = []  # (original id, new id, name)

    def call(self, call: dict[str, Any]) -> dict[str, Any]:
        original = call.get("id")
        name = _function(call).get("name")
        new_id: str | None = None
        if self.shape is not None:
            key = original if isinstance(original, str) else f"\0#{self.count}"
            nth = self.uses.get(key, 0)
            self.uses[key] = nth + 1
            attempt = 0
            new_id = derive_id(key, nth, self.shape)
            while new_id in self.used:
                attempt += 1
                new_id = derive_id(key, nth, self.shape, attempt)
            self.used.add(new_id)
            call = {**call, "id": new_id}
        self.count += 1
        self.open.append((original, new_id, name))
        return call

    def answer(self, tool_call_id: Any) -> tuple[str | None, Any] | None:
        """(new id, name) of the call a tool result answers, or None when there is none."""
        index = None
        if tool_call_id is not None:
            index = next((n for n, c in enumerate(self.open) if c[0] == tool_call_id), None)
        if index is None and self.open:
            index = 0
        if index is None:
            return None
        _, new_id, name = self.open.pop(index)
        return new_id, name


def _arguments_string(call: dict[str, Any]) -> dict[str, Any]:
    function = call.get("function")
    if isinstance(function, dict):
        arguments = function.get("arguments")
        if arguments is not None and not isinstance(arguments, str):
            return {**call, "function": {**function, "arguments": orjson.dumps(arguments).decode()}}
        return call
    arguments = call.get("arguments")
    if arguments is not None and not isinstance(arguments, str):
        return {**call, "arguments": orjson.dumps(arguments).decode()}
    return call


def _layout(message: dict[str, Any], calls: list[Any], req: Requirements) -> list[dict[str, Any]]:
    """An assistant message with calls, as the template wants its text and calls placed."""
    text = message.get("content")
    together = req.text_with_calls == "together" or not text or type(text) is not str
    many = req.calls_per_message == "many" or len(calls) == 1
    if together and many:
        # The message as it is when its calls are (nothing changed them): no copy.
        return [message if calls is message.get("tool_calls") else {**message, "tool_calls": calls}]
    rest = {k: v for k, v in message.items() if k not in {"content", "tool_calls"}}
    groups = [calls] if many else [[c] for c in calls]
    out: list[dict[str, Any]] = []
    if not together:
        out.append({**rest, "content": text})
    for n, group in enumerate(groups):
        content = text if together and n == 0 else ""
        out.append({**rest, "content": content, "tool_calls": group})
    return out


def adapt(messages: Sequence[Any], req: Requirements) -> tuple[list[Any], list[int]]:
    """The conversation adapted to ``req`` (see the module), and for each message the index
    of the input message it came from (a merged system message: the user message's)."""
    source: Sequence[Any] = messages
    origins: Sequence[int] = range(len(source))
    if req.merge_system:
        systems = [n for n, m in enumerate(source)
                   if isinstance(m, dict) and m.get("role") == "system"]  # fmt: skip
        if systems:
            kept = [n for n in range(len(source)) if n not in systems]
            source = restyle(source, "raw", "merge")
            # Without a user message the systems became one user message where the first was.
            origins = kept if len(source) == len(kept) else sorted([*kept, systems[0]])
    calls = _Calls(req.call_ids)
    # Calls are followed to their results only for what a result gets from its call (a new
    # id, the name): without either, a call and a result are left as they are.
    follow = req.call_ids is not None or req.tool_names
    out: list[Any] = []
    where: list[int] = []
    strings = req.arguments == "string"
    for origin, message in zip(origins, source, strict=True):
        if type(message) is not dict:
            out.append(message)
            where.append(origin)
            continue
        role = message.get("role")
        if role == "assistant":
            given = message.get("tool_calls")
            if type(given) is list and given:
                made = [calls.call(c) if type(c) is dict else c for c in given] if follow else given
                if strings:
                    made = [_arguments_string(c) if type(c) is dict else c for c in made]
                pieces = _layout(message, made, req)
                out += pieces
                where += [origin] * len(pieces)
                continue
        elif role == "tool" and follow:
            out.append(_answered(message, calls.answer(message.get("tool_call_id")), req))
            where.append(origin)
            continue
        out.append(message)
        where.append(origin)
    return out, where


def _answered(
    message: dict[str, Any], found: tuple[str | None, Any] | None, req: Requirements
) -> dict[str, Any]:
    """A tool result with its call's new id and, where the template wants it, name."""
    if found is None:
        return message
    new_id, name = found
    named = req.tool_names and "name" not in message and isinstance(name, str)
    if new_id is None and not named:
        return message
    message = dict(message)
    if new_id is not None:
        message["tool_call_id"] = new_id
    if named:
        message["name"] = name
    return message


def split_at(messages: list[Any], origins: list[int], boundary: int) -> tuple[list[Any], list[Any]]:
    """An adapted conversation cut where its input was cut at ``boundary`` (the messages
    that came from input messages before it, and the rest)."""
    cut = next((n for n, origin in enumerate(origins) if origin >= boundary), len(messages))
    return messages[:cut], messages[cut:]


MESSAGE_KEYS = ("role", "content", "tool_calls", "tool_call_id", "name")
"""The keys of a message in verl's Parquet (a column has one type: every message has each
key, null where it had none; other keys are left out)."""


def _verl_call(call: Any) -> dict[str, Any] | None:
    if not isinstance(call, dict):
        return None
    function = _function(call)
    arguments = function.get("arguments")
    if arguments is not None and not isinstance(arguments, str):
        arguments = orjson.dumps(arguments).decode()
    name = function.get("name")
    return {
        "id": call.get("id") if isinstance(call.get("id"), str) else None,
        "type": call.get("type") if isinstance(call.get("type"), str) else None,
        "function": {"name": name if isinstance(name, str) else None, "arguments": arguments},
    }


def verl_messages(messages: Sequence[Any]) -> list[dict[str, Any]]:
    """A conversation as verl's Parquet holds it (:data:`MESSAGE_KEYS`; tool-call
    ``{id, type, function: {name, arguments}}`` with the arguments as JSON text)."""
    out = []
    for message in messages:
        if not isinstance(message, dict):
            continue
        row: dict[str, Any] = {}
        for key in MESSAGE_KEYS:
            value = message.get(key)
            if key == "tool_calls":
                calls = value if isinstance(value, list) and value else None
                value = None if calls is None else [_verl_call(c) for c in calls]
            elif key == "content":
                value = (
                    value
                    if isinstance(value, str) or value is None
                    else orjson.dumps(value).decode()
                )
            elif not isinstance(value, str):
                value = None
            row[key] = value
        out.append(row)
    return out


def verl_tools(tools: Sequence[Any] | None) -> list[dict[str, Any]]:
    """A tools list as verl's Parquet holds it: ``{type, function: {name, description,
    parameters}}``, ``parameters`` as JSON text (a JSON Schema has no one Arrow type); ``[]``
    for a row without tools (a null would reach the template as pandas' ``NA``, which
    transformers cannot iterate)."""
    if not tools:
        return []
    out = []
    for tool in tools:
        if not isinstance(tool, dict):
            continue
        function: dict[str, Any] = _function(tool)
        parameters = function.get("parameters")
        name, description = function.get("name"), function.get("description")
        out.append({
            "type": tool.get("type") if isinstance(tool.get("type"), str) else "function",
            "function": {
                "name": name if isinstance(name, str) else None,
                "description": description if isinstance(description, str) else None,
                "parameters": None if parameters is None else orjson.dumps(parameters).decode(),
            },
        })  # fmt: skip
    return out


@dataclass(frozen=True, slots=True)
class Reading:
    """How a trainer reads the rows back before they reach the template: ``jsonl``, as
    written; ``verl_parquet``, verl's ``MultiTurnSFTDataset`` on the Parquet file (verl
    0.9.1's transformers keeps a message's null keys: :func:`verl_messages`)."""

    kind: Literal["jsonl", "verl_parquet"] = "jsonl"

    @property
    def string_arguments(self) -> bool:
        """Whether the arguments can only be JSON strings for this reader."""
        return self.kind == "verl_parquet"

    def view(
        self, messages: list[Any], tools: list[Any] | None
    ) -> tuple[list[Any], list[Any] | None]:
        """The messages and tools as the trainer gives them to the template."""
        if self.kind == "jsonl":
            return messages, tools
        return verl_messages(messages), verl_tools(tools)
