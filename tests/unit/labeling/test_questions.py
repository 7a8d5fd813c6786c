"""Agreement per question within one rubric version (labeling/questions.py): each question's
alpha by its kind equals the ``krippendorff`` package's on the same answers (generated), text
gets none, other versions and adjudications stay out."""

from __future__ import annotations

import math
from typing import Any

import krippendorff
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rl_export.labeling.questions import QuestionsBuilder
from rl_export.model.rubrics import RubricSpec, label_reward
from tests.unit.model.test_rubrics import ALL_KINDS

SPEC = RubricSpec.model_validate(ALL_KINDS)  # quality 1..4, tone (3 options), solved, notes
LABELERS = ("ana", "bo", "cy", "dee")
TONES = ("rude", "neutral", "warm")


def entry(
    labeler: str, answers: dict[str, Any], version: int = 1, kind: str = "label"
) -> dict[str, Any]:
    return {"labeler": labeler, "rubric": None, "comment": None,
            "occurred_at": "2026-01-01T00:00:00Z", "rubric_version": version, "kind": kind,
            "answers": answers, "reward": None}  # fmt: skip


answer_sets = st.fixed_dictionaries(
    {"quality": st.integers(1, 4), "tone": st.sampled_from(TONES)},
    optional={"solved": st.booleans(), "notes": st.text(max_size=3)},
)
traces = st.lists(
    st.lists(answer_sets, min_size=1, max_size=len(LABELERS)), min_size=0, max_size=25
)


def package(table: list[list[float]], level: str) -> float | None:
    """krippendorff's alpha of a labelers x traces table (NaN: no answer); None when it is
    undefined (fewer than two pairable traces, or no variation)."""
    data = np.asarray(table, dtype=float)
    pairable = data[:, (~np.isnan(data)).sum(axis=0) >= 2]
    if pairable.shape[1] < 2:
        return None
    values = pairable[~np.isnan(pairable)]
    if len(np.unique(values)) < 2:
        return None
    return float(krippendorff.alpha(pairable, level_of_measurement=level))


@settings(max_examples=60, deadline=None)
@given(traces)
def test_each_questions_alpha_is_the_packages(labels: list[list[dict[str, Any]]]) -> None:
    builder = QuestionsBuilder()
    for n, answers in enumerate(labels):
        entries = [entry(LABELERS[k], a) for k, a in enumerate(answers)]
        entries.append(entry("other-version", {"quality": 1}, version=2))  # never compared
        entries.append(entry("rev", {"quality": 4, "tone": "warm"}, kind="adjudication"))
        builder.add({"trace_id": f"t{n}", "human_labels": entries})
    report = builder.report(1, SPEC, resamples=20)
    assert report.rubric_version == 1
    assert report.multi_labeled == sum(len(a) >= 2 for a in labels)
    assert builder.adjudicated == len(labels)
    codes = {
        "quality": ("ordinal", lambda a: a.get("quality")),
        "tone": ("nominal", lambda a: TONES.index(a["tone"]) if "tone" in a else None),
        "solved": ("nominal", lambda a: None if "solved" not in a else int(a["solved"])),
    }
    for name, (level, code) in codes.items():
        table = [[math.nan] * len(labels) for _ in LABELERS]
        for n, answers in enumerate(labels):
            if len(answers) < 2:
                continue  # a trace one label of the version answered is no unit of the version
            for k, a in enumerate(answers):
                value = code(a)
                if value is not None:
                    table[k][n] = value
        found = report.questions[name]
        assert found.level == level
        expected = package(table, level)
        if expected is None:
            assert found.alpha is None
        else:
            assert found.alpha == pytest.approx(expected, abs=1e-9)
    assert report.questions["notes"].level is None
    assert report.questions["notes"].alpha is None
    rewards = [[math.nan] * len(labels) for _ in LABELERS]
    for n, answers in enumerate(labels):
        if len(answers) >= 2:
            for k, a in enumerate(answers):
                rewards[k][n] = float(label_reward(SPEC, a))
    expected = package(rewards, "interval")
    if expected is None:
        assert report.reward.alpha is None
    else:
        assert report.reward.alpha == pytest.approx(expected, abs=1e-9)


def test_the_newest_version_with_a_shared_trace_is_the_default() -> None:
    builder = QuestionsBuilder()
    builder.add({"human_labels": [entry("ana", {"quality": 1}, 3)]})  # alone: no unit
    builder.add({"human_labels": [entry("ana", {"quality": 1}, 2), entry("bo", {"quality": 2}, 2)]})
    assert builder.newest() == 2
    assert QuestionsBuilder().newest() == 0
