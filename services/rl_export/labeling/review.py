"""Review: traces whose labels disagree, decided by a reviewer (docs/guides/rubrics.md). Pure.

The review queue holds the live traces with at least two current labels whose rewards differ
by at least a threshold (the request's ``min_spread``, else the project's
``adjudicate_spread``, else any difference at all) and no current adjudication, oldest first.
A reviewer (a token with the ``review`` scope, which ``admin`` does not imply) claims one at a
time, like the label queue: one place per trace, kept in the claims' slot chains under the
project's review space (:func:`review_space`), so two reviewers never decide the same trace
at once and labelers' places are untouched.

The decision is a ``label.submitted`` with ``kind: adjudication`` (answers to a rubric
version, like any label): while it is current it is the trace's human reward and verdict;
the labels stay in the record's ``human_labels`` and in the agreement report, which measures
the agreement before review.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from rl_export.labeling.settings import LabelingSettings

REVIEW_SPACE = "review"


def review_space(project: str) -> str:
    """The claims' project key of a project's review places (``<project>/review``: a key
    space of its own, which no project name, no slash in it, can take)."""
    return f"{project}/{REVIEW_SPACE}"


@dataclass(frozen=True)
class ReviewScope:
    """Which traces the review queue holds: labels that differ by ``min_spread`` or more
    (None: by anything at all)."""

    min_spread: float | None

    @classmethod
    def of(cls, settings: LabelingSettings, min_spread: float | None) -> ReviewScope:
        return cls(min_spread if min_spread is not None else settings.adjudicate_spread)

    def sql(self) -> tuple[str, list[Any]]:
        """The condition over the index's columns (``labels_count``, ``spread``,
        ``adjudication``)."""
        base = "NOT deleted AND coalesce(labels_count, 0) >= 2 AND adjudication IS NULL"
        if self.min_spread is None:
            return f"{base} AND spread > 0", []
        return f"{base} AND spread >= ?", [self.min_spread]

    def holds(self, labels: int, spread: float | None, adjudicated: bool) -> bool:
        """:meth:`sql` in Python, for a trace the corpora may not show right yet."""
        if labels < 2 or adjudicated or spread is None:
            return False
        return spread > 0 if self.min_spread is None else spread >= self.min_spread
