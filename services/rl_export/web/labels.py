"""Label events the API publishes (pure): ``label.submitted``, ``label.skipped``,
``label.retracted``, ``label.compared`` and ``label.uncompared`` of docs/reference/schemas.md,
built from a request and the caller.

A comparison's retraction is a ``label.uncompared`` keyed like the comparison (the pair's
``trace_a``, naming ``trace_b``): per pair and labeler the latest of the two decides, and
their label of ``trace_a``, if any, is untouched.

The labeler is the token's subject, never a field of the request; ``event_id`` is a fresh
UUID and ``occurred_at`` the server's clock. Events are built through the same pydantic models
the worker validates with, so what the API publishes is what the join accepts.
"""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any

from rl_export.labeling.pairs import ordered
from rl_export.model.codec import dumps
from rl_export.model.events import (
    Choice,
    LabelCompared,
    LabelKind,
    LabelRetracted,
    LabelSkipped,
    LabelSubmitted,
    LabelUncompared,
)

LabelEvent = LabelSubmitted | LabelSkipped | LabelRetracted | LabelCompared | LabelUncompared


def _base(org: str, project: str, trace_id: str, labeler: str, now: datetime) -> dict[str, object]:
    return {
        "event_id": str(uuid.uuid4()),
        "occurred_at": now,
        "org": org,
        "project": project,
        "trace_id": trace_id,
        "labeler": labeler,
    }


def label_submitted(
    org: str, project: str, trace_id: str, labeler: str, *, rubric: dict[str, Any],
    comment: str | None, now: datetime, rubric_version: int = 0, kind: LabelKind = "label",
) -> LabelSubmitted:  # fmt: skip
    """A label: answers to ``rubric_version`` of the project's rubric (checked by the caller;
    version 0 and ``kind: label`` are left out of the event, as before rubrics)."""
    fields = _base(org, project, trace_id, labeler, now)
    if comment:
        fields["comment"] = comment
    if rubric_version:
        fields["rubric_version"] = rubric_version
    if kind != "label":
        fields["kind"] = kind
    return LabelSubmitted.model_validate(
        {**fields, "event_type": "label.submitted", "rubric": dict(rubric)}
    )


def label_skipped(org: str, project: str, trace_id: str, labeler: str,
                  now: datetime) -> LabelSkipped:  # fmt: skip
    fields = _base(org, project, trace_id, labeler, now)
    return LabelSkipped.model_validate({**fields, "event_type": "label.skipped"})


def label_retracted(org: str, project: str, trace_id: str, labeler: str,
                    now: datetime) -> LabelRetracted:  # fmt: skip
    fields = _base(org, project, trace_id, labeler, now)
    return LabelRetracted.model_validate({**fields, "event_type": "label.retracted"})


def label_compared(
    org: str, project: str, first: str, second: str, labeler: str, *, choice: Choice,
    strength: int | None, rubric: dict[str, Any] | None, rubric_version: int,
    comment: str | None, now: datetime,
) -> LabelCompared:  # fmt: skip
    """A comparison of ``first`` and ``second`` as the client named them: the event names
    them in order (``trace_a < trace_b``), with ``a`` and ``b`` flipped in the choice when
    the client gave them the other way round."""
    trace_a, trace_b, said = ordered(first, second, choice)
    fields = _base(org, project, trace_a, labeler, now)
    fields |= {"event_type": "label.compared", "trace_a": trace_a, "trace_b": trace_b,
               "choice": said}  # fmt: skip
    if strength is not None:
        fields["strength"] = strength
    if rubric is not None:
        fields["rubric"] = dict(rubric)
        if rubric_version:
            fields["rubric_version"] = rubric_version
    if comment:
        fields["comment"] = comment
    return LabelCompared.model_validate(fields)


def comparison_retracted(org: str, project: str, trace_a: str, trace_b: str, *, labeler: str,
                         now: datetime) -> LabelUncompared:  # fmt: skip
    """The retraction of the labeler's comparison of the pair (see the module)."""
    fields = _base(org, project, trace_a, labeler, now)
    fields |= {"event_type": "label.uncompared", "trace_a": trace_a, "trace_b": trace_b}
    return LabelUncompared.model_validate(fields)


def encode(event: LabelEvent) -> bytes:
    """The Kafka value: the event as one JSON object (unset optional fields left out)."""
    return dumps(event.model_dump(mode="json", exclude_none=True))
