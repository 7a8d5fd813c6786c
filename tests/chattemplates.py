"""The chat templates of the tests and the agent conversations they render (issue 55).

23 templates TRL does not ship: the built-in ones (``rl_export/formats/chat_templates/``,
vLLM's) and ``tests/data/chat_templates/`` (llama.cpp's copies of the models' own, vLLM's
others, Zephyr's), each with its source and licence in the folder's ``SOURCES.md``. The
conversations are what agents write: a system prompt, several turns, tool calls with and
without text beside them, parallel calls, results, ids as OpenAI and Anthropic give them,
null and list content, and a trace with tools in its metadata.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

from rl_export.formats.templates import BUILTIN_DIR
from rl_export.formats.templating import ChatTemplate

TEST_DIR = Path(__file__).parent / "data" / "chat_templates"


def template_paths() -> dict[str, Path]:
    """Every template of the tests by name: the built-ins, then the test data."""
    found = {p.stem: p for p in sorted(BUILTIN_DIR.glob("*.jinja"))}
    found |= {p.stem: p for p in sorted(TEST_DIR.glob("*.jinja"))}
    return found


TEMPLATES = tuple(template_paths())


def template(name: str) -> ChatTemplate:
    return ChatTemplate(template_paths()[name].read_text(), name)


TOOLS: list[dict[str, Any]] = [
    {"type": "function", "function": {
        "name": "lookup_order", "description": "Find an order by its number.",
        "parameters": {"type": "object", "required": ["order"], "properties": {
            "order": {"type": "integer", "description": "The order number."}}},
    }},
    {"type": "function", "function": {
        "name": "refund_order", "description": "Refund an order.",
        "parameters": {"type": "object", "required": ["order", "reason"], "properties": {
            "order": {"type": "integer", "description": "The order number."},
            "reason": {"type": "string", "description": "Why."}}},
    }},
]  # fmt: skip
"""Tool schemas as an agent's metadata carries them (``metadata.tools``)."""


def _call(call_id: str | None, name: str, arguments: Any) -> dict[str, Any]:
    call: dict[str, Any] = {"type": "function", "function": {"name": name, "arguments": arguments}}
    if call_id is not None:
        call["id"] = call_id
    return call


SYSTEM = {"role": "system", "content": "You are a careful support agent for ACME."}
CONVERSATIONS: dict[str, list[dict[str, Any]]] = {
    "plain": [
        SYSTEM,
        {"role": "user", "content": "Where is order 12?"},
        {"role": "assistant", "content": "It shipped yesterday."},
        {"role": "user", "content": "Thanks."},
        {"role": "assistant", "content": "You are welcome."},
    ],
    "openai_call": [
        SYSTEM,
        {"role": "user", "content": "My order 12 never arrived."},
        {"role": "assistant", "content": None, "tool_calls": [
            _call("call_8fJq2LmZ0aB4cD6eF8gH1iJ3", "lookup_order", '{"order": 12}')]},
        {"role": "tool", "tool_call_id": "call_8fJq2LmZ0aB4cD6eF8gH1iJ3",
         "content": '{"status": "lost in transit"}'},
        {"role": "assistant", "content": [{"type": "text", "text": "It was lost; "},
                                          {"type": "text", "text": "I will refund it."}]},
    ],
    "text_beside_calls": [
        {"role": "user", "content": "Refund order 7, it broke."},
        {"role": "assistant", "content": "Let me look it up first.", "tool_calls": [
            _call("toolu_01A2b3C4d5E6f7G8h9J0k1L2", "lookup_order", {"order": 7})]},
        {"role": "tool", "tool_call_id": "toolu_01A2b3C4d5E6f7G8h9J0k1L2",
         "content": "delivered, broken"},
        {"role": "assistant", "content": "Refunding now.", "tool_calls": [
            _call("toolu_01M2n3P4q5R6s7T8u9V0w1X2", "refund_order",
                  {"order": 7, "reason": "arrived broken"})]},
        {"role": "tool", "tool_call_id": "toolu_01M2n3P4q5R6s7T8u9V0w1X2", "content": "refunded"},
        {"role": "assistant", "content": "Done: order 7 is refunded."},
    ],
    "parallel_calls_reused_ids": [
        SYSTEM,
        {"role": "user", "content": "Status of orders 3 and 4?"},
        {"role": "assistant", "content": "", "tool_calls": [
            _call("call_0", "lookup_order", {"order": 3}),
            _call("call_1", "lookup_order", {"order": 4})]},
        {"role": "tool", "tool_call_id": "call_0", "content": "order 3: packed"},
        {"role": "tool", "tool_call_id": "call_1", "content": "order 4: shipped"},
        {"role": "assistant", "content": "Order 3 is packed, order 4 shipped."},
        {"role": "user", "content": "And order 5?"},
        {"role": "assistant", "content": "", "tool_calls": [
            _call("call_0", "lookup_order", {"order": 5})]},
        {"role": "tool", "tool_call_id": "call_0", "content": "order 5: cancelled"},
        {"role": "assistant", "content": "Order 5 was cancelled."},
    ],
    "no_ids": [
        {"role": "user", "content": "Look up order 9."},
        {"role": "assistant", "content": None, "tool_calls": [
            _call(None, "lookup_order", {"order": 9})]},
        {"role": "tool", "content": "order 9: returned"},
        {"role": "assistant", "content": "Order 9 came back to us."},
    ],
}  # fmt: skip
"""Conversations as traces hold them (the hf chat style is made from these)."""


def record(name: str, messages: list[dict[str, Any]], *, reward: float = 0.8,
           tools: bool = False, n: int = 0) -> dict[str, Any]:  # fmt: skip
    """A trajectory record (the fields the chat formats read)."""
    return {
        "trace_id": f"{name}-{n}", "revision": 1, "reward": reward, "passed": reward > 0.5,
        "scenario": "support", "agent_version": "v1", "messages": copy.deepcopy(messages),
        "metadata": {"tools": TOOLS} if tools else {},
    }  # fmt: skip


def records() -> list[dict[str, Any]]:
    """Every conversation as two records that pair (one passed, one failed, another last
    reply), without and with tools in their metadata."""
    out = []
    for tools in (False, True):
        for name, messages in CONVERSATIONS.items():
            other = copy.deepcopy(messages)
            other[-1] = {"role": "assistant", "content": f"Another answer to {name}."}
            key = f"{name}{'-tools' if tools else ''}"
            out.append(record(key, messages, reward=0.9, tools=tools, n=0))
            out.append(record(key, other, reward=0.2, tools=tools, n=1))
    return out
