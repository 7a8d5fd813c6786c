"""Pairs of trajectories and their comparisons (docs/guides/comparisons.md): the pair's id,
a comparison as a trace's record lists it, and the ``comparisons`` corpus's pair record. Pure.

* A pair is two traces of one project, ``trace_a < trace_b``; its id is the first 16 hex
  characters of sha256(``trace_a`` + "\\n" + ``trace_b``) (:func:`pair_id`).
* A ``label.compared`` chooses ``a``, ``b``, ``tie`` or ``both_bad``; from one trace's side
  that is an *outcome*: ``win``, ``loss``, ``tie`` or ``both_bad`` (:func:`outcome`).
* A pair record (:class:`PairRecord`) holds the pair's current votes, the latest per labeler,
  and their counts. In the corpus it starts with the key every corpus row starts with,
  ``trace_id`` (here the pair's id), then ``org``, ``project``, ``reward_source``
  (``comparisons``) and ``revision``, so compaction, the latest view and ``shards verify``
  read it as they read any record; its tombstone is a record tombstone.
"""

from __future__ import annotations

import hashlib
from typing import Final, Literal

from pydantic import BaseModel, ConfigDict, Field

from rl_export.model.events import Choice, UtcDatetime

Outcome = Literal["win", "loss", "tie", "both_bad"]
COMPARISONS: Final = "comparisons"
"""The reward source, and default corpus, of pair records."""

_OUTCOMES: dict[tuple[str, bool], Outcome] = {
    ("a", True): "win", ("a", False): "loss", ("b", True): "loss", ("b", False): "win",
    ("tie", True): "tie", ("tie", False): "tie", ("both_bad", True): "both_bad",
    ("both_bad", False): "both_bad",
}  # fmt: skip


def pair_id(trace_a: str, trace_b: str) -> str:
    """The id of the pair ``(trace_a, trace_b)`` (``trace_a < trace_b``)."""
    return hashlib.sha256(f"{trace_a}\n{trace_b}".encode("utf-8", "surrogatepass")).hexdigest()[:16]


def ordered(first: str, second: str, choice: Choice) -> tuple[str, str, Choice]:
    """``(trace_a, trace_b, choice)`` of a choice made between ``first`` (shown as A) and
    ``second`` (B): the two sorted, ``a`` and ``b`` swapped when they were not in order."""
    if first < second:
        return first, second, choice
    swapped: dict[str, Choice] = {"a": "b", "b": "a"}
    return second, first, swapped.get(choice, choice)


def outcome(choice: str, side_a: bool) -> Outcome:
    """A choice as the outcome of one of the pair's traces (``side_a``: it is ``trace_a``)."""
    return _OUTCOMES[(choice, side_a)]


class _Record(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ComparisonEntry(_Record):
    """One current comparison of a trace, as its record lists it."""

    pair_id: str
    other: str = Field(description="The pair's other trace.")
    outcome: Outcome = Field(description="This trace's: won, lost, tied, or both bad.")
    labeler: str
    strength: int | None = Field(ge=1, le=3, description="1..3: how clearly; null: unsaid.")
    occurred_at: UtcDatetime


class Vote(_Record):
    """A labeler's current comparison of a pair, as the pair record keeps it."""

    labeler: str
    choice: Choice
    strength: int | None = Field(ge=1, le=3)
    answers: dict[str, bool | int | str] | None = Field(
        description="Answers to the project's rubric questions, with their rubric_version."
    )
    rubric_version: int | None = Field(ge=0)
    comment: str | None
    occurred_at: UtcDatetime


class PairRecord(_Record):
    """A record of the ``comparisons`` corpus: a pair and its current votes."""

    trace_id: str = Field(description="The pair's id: the key every corpus row starts with.")
    org: str
    project: str
    reward_source: Literal["comparisons"]
    revision: int = Field(ge=1, description="The pair's distinct events so far.")
    pair_id: str
    trace_a: str
    trace_b: str
    votes: list[Vote] = Field(description="The latest vote of each labeler, by labeler.")
    wins_a: int = Field(ge=0)
    wins_b: int = Field(ge=0)
    ties: int = Field(ge=0)
    both_bad: int = Field(ge=0)
    updated_at: UtcDatetime
