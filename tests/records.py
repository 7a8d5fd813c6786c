"""Realistic trajectory records and event streams for the format, filter and export tests.

Conversations are multi-turn with tool calls, list-valued and null content, unknown message
keys and unicode with U+2028; some traces lack evaluations or labels, some are deleted or
have their only label retracted.
"""

from __future__ import annotations

import copy
from typing import Any

from tests.factories import event

SYSTEM = {"role": "system", "content": "You are a careful support agent."}
PROMPT = {"role": "user", "content": "My order #12 never arrived \u2028 can you help?"}


def conversation(variant: int) -> list[dict[str, Any]]:
    """A multi-turn conversation with a tool call, list and null content, unknown keys."""
    return [
        SYSTEM,
        PROMPT,
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": f"call_{variant}",
                    "type": "function",
                    "function": {"name": "lookup_order", "arguments": '{"order": 12}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": f"call_{variant}", "content": '{"status": "lost"}'},
        {
            "role": "assistant",
            "content": [{"type": "text", "text": f"Sorry \u2014 I re-shipped it (v{variant})."}],
            "x_latency_ms": 120 + variant,
        },
        {"role": "user", "content": "Thanks! \u2029 Anything else?"},
        {"role": "assistant", "content": f"No, all set \U0001f600 #{variant}", "name": "bot"},
    ]


def record(
    trace_id: str,
    *,
    reward: float | None = 0.8,
    passed: bool | None = True,
    source: str | None = "evaluator",
    messages: list[dict[str, Any]] | None = None,
    scenario: str = "refund",
    agent_version: str = "v4",
    updated_at: str = "2026-01-02T03:04:05Z",
    labels: int = 0,
    outcomes: list[dict[str, Any]] | None = None,
    attachments: list[dict[str, Any]] | None = None,
    revision: int = 3,
    metadata: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """A trajectory record as a corpus holds it (every field, DESIGN.md order)."""
    evaluation = None
    if outcomes is not None or source == "evaluator":
        evaluation = {
            "evaluation_id": f"ev-{trace_id}",
            "occurred_at": "2026-01-02T03:00:00Z",
            "results": [
                {
                    "evaluator": "judge",
                    "score": reward or 0.0,
                    "passed": bool(passed),
                    "reasoning": "ok",
                }
            ],
            "report": {"outcomes": outcomes or [], "classifications": []},
        }
    return {
        "trace_id": trace_id,
        "org": "acme",
        "project": "bot",
        "reward_source": source,
        "revision": revision,
        "reward": reward,
        "passed": passed,
        "rubric": {"correctness": 4.0, "helpfulness": 3.5, "efficiency": 5.0, "safety": 4.0}
        if labels
        else None,
        "labels_count": labels,
        "labelers": ["ana", "bo"][:labels],
        "skipped_by": [],
        "evaluator_scores": {"judge": reward} if evaluation else None,
        "evaluation": evaluation,
        "messages": copy.deepcopy(messages if messages is not None else conversation(0)),
        "agent_version": agent_version,
        "scenario": scenario,
        "attachments": attachments or [],
        "completed_at": "2026-01-01T00:00:00Z",
        "updated_at": updated_at,
        "pass_threshold": 0.7,
        "rules_version": 1,
        "human_labels": [
            {
                "labeler": name,
                "rubric": dict(zip(DIMENSIONS, ratings, strict=True)),
                "comment": None,
                "occurred_at": "2026-01-02T02:00:00Z",
            }
            for name, ratings in list(LABELS.items())[:labels]
        ],
        "metadata": dict(metadata or {}),
    }


DIMENSIONS = ("correctness", "helpfulness", "efficiency", "safety")
# The labels of record(labels=n): the first n (their mean is the record's rubric for n = 2).
LABELS = {"ana": (4, 3, 5, 4), "bo": (4, 4, 5, 4)}


def trace_events(
    n: int,
    *,
    score: float,
    passed: bool,
    minute: int = 0,
    labels: tuple[dict[str, int], ...] = (),
    messages: list[dict[str, Any]] | None = None,
    scenario: str = "refund",
    outcomes: list[dict[str, Any]] | None = None,
    attachments: list[dict[str, Any]] | None = None,
    deleted: bool = False,
    retract: bool = False,
    metadata: dict[str, Any] | None = None,
) -> list[dict[str, Any]]:
    """The events of one trace ``tr-<n>``: completed, evaluated, labels, maybe deleted."""
    trace_id = f"tr-{n:03d}"
    at = f"2026-01-01T{minute // 60:02d}:{minute % 60:02d}"
    out = [
        event(
            "trace.completed", f"{trace_id}-c", f"{at}:00Z", trace_id=trace_id,
            messages=messages if messages is not None else conversation(n), scenario=scenario,
            attachments=attachments or [], **({"metadata": metadata} if metadata else {}),
        ),
        event(
            "evaluation.finished", f"{trace_id}-e", f"{at}:01Z", trace_id=trace_id,
            evaluation_id=f"ev-{n}",
            results=[{"evaluator": "judge", "score": score, "passed": passed, "reasoning": "r"}],
            report={"outcomes": outcomes or [], "classifications": [
                {"type": "policy", "turn": 1, "assessments": [
                    {"principle_id": "p1", "decision": True, "explanation": "fine"}]}]},
        ),
    ]  # fmt: skip
    for k, rubric in enumerate(labels):
        out.append(
            event(
                "label.submitted",
                f"{trace_id}-l{k}",
                f"{at}:{10 + k:02d}Z",
                trace_id=trace_id,
                labeler=f"labeler-{k}",
                rubric=rubric,
            )
        )
    if retract and labels:
        out.append(
            event(
                "label.retracted",
                f"{trace_id}-r",
                f"{at}:30Z",
                trace_id=trace_id,
                labeler="labeler-0",
            )
        )
    if deleted:
        out.append(event("trace.deleted", f"{trace_id}-d", f"{at}:40Z", trace_id=trace_id))
    return out
