"""The rows of each format as pydantic models: their JSON Schemas (``schemas/format.<name>.
schema.json``, :mod:`rl_export.formats.schemas`) and the columns a dataset card lists.

A chat format's row made for a chat template (``--chat-template``) may carry ``tools``: the
trace's tool schemas as JSON text (TRL parses a string ``tools`` column; Arrow could not hold
JSON Schemas of different shapes as one column type).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

Messages = list[dict[str, Any]]


class _Row(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


def _tools() -> Any:
    return Field(
        None,
        description="With a chat template (--chat-template), and when the trace has tools: "
        "its tool schemas (metadata.tools) as JSON text.",
    )


class PromptCompletionRow(_Row):
    """TRL conversational prompt/completion: the prompt ends with the last user turn."""

    prompt: Messages = Field(min_length=1)
    completion: Messages = Field(min_length=1)
    reward: float | None
    passed: bool | None
    trace_id: str
    tools: str | None = _tools()


class MessagesRow(_Row):
    """Chat SFT: the conversation in the export's chat style (``hf`` by default)."""

    messages: Messages
    tools: str | None = _tools()


class KtoRow(_Row):
    """TRL unpaired preference: ``label`` is the trajectory's ``passed``."""

    prompt: Messages = Field(min_length=1)
    completion: Messages = Field(min_length=1)
    label: bool
    tools: str | None = _tools()


class PreferenceRow(_Row):
    """TRL conversational preference: two trajectories with the same prompt (messages up to
    and including the first user turn); ``score_chosen > score_rejected``."""

    prompt: Messages = Field(min_length=1)
    chosen: Messages = Field(min_length=1)
    rejected: Messages = Field(min_length=1)
    score_chosen: float
    score_rejected: float
    trace_chosen: str
    trace_rejected: str
    tools: str | None = _tools()


class ExecutionsRow(_Row):
    """Compatible with AgentHub's ``executions.jsonl``: ``id``, ``conversation``, ``report``."""

    id: str
    conversation: Messages
    report: dict[str, Any]
    results: list[dict[str, Any]]
    reward: float | None
    passed: bool | None
    reward_source: str | None
    evaluator_scores: dict[str, float] | None
    rubric: dict[str, float] | None
    labels_count: int
    scenario: str
    agent_version: str
    org: str
    project: str
    revision: int
    completed_at: str
    updated_at: str


class VerlRewardModel(_Row):
    """How verl scores the rollouts of a prompt: a reward model, no ground truth."""

    style: Literal["model"]
    ground_truth: None


class RlPromptsExtra(_Row):
    """Where the prompt came from: its trace, and how that run did."""

    trace_id: str
    agent_version: str
    reward: float | None
    passed: bool | None
    index: int = Field(
        ge=0,
        lt=2**63,
        description="Derived from the trace id (the first 63 bits of its SHA-256): the same "
        "in every file, unique per trace.",
    )


class RlPromptsRow(_Row):
    """verl's RL data row: ``prompt`` is the messages up to and including the first user
    message; ``data_source`` the trace's scenario."""

    data_source: str
    prompt: Messages = Field(min_length=1)
    ability: Literal["agent"]
    reward_model: VerlRewardModel
    extra_info: RlPromptsExtra


class RewardPairsRow(_Row):
    """A reward model's pair (TRL's RewardTrainer, with ``margin``), of source comparisons
    only: the trace more people preferred, the other, and the mean strength (1..3) of the
    votes that preferred it (docs/guides/comparisons.md)."""

    prompt: Messages = Field(min_length=1)
    chosen: Messages = Field(min_length=1)
    rejected: Messages = Field(min_length=1)
    margin: float = Field(ge=1, le=3)


ROW_MODELS: dict[str, type[BaseModel]] = {
    "prompt_completion": PromptCompletionRow,
    "messages": MessagesRow,
    "kto": KtoRow,
    "preference": PreferenceRow,
    "executions": ExecutionsRow,
    "rl_prompts": RlPromptsRow,
    "reward_pairs": RewardPairsRow,
}
"""The row model of each format but ``trajectory`` (whose model is the record's)."""
