"""The HTTP API's request and response bodies (DESIGN.md section 7), as pydantic models.

The OpenAPI document at ``/api/v1/openapi.json`` is generated from these and the routes'
signatures. Request bodies forbid unknown fields: a ``labeler`` in a label is a 422, since the
labeler is always the token's subject.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, get_args

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field

from rl_export.common.events import Rubric
from rl_export.common.formats import JSONL_FORMATS, TABULAR_FORMATS
from rl_export.export import SOURCES

Source = Literal["human", "evaluator", "traces"]
Format = Literal[
    "trajectory", "prompt_completion", "messages", "kto", "preference", "executions",
    "csv", "json", "parquet", "zip",
]  # fmt: skip
# The API's enums are the export package's lists (the OpenAPI document needs literals).
assert set(get_args(Format)) == set(JSONL_FORMATS + TABULAR_FORMATS)
assert set(get_args(Source)) == set(SOURCES)

TRACE_ID_PATTERN = r"^[^\x00-\x1f\x7f]+$"
TraceId = Field(min_length=1, max_length=512, pattern=TRACE_ID_PATTERN)


class _In(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ErrorOut(BaseModel):
    """Every error: a short code and a sentence for people."""

    error: str = Field(examples=["invalid"])
    detail: str = Field(examples=["min-reward: 'abc' is not a number"])


class HistogramBin(BaseModel):
    lo: float
    hi: float
    count: int


class IndexState(BaseModel):
    """How current the answer is: this instance's index of the corpus."""

    ready: bool = Field(description="The index has read the corpus at least once.")
    lag_s: float = Field(description="Commits made within this many seconds may be missing.")
    indexed: int = Field(description="Live records the index holds for the corpus.")
    error: str | None = Field(None, description="The last problem reading the corpus, if any.")


class StatsOut(BaseModel):
    records: int
    avg_reward: float | None
    pass_rate: float | None
    human_labeled: int
    reward_histogram: list[HistogramBin]
    index: IndexState


class RecordsOut(BaseModel):
    items: list[dict[str, Any]]
    columns: list[str] | None = Field(
        None, description="The headers of a tabular format's rows, in order."
    )
    index: IndexState


class QueueOut(BaseModel):
    items: list[dict[str, Any]] = Field(description="Trajectory records of the traces corpus.")
    remaining: int = Field(description="Traces left in the caller's queue, these included.")
    index: IndexState


class LabelIn(_In):
    trace_id: str = TraceId
    rubric: Rubric
    comment: str | None = Field(None, max_length=10_000)


class SkipIn(_In):
    trace_id: str = TraceId


class AcceptedOut(BaseModel):
    event_id: str = Field(description="The published event's id (a UUID).")


def filter_text(value: Any) -> Any:
    """A filter's JSON value as the query string spells it: ``true`` -> ``"true"``, ``0.5``
    -> ``"0.5"``; lists item by item. Anything else is left for validation to refuse."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, list):
        return [filter_text(item) for item in value]
    return value


def _filters_text(value: Any) -> Any:
    if isinstance(value, dict):
        return {name: filter_text(item) for name, item in value.items()}
    return value


FilterValues = Annotated[dict[str, str | list[str]], BeforeValidator(_filters_text)]


class ExportIn(_In):
    source: Source
    format: Format
    filters: FilterValues = Field(
        default_factory=dict,
        description="Filters by their query parameter names, as JSON values or their text: "
        '{"passed": true, "min_reward": 0.5, "pass_dimension": ["goal"]}.',
    )
    columns: str | list[str] | None = Field(
        None, description="Tabular formats: PATH[:HEADER] items, in order."
    )


class JobOut(BaseModel):
    id: str
    status: Literal["processing", "ready", "failed"]
    progress: float = Field(ge=0, le=1)
    records: int | None = None
    error: str | None = None
    file_name: str | None = None
    download: str | None = Field(None, description="Where the finished file is (ready only).")
