"""Builders for valid events (as dicts and JSON bytes) used across the tests."""

from __future__ import annotations

from typing import Any

import orjson

BASE = {"org": "acme", "project": "bot", "trace_id": "tr-1"}
RUBRIC = {"correctness": 4, "helpfulness": 3, "efficiency": 5, "safety": 4}


def event(event_type: str, event_id: str = "e-1", at: str = "2026-01-01T00:00:00Z",
          **fields: Any) -> dict[str, Any]:  # fmt: skip
    """Return a valid event of ``event_type`` with the minimum payload, then ``fields``."""
    payloads: dict[str, dict[str, Any]] = {
        "trace.completed": {
            "agent_version": "v4",
            "scenario": "happy_path",
            "messages": [
                {"role": "user", "content": "Plan my wellness goals"},
                {"role": "assistant", "content": "Here is a balanced plan..."},
            ],
        },
        "trace.deleted": {},
        "evaluation.finished": {
            "evaluation_id": "ev-1",
            "results": [{"evaluator": "judge", "score": 0.8, "passed": True, "reasoning": "ok"}],
            "report": {"outcomes": [], "classifications": []},
        },
        "label.submitted": {"labeler": "ana", "rubric": dict(RUBRIC)},
        "label.skipped": {"labeler": "ana"},
        "label.retracted": {"labeler": "ana"},
        "label.compared": {"labeler": "ana", "trace_a": "tr-1", "trace_b": "tr-2", "choice": "a"},
        "label.uncompared": {"labeler": "ana", "trace_a": "tr-1", "trace_b": "tr-2"},
        "pair.void": {"trace_a": "tr-1", "trace_b": "tr-2"},
    }
    return {"event_id": event_id, "event_type": event_type, "occurred_at": at, **BASE,
            **payloads[event_type], **fields}  # fmt: skip


def raw(value: dict[str, Any]) -> bytes:
    return orjson.dumps(value)
