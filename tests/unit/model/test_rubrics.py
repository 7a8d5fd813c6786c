"""A project's rubric (docs/guides/rubrics.md): what a rubric may be, which answers fit it, and
a label's reward, checked against a computation of the rule written out here."""

from __future__ import annotations

from fractions import Fraction
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from rl_export.model.rubrics import (
    VERSION_0,
    BooleanQuestion,
    ChoiceQuestion,
    KnownRubrics,
    RatingQuestion,
    RubricSpec,
    TextQuestion,
    check_answers,
    label_reward,
    numeric_answers,
)

ALL_KINDS: dict[str, Any] = {
    "guidelines": "# Rate\n\nBe **fair**.",
    "questions": [
        {"name": "quality", "title": "Quality", "kind": "rating", "min": 1, "max": 4,
         "weight": 2, "levels": {"1": "Broken", "4": {"title": "Great", "description": "ok"}}},
        {"name": "tone", "title": "Tone", "kind": "choice", "options": [
            {"value": "rude", "title": "Rude", "reward": 0},
            {"value": "neutral", "title": "Neutral", "reward": 0.5},
            {"value": "warm", "title": "Warm", "reward": 1}]},
        {"name": "solved", "title": "Solved?", "kind": "boolean", "weight": 0.5},
        {"name": "notes", "title": "Notes", "kind": "text"},
    ],
}  # fmt: skip


def spec() -> RubricSpec:
    return RubricSpec.model_validate(ALL_KINDS)


def test_version_0_gives_todays_reward_sum_over_20() -> None:
    answers = {"correctness": 4, "helpfulness": 3, "efficiency": 5, "safety": 4}
    assert label_reward(VERSION_0, answers) == Fraction(16, 20)
    assert check_answers(VERSION_0, answers) is None


@given(st.lists(st.integers(1, 5), min_size=4, max_size=4))
def test_version_0_reward_is_the_ratings_sum_over_20_for_any_ratings(ratings: list[int]) -> None:
    answers = dict(
        zip(("correctness", "helpfulness", "efficiency", "safety"), ratings, strict=True)
    )
    assert label_reward(VERSION_0, answers) == Fraction(sum(ratings), 20)


def test_a_rubric_of_every_kind_scores_by_weight_over_weighted_maxima() -> None:
    rubric = spec()
    answers = {"quality": 3, "tone": "neutral", "solved": True, "notes": "fine"}
    assert check_answers(rubric, answers) is None
    # (2*3 + 1*0.5 + 0.5*1) / (2*4 + 1*1 + 0.5*1); the text is not scored.
    assert label_reward(rubric, answers) == Fraction(7, 1) / Fraction(19, 2)
    assert numeric_answers(rubric, answers) == {
        "quality": 3,
        "tone": 0.5,
        "solved": 1,
        "notes": None,
    }


def test_unanswered_optional_questions_leave_both_sums() -> None:
    rubric = RubricSpec.model_validate(
        {"questions": [
            {"name": "a", "title": "A", "kind": "rating", "min": 0, "max": 2},
            {"name": "b", "title": "B", "kind": "boolean", "required": False, "weight": 3},
        ]}
    )  # fmt: skip
    assert label_reward(rubric, {"a": 1}) == Fraction(1, 2)
    assert label_reward(rubric, {"a": 1, "b": False}) == Fraction(1, 5)


@pytest.mark.parametrize(
    ("answers", "problem"),
    [
        ({"tone": "warm", "solved": True}, "rubric.quality: required"),
        ({"quality": 5, "tone": "warm", "solved": True}, "rubric.quality: 5 is outside 1..4"),
        ({"quality": True, "tone": "warm", "solved": True}, "rubric.quality: a rating is"),
        ({"quality": 2, "tone": "hot", "solved": True}, "rubric.tone: not one of the options"),
        ({"quality": 2, "tone": "warm", "solved": 1}, "rubric.solved: true or false"),
        ({"quality": 2, "tone": "warm", "solved": True, "notes": 3}, "rubric.notes: a text"),
        ({"quality": 2, "tone": "warm", "solved": True, "x": 1}, "rubric.x: not a question"),
    ],
)
def test_answers_that_do_not_fit_say_where(answers: dict[str, Any], problem: str) -> None:
    found = check_answers(spec(), answers)
    assert found is not None
    assert found.startswith(problem)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda r: r["questions"].append(dict(r["questions"][0])), "unique"),
        (lambda r: r["questions"][0].update(min=5, max=5), "below max"),
        (lambda r: r["questions"][0].update(min=0, max=11), "at most 11"),
        (lambda r: r["questions"][0].update(levels={"9": "x"}), "outside"),
        (lambda r: r["questions"][1]["options"][0].pop("reward"), "every option a reward"),
        (lambda r: r["questions"][0].update(name="Bad Name"), "name"),
        (lambda r: r.update(questions=[r["questions"][3]]), "at least one question must be"),
        (lambda r: r["questions"][0].update(kind="slider"), "kind"),
    ],
)
def test_a_rubric_that_cannot_work_is_refused(change: Any, message: str) -> None:
    import copy

    value = copy.deepcopy(ALL_KINDS)
    change(value)
    with pytest.raises(ValidationError, match=message):
        RubricSpec.model_validate(value)


def test_every_rubric_has_a_scored_required_question_so_every_label_has_a_reward() -> None:
    only_optional = {
        "questions": [{"name": "a", "title": "A", "kind": "boolean", "required": False}]
    }
    with pytest.raises(ValidationError, match="at least one"):
        RubricSpec.model_validate(only_optional)
    zero_weight = {"questions": [{"name": "a", "title": "A", "kind": "boolean", "weight": 0}]}
    with pytest.raises(ValidationError, match="at least one"):
        RubricSpec.model_validate(zero_weight)


# --- generated rubrics and answers -----------------------------------------------------------

NAMES = st.from_regex(r"[a-z][a-z0-9_]{0,6}", fullmatch=True)


@st.composite
def rubrics_and_answers(draw: st.DrawFn) -> tuple[RubricSpec, dict[str, Any]]:
    names = draw(st.lists(NAMES, min_size=1, max_size=6, unique=True))
    questions: list[Any] = []
    answers: dict[str, Any] = {}
    for n, name in enumerate(names):
        kind = (
            "rating" if n == 0 else draw(st.sampled_from(["rating", "choice", "boolean", "text"]))
        )
        weight = draw(st.sampled_from([0.0, 0.25, 1.0, 2.0, 3.5])) if n else 1.0
        required = True if n == 0 else draw(st.booleans())
        base = {"name": name, "title": name, "weight": weight, "required": required}
        if kind == "rating":
            low = draw(st.integers(0, 5))
            high = draw(st.integers(low + 1, low + 10))
            questions.append(RatingQuestion(**base, min=low, max=high))
            value: Any = draw(st.integers(low, high))
        elif kind == "choice":
            rewards = draw(st.lists(st.floats(0, 1, allow_nan=False), min_size=2, max_size=4))
            scored = draw(st.booleans())
            options = [{"value": f"o{k}", "title": f"O{k}", "reward": r if scored else None}
                       for k, r in enumerate(rewards)]  # fmt: skip
            questions.append(ChoiceQuestion(**base, options=options))
            value = f"o{draw(st.integers(0, len(rewards) - 1))}"
        elif kind == "boolean":
            questions.append(BooleanQuestion(**base))
            value = draw(st.booleans())
        else:
            questions.append(TextQuestion(**base))
            value = draw(st.text(max_size=20))
        if required or draw(st.booleans()):
            answers[name] = value
    return RubricSpec(questions=questions), answers


@settings(max_examples=300)
@given(rubrics_and_answers())
def test_the_reward_is_the_rule_written_out(case: tuple[RubricSpec, dict[str, Any]]) -> None:
    """Sum of weight x value over sum of weight x maximum, over answered scored questions."""
    rubric, answers = case
    assert check_answers(rubric, answers) is None
    top = bottom = Fraction(0)
    for q in rubric.questions:
        if q.name not in answers:
            continue
        value = answers[q.name]
        if isinstance(q, RatingQuestion):
            v, most = Fraction(value), Fraction(q.max)
        elif isinstance(q, BooleanQuestion):
            v, most = Fraction(int(value)), Fraction(1)
        elif isinstance(q, ChoiceQuestion) and q.options[0].reward is not None:
            reward = next(o.reward for o in q.options if o.value == value)
            v, most = Fraction(reward), Fraction(1)  # type: ignore[arg-type]
        else:
            continue
        top += Fraction(q.weight) * v
        bottom += Fraction(q.weight) * most
    assert label_reward(rubric, answers) == top / bottom
    assert 0 <= label_reward(rubric, answers) <= 1


def test_known_rubrics_keep_version_0_and_forget_the_oldest_past_their_limit() -> None:
    known = KnownRubrics(limit=2)
    assert known.spec("a", "b", 0) is VERSION_0
    for version in (1, 2, 3):
        known.add("a", "b", version, spec())
    assert ("a", "b", 1) not in known
    assert ("a", "b", 3) in known
    assert ("a", "b", 0) in known
