"""The review queue's rule (labeling/review.py) and when labelers see the evaluators' verdict
(labeling/evaluations.py)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rl_export.labeling.evaluations import evaluations_shown, hide_evaluations
from rl_export.labeling.review import ReviewScope, review_space
from rl_export.labeling.settings import LabelingSettings
from tests.records import record


@pytest.mark.parametrize(
    ("setting", "labeled", "shown"),
    [("after_label", False, False), ("after_label", True, True), ("always", False, True),
     ("never", True, False)],
)  # fmt: skip
def test_the_evaluators_show_as_the_setting_says(setting: str, labeled: bool, shown: bool) -> None:
    assert evaluations_shown(setting, labeled) is shown  # type: ignore[arg-type]


def test_hidden_evaluations_leave_no_verdict() -> None:
    hidden = hide_evaluations(record("t", source="evaluator", reward=0.9, passed=True))
    assert (hidden["evaluation"], hidden["evaluator_scores"]) == (None, None)
    assert (hidden["reward"], hidden["passed"]) == (None, None)  # the evaluator's reward, too
    traces = hide_evaluations(record("t", source=None, reward=None, passed=None))
    assert traces["evaluation"] is None
    assert traces["messages"] == record("t")["messages"]


@given(
    labels=st.integers(0, 4),
    spread=st.one_of(st.none(), st.sampled_from([0.0, 0.05, 0.3, 0.6])),
    adjudicated=st.booleans(),
    setting=st.sampled_from([None, 0.0, 0.3]),
    asked=st.sampled_from([None, 0.05, 0.5]),
)
def test_the_queue_holds_disputed_undecided_traces(
    labels: int, spread: float | None, adjudicated: bool, setting: float | None,
    asked: float | None,
) -> None:  # fmt: skip
    """:meth:`ReviewScope.holds` is the rule written out (the SQL is held to it by the
    browser and API tests, over the index)."""
    scope = ReviewScope.of(LabelingSettings(adjudicate_spread=setting), asked)
    bound = asked if asked is not None else setting
    expected = labels >= 2 and not adjudicated and spread is not None and (
        spread > 0 if bound is None else spread >= bound)  # fmt: skip
    assert scope.holds(labels, spread, adjudicated) is expected
    where, params = scope.sql()
    assert "adjudication IS NULL" in where
    assert params == ([] if bound is None else [bound])


def test_review_places_are_a_key_space_of_their_own() -> None:
    assert review_space("bot") == "bot/review"  # a project name has no slash
