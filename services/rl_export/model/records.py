"""Output records (docs/guides/exports.md): the ``trajectory`` format and its tombstone.

These models are the contract trainers read; ``schemas/`` holds their JSON Schemas, generated
by :mod:`rl_export.formats.schemas` and checked against these models by the test suite.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, model_validator

from rl_export.model.codec import RawJson
from rl_export.model.events import EvaluatorResult, Report, UtcDatetime
from rl_export.model.pairs import COMPARISONS, ComparisonEntry
from rl_export.model.rubrics import V0_NAMES

RULES_VERSION = 1
"""Bumped whenever a join or reward rule changes meaning, so records say which rules made them."""

ERASED_REVISION = 1 << 62
"""The revision of a deleted trace's tombstone (``trace.deleted``): newer than any record's,
on whichever chain it is (a replay's, another run's), so the deletion wins over every
revision of the trace wherever it came from (docs/concepts/join-rules.md)."""

RewardSource = Literal["human", "evaluator"]


def _parsed(value: Any) -> Any:
    """Records carry messages as :class:`RawJson`; validate the value they stand for."""
    return value.value() if isinstance(value, RawJson) else value


class _Record(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


RubricMean = dict[str, float | None]
"""Per question, the mean of the numeric answers of the current labels of the newest label's
rubric version (version 0: ``correctness``, ``helpfulness``, ``efficiency``, ``safety``, each
1.0..5.0); null for a question none of them answered with a number (a text)."""


class LabelDetail(_Record):
    """One current human label as submitted: who, its answers as numbers (``rubric``: a
    version-0 label's four ratings), the comment, when; for a label of another rubric version
    than 0, or an adjudication, also its version, kind, answers as given, and reward."""

    labeler: str
    rubric: dict[str, float | None] | None = Field(
        description="Each question's answer as a number (a rating's value, a boolean's 1 or "
        "0, a scored choice's reward), null where it has none; version 0: the four ratings."
    )
    comment: str | None
    occurred_at: UtcDatetime
    rubric_version: int | None = Field(
        None, ge=0, description="Absent for a version-0 rating label (docs/guides/rubrics.md)."
    )
    kind: Literal["label", "adjudication"] | None = Field(
        None, description="adjudication: a reviewer's decision, which is the human reward."
    )
    answers: dict[str, bool | int | str] | None = Field(
        None, description="The answers as given, by question name."
    )
    reward: float | None = Field(None, ge=0, le=1, description="This label's own reward.")

    @model_validator(mode="after")
    def _version_0(self) -> LabelDetail:
        """A version-0 rating label's ``rubric`` holds the four ratings, integers 1..5."""
        if self.answers is None:
            ratings = self.rubric or {}
            if sorted(ratings) != sorted(V0_NAMES) or not all(
                v is not None and v == int(v) and 1 <= v <= 5 for v in ratings.values()
            ):
                raise ValueError("a version-0 label's rubric is its four ratings, 1..5")
        return self


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
    human_labels: list[LabelDetail] = Field(
        description="Each current label, sorted by labeler ([] when unlabeled). Schema "
        "version 2 named it `labels` (read as this field); records written before schema "
        "version 2 lack it: unknown, not empty."
    )
    metadata: dict[str, Any] = Field(
        description="The trace's metadata object as received (string values redacted like "
        "other free text). Records written before the join kept it lack the field: unknown, "
        "not empty."
    )
    comparisons: list[ComparisonEntry] | None = Field(
        None, description="The trace's current comparisons (docs/guides/comparisons.md); "
        "absent when it has none."
    )  # fmt: skip


class Tombstone(_Record):
    """A deleted (or no longer ready) trajectory: it hides every earlier revision."""

    trace_id: str
    org: str
    project: str
    reward_source: RewardSource | Literal["comparisons"] | None
    revision: int = Field(ge=1)
    deleted: Literal[True] = True


CorpusSource = RewardSource | Literal["comparisons"] | None
"""A corpus's reward source: ``human``, ``evaluator``, None for the ``traces`` corpus, or
``comparisons`` (pair records: a trace's snapshot is never ready for it)."""


def render(snapshot: dict[str, Any], source: CorpusSource) -> dict[str, Any] | None:
    """Render a join snapshot as the ``trajectory`` record of one corpus.

    Returns the tombstone of a deleted trace, the record when the trajectory is ready for
    ``source`` (always, for the ``traces`` corpus), or None when it is not ready. The sink
    writes a tombstone when a trajectory it holds stops being ready.
    """
    if snapshot["deleted"]:
        return tombstone(snapshot, source)
    scored = _scored(snapshot, source)
    if scored is None:
        return None
    return {k: scored[k] if k in scored else snapshot[k] for k in record_fields(snapshot)}


def record_fields(snapshot: dict[str, Any]) -> list[str]:
    """The record's fields of a snapshot: all of them, but ``human_labels`` or ``metadata``
    when the snapshot was made from a state or record kept before the field existed (unknown
    there, not empty), and ``comparisons`` when the trace has none."""
    return _FIELD_LISTS[HUMAN_LABELS in snapshot, "metadata" in snapshot, COMPARISONS in snapshot]


# --- record schema 3: ``labels`` became ``human_labels`` -----------------------------------

HUMAN_LABELS = "human_labels"
LEGACY_LABELS = "labels"
"""Record schema 2's name of ``human_labels`` (Hugging Face trainers take a ``labels`` column
for their own loss labels, so schema 3 renamed it). Readers map it: :func:`upgrade_record`,
:func:`upgrade_lines`."""
LEGACY_KEY = b',"labels":['
HUMAN_KEY = b',"human_labels":['
LEGACY_KEY_RE = re.compile(re.escape(LEGACY_KEY))
"""Finds schema 2's key in JSON Lines text (also in a memoryview, which has no ``find``)."""
_BEFORE_LABELS = re.compile(rb'"rules_version":\d+$')


def upgrade_record(record: dict[str, Any]) -> dict[str, Any]:
    """A record of schema 2 (``labels``) as schema 3 (``human_labels``), in place; any other
    record or row as it is. Returns it."""
    if LEGACY_LABELS in record and HUMAN_LABELS not in record and "trace_id" in record:
        record[HUMAN_LABELS] = record.pop(LEGACY_LABELS)
    return record


def upgrade_line(line: bytes) -> bytes:
    """One JSON Lines record line of schema 2 with its ``labels`` key renamed
    ``human_labels`` (the key is the record's last, right after ``rules_version``); any
    other line as it is."""
    at = line.rfind(LEGACY_KEY)
    if at < 0 or _BEFORE_LABELS.search(line, 0, at) is None:
        return line
    return line[:at] + HUMAN_KEY + line[at + len(LEGACY_KEY) :]


def upgrade_lines(data: bytes | memoryview) -> bytes | memoryview:
    """JSON Lines text with every schema-2 record line upgraded (:func:`upgrade_line`); the
    text itself when none holds the old key (one search, no copy)."""
    if LEGACY_KEY_RE.search(data) is None:
        return data
    text = bytes(data)
    return b"\n".join(upgrade_line(line) for line in text.split(b"\n"))


# The scored fields of the ``traces`` corpus, which has no reward source.
UNSCORED: dict[str, Any] = {"reward_source": None, "reward": None, "passed": None}


def _scored(snapshot: dict[str, Any], source: CorpusSource) -> dict[str, Any] | None:
    """The fields in which the corpora's records of a live snapshot differ, or None when the
    snapshot is not ready for ``source``."""
    if source is None:
        return dict(UNSCORED)
    reward = snapshot[source] if source != COMPARISONS else None
    if reward is None:
        return None
    return {"reward_source": source, "reward": reward["reward"], "passed": reward["passed"]}


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


# The record's fields, in the documented order (docs/reference/schemas.md).
RECORD_FIELDS = list(TrajectoryRecord.model_fields)
RECORD_KEYS = frozenset(RECORD_FIELDS)
_FIELD_LISTS = {
    (labels, metadata, compared): [
        k for k in RECORD_FIELDS if (k != HUMAN_LABELS or labels)
        and (k != "metadata" or metadata) and (k != COMPARISONS or compared)
    ]
    for labels in (False, True) for metadata in (False, True) for compared in (False, True)
}  # fmt: skip
