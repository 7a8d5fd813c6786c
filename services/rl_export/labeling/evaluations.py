"""When a labeler sees the evaluators' verdict (the labeling setting ``show_evaluations``). Pure.

An evaluator's PASS or FAIL, its scores and its reasoning beside the rating form anchor the
labeler: they rate what the judge said. So by default (``after_label``) queue, claim and trace
items carry no evaluation until the labeler has saved a label on that trace; ``always`` shows
it from the start, ``never`` not at all. Hidden means the record's :data:`EVALUATION_FIELDS`
are null (unknown, as blind fields are), and an evaluator-sourced record's reward and verdict
with them.
"""

from __future__ import annotations

from typing import Any

from rl_export.labeling.settings import ShowEvaluations

EVALUATION_FIELDS: tuple[str, ...] = ("evaluation", "evaluator_scores")
"""The trajectory record's fields that carry the evaluators' verdict, scores and reasoning."""


def evaluations_shown(setting: ShowEvaluations, labeled: bool) -> bool:
    """Whether a labeler who has (``labeled``) or has not labeled the trace sees them."""
    return setting == "always" or (setting == "after_label" and labeled)


def hide_evaluations(record: dict[str, Any]) -> dict[str, Any]:
    """The record without the evaluators' verdict (see the module)."""
    hidden = {name: None for name in EVALUATION_FIELDS if name in record}
    if record.get("reward_source") == "evaluator":
        hidden.update(reward=None, passed=None)
    return {**record, **hidden} if hidden else record
