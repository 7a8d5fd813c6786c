"""Output records (DESIGN.md section 4): the ``trajectory`` format and its tombstone.

These models are the contract trainers read; ``schemas/`` holds their JSON Schemas, generated
by :mod:`rl_export.schemas` and checked against these models by the test suite.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from rl_export.events import EvaluatorResult, Report, UtcDatetime

RULES_VERSION = 1
"""Bumped whenever a join or reward rule changes meaning, so records say which rules made them."""

RewardSource = Literal["human", "evaluator"]


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
    messages: list[dict[str, Any]]
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
