"""Output records (DESIGN.md section 4): the ``trajectory`` format and its tombstone.

These models are the contract trainers read; ``schemas/`` holds their JSON Schemas, generated
by :mod:`rl_export.schemas` and checked against these models by the test suite.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

import orjson
from pydantic import BaseModel, BeforeValidator, ConfigDict, Field

from rl_export.codec import RawJson, dumps
from rl_export.events import EvaluatorResult, Report, UtcDatetime

RULES_VERSION = 1
"""Bumped whenever a join or reward rule changes meaning, so records say which rules made them."""

RewardSource = Literal["human", "evaluator"]


def _parsed(value: Any) -> Any:
    """Records carry messages as :class:`RawJson`; validate the value they stand for."""
    return value.value() if isinstance(value, RawJson) else value


class _Record(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class RubricMean(_Record):
    """Per-dimension mean over the current labels (each 1.0..5.0)."""

    correctness: float = Field(ge=1, le=5)
    helpfulness: float = Field(ge=1, le=5)
    efficiency: float = Field(ge=1, le=5)
    safety: float = Field(ge=1, le=5)


class EvaluationView(_Record):
    """The current evaluation, with the judges' reasoning and the report."""

    evaluation_id: str
    occurred_at: UtcDatetime
    results: list[EvaluatorResult]
    report: Report


class TrajectoryRecord(_Record):
    """One snapshot of a trace, rendered for one reward source (or none, for ``traces``)."""

    trace_id: str
    org: str
    project: str
    reward_source: RewardSource | None
    revision: int = Field(ge=1)
    reward: float | None = Field(ge=0, le=1)
    passed: bool | None
    rubric: RubricMean | None
    labels_count: int = Field(ge=0)
    labelers: list[str]
    skipped_by: list[str]
    evaluator_scores: dict[str, float] | None
    evaluation: EvaluationView | None
    messages: Annotated[list[dict[str, Any]], BeforeValidator(_parsed)]
    agent_version: str
    scenario: str
    attachments: list[dict[str, Any]]
    completed_at: UtcDatetime
    updated_at: UtcDatetime
    pass_threshold: float = Field(ge=0, le=1)
    rules_version: int = Field(ge=1)


class Tombstone(_Record):
    """A deleted (or no longer ready) trajectory: it hides every earlier revision."""

    trace_id: str
    org: str
    project: str
    reward_source: RewardSource | None
    revision: int = Field(ge=1)
    deleted: Literal[True] = True


CorpusSource = RewardSource | None
"""A corpus's reward source: ``human``, ``evaluator``, or None for the ``traces`` corpus."""


def render(snapshot: dict[str, Any], source: CorpusSource) -> dict[str, Any] | None:
    """Render a join snapshot as the ``trajectory`` record of one corpus.

    Returns the tombstone of a deleted trace, the record when the trajectory is ready for
    ``source`` (always, for the ``traces`` corpus), or None when it is not ready. The sink
    writes a tombstone when a trajectory it holds stops being ready.
    """
    if snapshot["deleted"]:
        return tombstone(snapshot, source)
    if source is None:
        reward = None
    else:
        reward = snapshot[source]
        if reward is None:
            return None
    scored = {
        "reward_source": source,
        "reward": None if reward is None else reward["reward"],
        "passed": None if reward is None else reward["passed"],
    }
    return {k: scored[k] if k in scored else snapshot[k] for k in _RECORD_FIELDS}


def tombstone(snapshot: dict[str, Any], source: CorpusSource) -> dict[str, Any]:
    """The tombstone of a trace in one corpus: it hides every earlier revision."""
    return {
        "trace_id": snapshot["trace_id"],
        "org": snapshot["org"],
        "project": snapshot["project"],
        "reward_source": source,
        "revision": snapshot["revision"],
        "deleted": True,
    }


# The record's fields, in DESIGN.md order.
_RECORD_FIELDS = list(TrajectoryRecord.model_fields)


# --- snapshots on the trajectories topic ----------------------------------------------------


def encode_snapshot(snapshot: dict[str, Any]) -> bytes:
    """A snapshot as the value of a ``trajectories`` message.

    Two lines of JSON: the snapshot without its messages, then the messages. The sink reads
    the first line and copies the second into records without parsing it. A tombstone has no
    messages and is one line.
    """
    if "messages" not in snapshot:
        return dumps(snapshot)
    head = {k: v for k, v in snapshot.items() if k != "messages"}
    return dumps(head) + b"\n" + dumps(snapshot["messages"])


def decode_snapshot(value: bytes) -> dict[str, Any]:
    """Inverse of :func:`encode_snapshot`; messages come back as :class:`RawJson`.

    Raises ValueError when the value is not a snapshot.
    """
    head, newline, messages = value.partition(b"\n")
    try:
        snapshot = orjson.loads(head)
    except orjson.JSONDecodeError as exc:
        raise ValueError(f"not JSON: {exc}") from None
    if not isinstance(snapshot, dict):
        raise ValueError("not a JSON object")
    for key in ("trace_id", "org", "project"):
        if not isinstance(snapshot.get(key), str):
            raise ValueError(f"{key} is not a string")
    if newline:
        if not (messages.startswith(b"[") and messages.endswith(b"]")):
            raise ValueError("the second line is not a list of messages")
        snapshot["messages"] = RawJson(messages)
    elif not snapshot.get("deleted"):
        raise ValueError("a live snapshot without messages")
    return snapshot
