"""Agreement per question of one rubric version (docs/guides/rubrics.md), beside the report of
:mod:`rl_export.labeling.agreement`. Pure.

Labels are compared only with labels of the same rubric version: the report picks one (the
request's ``rubric_version``, else the newest version with a trace that two labels of it
share) and says which. Per question, by its kind:

* ``rating``: Krippendorff's alpha, **ordinal**, over the values ``min..max``;
* ``choice`` and ``boolean``: **nominal** alpha over the options (false, true);
* ``text``: none (``level`` null);

each over the traces where at least two labels of that version answered the question (its
``units``), with a bootstrap 95 % interval (1,000 resamples over traces, fixed seed), by
:func:`~rl_export.labeling.agreement.alpha_with_interval`, whose alphas the unit tests hold to
the ``krippendorff`` package's. ``reward`` is the **interval** alpha of each label's own reward
within the version. Adjudications are not labels: the report measures agreement before review,
and counts the adjudicated traces (``adjudicated``).

:class:`QuestionsBuilder` takes records one at a time (their ``human_labels``) and keeps the
answers of the traces with two labels or more of a version, so its memory follows the
multi-labeled traces, not the corpus.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict

from rl_export.labeling.agreement import RESAMPLES, SEED, Alpha, alpha_with_interval
from rl_export.model.rubrics import (
    V0_NAMES,
    BooleanQuestion,
    ChoiceQuestion,
    RatingQuestion,
    RubricSpec,
    label_reward,
)

QuestionLevel = Literal["ordinal", "nominal"]


class _Out(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class QuestionAlpha(_Out):
    """One question's agreement: its kind, the alpha's level (null for text), the alpha."""

    kind: str
    level: QuestionLevel | None
    alpha: float | None
    ci95: tuple[float, float] | None
    units: int


class ByQuestion(_Out):
    """The agreement of one rubric version's labels, question by question."""

    rubric_version: int
    multi_labeled: int  # traces with two labels or more of this version
    questions: dict[str, QuestionAlpha]
    reward: Alpha


Labels = list[tuple[str, dict[str, Any]]]  # (labeler, answers) of one trace and version


def label_answers(entry: Mapping[str, Any]) -> tuple[int, dict[str, Any]]:
    """A ``human_labels`` entry's rubric version and answers (version 0: its four ratings)."""
    if "answers" in entry:
        return int(entry["rubric_version"]), dict(entry["answers"])
    return 0, {d: entry["rubric"][d] for d in V0_NAMES}


class QuestionsBuilder:
    """The answers of multi-labeled traces, per rubric version, from records."""

    FIELDS = frozenset({"human_labels", "deleted"})

    def __init__(self) -> None:
        self.traces: dict[int, list[Labels]] = {}
        self.adjudicated = 0

    def add(self, record: Mapping[str, Any]) -> None:
        """Take one latest record (of the ``traces`` corpus, usually)."""
        entries = record.get("human_labels")
        if record.get("deleted") or not isinstance(entries, list):
            return
        by_version: dict[int, Labels] = {}
        for entry in entries:
            if entry.get("kind", "label") != "label":
                self.adjudicated += 1
                continue
            version, answers = label_answers(entry)
            by_version.setdefault(version, []).append((entry["labeler"], answers))
        for version, labels in by_version.items():
            if len(labels) >= 2:
                self.traces.setdefault(version, []).append(labels)

    def newest(self) -> int:
        """The newest version with a multi-labeled trace (0 when there is none)."""
        return max(self.traces, default=0)

    def report(
        self, version: int, spec: RubricSpec, *, resamples: int = RESAMPLES, seed: int = SEED
    ) -> ByQuestion:
        """The agreement of ``version``'s labels (``spec`` is that version)."""
        traces = self.traces.get(version, [])
        questions = {
            q.name: _question(q, traces, resamples=resamples, seed=seed) for q in spec.questions
        }
        return ByQuestion(rubric_version=version, multi_labeled=len(traces), questions=questions,
                          reward=_reward(spec, traces, resamples=resamples, seed=seed))  # fmt: skip


def _coded(question: Any, value: Any) -> int | None:
    """An answer as its code ``0 .. domain - 1`` (None: unanswered, or not comparable)."""
    if value is None:
        return None
    if isinstance(question, RatingQuestion):
        return int(value) - question.min
    if isinstance(question, BooleanQuestion):
        return int(bool(value))
    if isinstance(question, ChoiceQuestion):
        values = [o.value for o in question.options]
        return values.index(value) if value in values else None
    return None


def _domain(question: Any) -> int:
    if isinstance(question, RatingQuestion):
        return question.max - question.min + 1
    if isinstance(question, ChoiceQuestion):
        return len(question.options)
    return 2


def _pairable(traces: list[list[int | None]]) -> tuple[np.ndarray, np.ndarray]:
    """Units (traces with two values or more, numbered) and their values, as columns."""
    units: list[int] = []
    values: list[int] = []
    unit = 0
    for codes in traces:
        known = [c for c in codes if c is not None]
        if len(known) < 2:
            continue
        units += [unit] * len(known)
        values += known
        unit += 1
    return np.asarray(units, np.int64), np.asarray(values, np.int64)


def _question(question: Any, traces: list[Labels], *, resamples: int, seed: int) -> QuestionAlpha:
    kind = question.kind
    if kind == "text":
        return QuestionAlpha(kind=kind, level=None, alpha=None, ci95=None, units=0)
    level: QuestionLevel = "ordinal" if kind == "rating" else "nominal"
    coded = [[_coded(question, answers.get(question.name)) for _, answers in labels]
             for labels in traces]  # fmt: skip
    units, values = _pairable(coded)
    found = alpha_with_interval(units, values, _domain(question), level, resamples=resamples,
                                seed=seed)  # fmt: skip
    return QuestionAlpha(kind=kind, level=level, **found.model_dump())


def _reward(spec: RubricSpec, traces: list[Labels], *, resamples: int, seed: int) -> Alpha:
    """Interval alpha of each label's own reward (the distinct rewards as the scale)."""
    rewards = [[float(label_reward(spec, answers)) for _, answers in labels] for labels in traces]
    scale = np.asarray(sorted({r for rs in rewards for r in rs}), np.float64)
    index = {r: n for n, r in enumerate(scale.tolist())}
    units, values = _pairable([[index[r] for r in rs] for rs in rewards])
    return alpha_with_interval(units, values, max(len(scale), 1), "interval",
                               resamples=resamples, seed=seed, scale=scale)  # fmt: skip


def with_questions(
    report: dict[str, Any], builder: QuestionsBuilder, specs: Mapping[int, RubricSpec],
    version: int | None,
) -> dict[str, Any]:  # fmt: skip
    """The agreement report's JSON with ``adjudicated`` and ``by_question`` (for ``version``,
    else the newest version a trace's labels share; null when ``specs`` lacks it)."""
    chosen = builder.newest() if version is None else version
    spec = specs.get(chosen)
    by = None if spec is None else builder.report(chosen, spec).model_dump(mode="json")
    return {**report, "adjudicated": builder.adjudicated, "by_question": by}
