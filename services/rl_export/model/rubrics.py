"""A project's rubric (docs/guides/rubrics.md): its questions, the answers they take, and a
label's reward from them. Pure.

A rubric (:class:`RubricSpec`) holds the project's ``guidelines`` (Markdown, rendered by the
web service) and its ``questions``, each of a kind: ``rating`` (an integer ``min..max`` with a
title and a description per level), ``choice`` (one of its options, each with an optional
reward in 0..1), ``boolean`` or ``text``. Versions are numbered; version 0 is
:data:`VERSION_0`, the four 1..5 ratings every project had before rubrics, and a
``label.submitted`` without ``rubric_version`` is of version 0.

The rules, in one place (the join, the web service and the exports all use these):

* :func:`check_answers`: the answers of a label fit its version, or a sentence saying where not
  (unknown question, required one missing, a value of the wrong kind or out of range).
* :func:`label_reward`: sum over the scored answers of ``weight x value`` over the sum over the
  same questions of ``weight x maximum`` (rating: the value and ``max``; choice: the option's
  reward and 1; boolean: 1 or 0 and 1; text and choices without rewards are not scored;
  unanswered optional questions are left out of both sums), as an exact fraction. For version
  0 that is the ratings' sum / 20. Every rubric has a required, scored question of positive
  weight (checked when it is made), so every label that fits it has a reward.
* :func:`numeric_answers`: each question's answer as a number where it has one (a rating's
  value, a boolean's 1 or 0, a choice's reward), else None: what a record's ``rubric`` holds.
"""

from __future__ import annotations

from collections.abc import Mapping
from fractions import Fraction
from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, model_validator

NAME_PATTERN = r"^[a-z][a-z0-9_]{0,31}$"
OPTION_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.\-]{0,63}$"
MAX_QUESTIONS = 20
MAX_LEVELS = 11
MAX_OPTIONS = 20
MAX_TEXT = 10_000  # characters of a text answer (a comment's bound)
MAX_GUIDELINES = 50_000  # characters of Markdown

QuestionKind = Literal["rating", "choice", "boolean", "text"]
Answer = bool | int | str
"""One answer: a rating's integer, a choice's option value, a boolean, a text."""


class _Frozen(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


def _level(value: Any) -> Any:
    """A level given as a plain string is its description (DESIGN.md section 11's form)."""
    return {"description": value} if isinstance(value, str) else value


class Level(_Frozen):
    """What one value of a rating means."""

    title: str = Field("", max_length=200)
    description: str = Field("", max_length=2000)


class _Question(_Frozen):
    name: str = Field(pattern=NAME_PATTERN, description="Unique in the rubric; the answer's key.")
    title: str = Field(min_length=1, max_length=200)
    description: str = Field("", max_length=2000)
    required: bool = True
    weight: float = Field(1.0, ge=0, le=1000, allow_inf_nan=False)


class RatingQuestion(_Question):
    """An integer ``min..max`` (at most 11 values), each value's meaning in ``levels``."""

    kind: Literal["rating"] = "rating"
    min: int = Field(1, ge=0, le=100)
    max: int = Field(5, ge=1, le=100)
    levels: dict[int, Annotated[Level, BeforeValidator(_level)]] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _scale(self) -> RatingQuestion:
        if self.min >= self.max:
            raise ValueError(f"{self.name}: min ({self.min}) must be below max ({self.max})")
        if self.max - self.min + 1 > MAX_LEVELS:
            raise ValueError(f"{self.name}: at most {MAX_LEVELS} values (min..max)")
        outside = sorted(v for v in self.levels if not self.min <= v <= self.max)
        if outside:
            raise ValueError(f"{self.name}: level {outside[0]} is outside {self.min}..{self.max}")
        return self


class ChoiceOption(_Frozen):
    value: str = Field(pattern=OPTION_PATTERN)
    title: str = Field(min_length=1, max_length=200)
    description: str = Field("", max_length=2000)
    reward: float | None = Field(None, ge=0, le=1, allow_inf_nan=False)


class ChoiceQuestion(_Question):
    """One of ``options``; scored when the options have rewards (all of them, or none)."""

    kind: Literal["choice"] = "choice"
    options: list[ChoiceOption] = Field(min_length=2, max_length=MAX_OPTIONS)

    @model_validator(mode="after")
    def _options(self) -> ChoiceQuestion:
        values = [o.value for o in self.options]
        if len(set(values)) != len(values):
            raise ValueError(f"{self.name}: option values must be unique")
        rewarded = sum(o.reward is not None for o in self.options)
        if rewarded not in (0, len(values)):
            raise ValueError(f"{self.name}: give every option a reward, or none")
        return self

    @property
    def scored(self) -> bool:
        return self.options[0].reward is not None

    def option(self, value: str) -> ChoiceOption | None:
        return next((o for o in self.options if o.value == value), None)


class BooleanQuestion(_Question):
    """Yes or no: scored 1 for true, 0 for false."""

    kind: Literal["boolean"] = "boolean"


class TextQuestion(_Question):
    """Free text, never scored (redacted like a comment)."""

    kind: Literal["text"] = "text"
    required: bool = False


Question = Annotated[
    RatingQuestion | ChoiceQuestion | BooleanQuestion | TextQuestion, Field(discriminator="kind")
]


def is_scored(question: Question) -> bool:
    """Whether the question's answer counts in a label's reward (weight aside)."""
    if isinstance(question, ChoiceQuestion):
        return question.scored
    return not isinstance(question, TextQuestion)


class RubricSpec(_Frozen):
    """A rubric's content: the guidelines and the questions (a version is one of these)."""

    guidelines: str = Field("", max_length=MAX_GUIDELINES, description="Markdown.")
    questions: list[Question] = Field(min_length=1, max_length=MAX_QUESTIONS)

    @model_validator(mode="after")
    def _whole(self) -> RubricSpec:
        names = [q.name for q in self.questions]
        repeated = sorted({n for n in names if names.count(n) > 1})
        if repeated:
            raise ValueError(f"question names must be unique: {repeated[0]!r} is repeated")
        if not any(q.required and q.weight > 0 and is_scored(q) for q in self.questions):
            raise ValueError(
                "at least one question must be required, scored (rating, boolean, or choice "
                "with rewards) and of positive weight: every label then has a reward"
            )
        return self

    def question(self, name: str) -> Question | None:
        return next((q for q in self.questions if q.name == name), None)


VERSION_0 = RubricSpec(
    guidelines="",
    questions=[
        RatingQuestion(name=name, title=name.capitalize())
        for name in ("correctness", "helpfulness", "efficiency", "safety")
    ],
)
"""The default rubric: four 1..5 ratings of weight 1 (today's reward, their sum / 20)."""

V0_NAMES: tuple[str, ...] = tuple(q.name for q in VERSION_0.questions)


def check_answers(
    spec: RubricSpec, answers: Mapping[str, Any], *, field: str = "rubric"
) -> str | None:
    """None when ``answers`` fit ``spec``; else what does not, as ``field.name: reason``."""
    unknown = sorted(set(answers) - {q.name for q in spec.questions})
    if unknown:
        return f"{field}.{unknown[0]}: not a question of this rubric version"
    for q in spec.questions:
        if q.name not in answers:
            if q.required:
                return f"{field}.{q.name}: required"
            continue
        problem = _answer_problem(q, answers[q.name])
        if problem is not None:
            return f"{field}.{q.name}: {problem}"
    return None


def _answer_problem(q: Question, value: Any) -> str | None:
    if isinstance(q, RatingQuestion):
        if type(value) is not int:
            return f"a rating is an integer {q.min}..{q.max}"
        if not q.min <= value <= q.max:
            return f"{value} is outside {q.min}..{q.max}"
    elif isinstance(q, ChoiceQuestion):
        if type(value) is not str or q.option(value) is None:
            values = ", ".join(o.value for o in q.options)
            return f"not one of the options ({values})"
    elif isinstance(q, BooleanQuestion):
        if type(value) is not bool:
            return "true or false"
    elif type(value) is not str:
        return "a text answer is a string"
    elif len(value) > MAX_TEXT:
        return f"at most {MAX_TEXT} characters"
    return None


def score(q: Question, value: Any) -> tuple[Fraction, Fraction] | None:
    """An answer's (value, maximum) in the reward, exactly; None when it is not scored."""
    if isinstance(q, RatingQuestion):
        return Fraction(value), Fraction(q.max)
    if isinstance(q, BooleanQuestion):
        return Fraction(1 if value else 0), Fraction(1)
    if isinstance(q, ChoiceQuestion) and q.scored:
        option = q.option(value)
        assert option is not None  # checked answers only
        assert option.reward is not None
        return Fraction(option.reward), Fraction(1)
    return None


def label_reward(spec: RubricSpec, answers: Mapping[str, Any]) -> Fraction:
    """A label's reward from answers that fit ``spec`` (:func:`check_answers`), exactly."""
    total = most = Fraction(0)
    for q in spec.questions:
        if q.name not in answers or q.weight == 0:
            continue
        found = score(q, answers[q.name])
        if found is None:
            continue
        weight = Fraction(q.weight)
        total += weight * found[0]
        most += weight * found[1]
    if most == 0:  # not for a spec that passed its checks and answers that fit it
        raise ValueError("no scored answer: the label has no reward")
    return total / most


def numeric_answers(spec: RubricSpec, answers: Mapping[str, Any]) -> dict[str, float | int | None]:
    """Each question's answer as a number where it has one, in question order: a rating's
    value, a boolean's 1 or 0, a scored choice's reward; None for text, unscored choices and
    unanswered questions."""
    out: dict[str, float | int | None] = {}
    for q in spec.questions:
        value = answers.get(q.name)
        if value is None:
            out[q.name] = None
        elif isinstance(q, RatingQuestion):
            out[q.name] = value
        elif isinstance(q, BooleanQuestion):
            out[q.name] = 1 if value else 0
        elif isinstance(q, ChoiceQuestion) and q.scored:
            option = q.option(value)
            out[q.name] = None if option is None else option.reward
        else:
            out[q.name] = None
    return out


class KnownRubrics:
    """The rubric versions known so far, by (org, project, version); version 0 always.

    Versions are immutable (created once, never rewritten), so a version read is kept: the
    join reads each at most once while it stays among the ``limit`` most recently added.
    Pure: whoever reads the store adds what it read (:meth:`add`).
    """

    def __init__(self, limit: int = 4096) -> None:
        self.limit = limit
        self._known: dict[tuple[str, str, int], RubricSpec] = {}

    def spec(self, org: str, project: str, version: int) -> RubricSpec | None:
        if version == 0:
            return VERSION_0
        return self._known.get((org, project, version))

    def add(self, org: str, project: str, version: int, spec: RubricSpec) -> None:
        if version == 0:
            return
        if len(self._known) >= self.limit:
            del self._known[next(iter(self._known))]  # the oldest added
        self._known[(org, project, version)] = spec

    def __contains__(self, key: tuple[str, str, int]) -> bool:
        return key[2] == 0 or key in self._known
