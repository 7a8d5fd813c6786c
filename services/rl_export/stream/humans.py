"""The human side of a trace's record: its current labels, their rewards and the human reward
(docs/concepts/join-rules.md), for labels of any rubric version. Pure.

* A label's reward is its rubric version's rule (:func:`rl_export.model.rubrics.label_reward`):
  for version 0, its four ratings summed / 20.
* The human reward is the mean of the current labels' rewards, from exact fractions, so the
  result does not depend on their order; an adjudication (a reviewer's decision, ``kind:
  adjudication``) replaces it, and ``passed``, with its own while it is current. ``passed`` is
  reward >= the human pass threshold.
* ``rubric`` is the per-question mean of the numeric answers of the current labels of the
  newest label's version (null for a question none of them answered with a number).
* ``human_labels`` has one entry per current label (and the adjudication), sorted by labeler:
  ``{labeler, rubric, comment, occurred_at}``, plus ``rubric_version``, ``kind``, ``answers``
  and ``reward`` where the label is not a version-0 rating label (absent otherwise, so records
  of version-0 labels keep their bytes).

Version-0 rating labels, the join's hot path, are summed as integers exactly as before rubrics
(:func:`human_reward`'s first branch). A label whose version the join cannot find (its object
deleted from the store: versions are never deleted by rl-export) is listed with its answers
but has no reward and counts in no mean.
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction
from typing import Any

from rl_export.model.events import format_micros
from rl_export.model.rubrics import (
    V0_NAMES,
    KnownRubrics,
    RubricSpec,
    label_reward,
    numeric_answers,
)

RUBRIC_DIMENSIONS = V0_NAMES

# (occurred_at in microseconds since the epoch, event_id): total order of "latest".
OrderKey = tuple[int, str]


@dataclass(slots=True)
class LabelView:
    """A labeler's latest label event: a version-0 rating label's four ``rubric`` ratings, or
    another version's (or an adjudication's) ``answers``; neither when it was a retraction."""

    key: OrderKey
    rubric: tuple[int, int, int, int] | None
    comment: str | None = None
    answers: dict[str, Any] | None = None
    version: int = 0

    @property
    def current(self) -> bool:
        """The label counts (it is not a retraction)."""
        return self.rubric is not None or self.answers is not None


Adjudication = tuple[str, LabelView]
"""The trace's current adjudication: the reviewer and their decision."""


@dataclass(frozen=True, slots=True)
class Scope:
    """Where the labels' rubric versions are looked up: the trace's project."""

    org: str
    project: str
    rubrics: KnownRubrics

    def spec(self, view: LabelView) -> RubricSpec | None:
        return self.rubrics.spec(self.org, self.project, view.version)


def _reward(view: LabelView, scope: Scope) -> Fraction | None:
    if view.rubric is not None:
        return Fraction(sum(view.rubric), 20)
    spec = scope.spec(view)
    if spec is None or view.answers is None:
        return None
    return label_reward(spec, view.answers)


def plain(labels: dict[str, LabelView], adjudication: Adjudication | None) -> bool:
    """Whether a trace's labels are all version-0 rating labels (or retractions), with no
    adjudication: the join's hot path, scored exactly as before rubrics."""
    return adjudication is None and not [1 for v in labels.values() if v.answers is not None]


def human_reward(
    labels: dict[str, LabelView], adjudication: Adjudication | None, threshold: float,
    scope: Scope | None,
) -> dict[str, Any] | None:  # fmt: skip
    """Human reward, rubric means, pass flag and labelers over the current labels (None: no
    label and no adjudication). ``scope`` None: the labels are :func:`plain`."""
    if scope is None:  # version-0 rating labels only: integer sums, as before rubrics
        ratings = [v.rubric for v in labels.values() if v.rubric is not None]
        if not ratings:
            return None
        n = len(ratings)
        sums = [sum(r[i] for r in ratings) for i in range(4)]
        reward = sum(sums) / (20 * n)
        return {
            "reward": reward,
            "passed": reward >= threshold,
            "rubric": {d: s / n for d, s in zip(RUBRIC_DIMENSIONS, sums, strict=True)},
            "labelers": sorted(k for k, v in labels.items() if v.rubric is not None),
        }
    current = [(labeler, v) for labeler, v in labels.items() if v.current]
    rewards = [r for _, v in current if (r := _reward(v, scope)) is not None]
    decision = None if adjudication is None else _reward(adjudication[1], scope)
    if decision is not None:
        exact: Fraction | None = decision
    elif rewards:
        exact = sum(rewards, Fraction(0)) / len(rewards)
    else:
        exact = None
    if exact is None and not current:
        return None
    value = None if exact is None else float(exact)
    return {
        "reward": value,
        "passed": None if value is None else value >= threshold,
        "rubric": _means([v for _, v in current], scope),
        "labelers": sorted(labeler for labeler, _ in current),
    }


def _means(current: list[LabelView], scope: Scope) -> dict[str, float | None] | None:
    """Per question, the mean of the numeric answers of the labels of the newest label's
    version; None when there is no label (or the newest label's version is unknown)."""
    if not current:
        return None
    version = max(current, key=lambda v: v.key).version
    if version == 0:
        ratings = [v.rubric for v in current if v.rubric is not None]
        return {
            d: sum(r[i] for r in ratings) / len(ratings) for i, d in enumerate(RUBRIC_DIMENSIONS)
        }
    spec = scope.rubrics.spec(scope.org, scope.project, version)
    if spec is None:
        return None
    values = [numeric_answers(spec, v.answers or {}) for v in current if v.version == version]
    out: dict[str, float | None] = {}
    for q in spec.questions:
        found = [Fraction(x[q.name]) for x in values if x[q.name] is not None]  # type: ignore[arg-type]
        out[q.name] = float(sum(found, Fraction(0)) / len(found)) if found else None
    return out


def label_details(
    labels: dict[str, LabelView], adjudication: Adjudication | None, scope: Scope | None
) -> list[dict[str, Any]]:
    """The records' ``human_labels``: each current label (and the adjudication) as
    submitted, sorted by labeler (an adjudication before a label of the same person).
    ``scope`` None: the labels are :func:`plain`."""
    if scope is None:
        return [  # version-0 rating labels only: the join's hot path, as before rubrics
            {
                "labeler": labeler,
                "rubric": dict(zip(RUBRIC_DIMENSIONS, view.rubric, strict=True)),
                "comment": view.comment,
                "occurred_at": format_micros(view.key[0]),
            }
            for labeler, view in sorted(labels.items())
            if view.rubric is not None
        ]
    entries = [
        (labeler, "label", view) for labeler, view in labels.items() if view.current
    ]  # fmt: skip
    if adjudication is not None:
        entries.append((adjudication[0], "adjudication", adjudication[1]))
    return [_detail(labeler, kind, view, scope) for labeler, kind, view in sorted(
        entries, key=lambda e: (e[0], e[1]))]  # fmt: skip


def _detail(labeler: str, kind: str, view: LabelView, scope: Scope) -> dict[str, Any]:
    occurred_at = format_micros(view.key[0])
    if view.rubric is not None and kind == "label":
        ratings = dict(zip(RUBRIC_DIMENSIONS, view.rubric, strict=True))
        return {"labeler": labeler, "rubric": ratings, "comment": view.comment,
                "occurred_at": occurred_at}  # fmt: skip
    answers = view.answers or {}
    spec = scope.spec(view)
    reward = _reward(view, scope)
    return {
        "labeler": labeler,
        "rubric": None if spec is None else numeric_answers(spec, answers),
        "comment": view.comment,
        "occurred_at": occurred_at,
        "rubric_version": view.version,
        "kind": kind,
        "answers": answers,
        "reward": None if reward is None else float(reward),
    }


def versions_of(labels: dict[str, LabelView], adjudication: Adjudication | None) -> set[int]:
    """The rubric versions other than 0 that the current labels and adjudication name."""
    found = {v.version for v in labels.values() if v.answers is not None and v.version}
    if adjudication is not None and adjudication[1].version:
        found.add(adjudication[1].version)
    return found


def entries_reward(entries: list[dict[str, Any]], scope: Scope) -> Fraction | None:
    """The human reward of a record's ``human_labels`` (each label's reward again from its
    answers, exactly), as :func:`human_reward` gives it; None when nothing is scored."""
    rewards: list[Fraction] = []
    decision: Fraction | None = None
    for entry in entries:
        kind = entry.get("kind", "label")
        if "answers" in entry:
            view = LabelView((0, ""), None, None, entry["answers"], entry["rubric_version"])
        else:
            r = entry["rubric"]
            view = LabelView((0, ""), (r["correctness"], r["helpfulness"], r["efficiency"],
                                       r["safety"]))  # fmt: skip
        reward = _reward(view, scope)
        if kind == "adjudication":
            decision = reward
        elif reward is not None:
            rewards.append(reward)
    if decision is not None:
        return decision
    return sum(rewards, Fraction(0)) / len(rewards) if rewards else None


def record_versions(record: dict[str, Any]) -> set[int]:
    """The rubric versions other than 0 a record's ``human_labels`` name."""
    return {
        e["rubric_version"] for e in record.get("human_labels") or ()
        if isinstance(e, dict) and e.get("rubric_version")
    }  # fmt: skip
