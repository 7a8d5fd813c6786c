"""Label events the API publishes (pure): ``label.submitted``, ``label.skipped`` and
``label.retracted`` of docs/reference/schemas.md, built from a request and the caller.

The labeler is the token's subject, never a field of the request; ``event_id`` is a fresh
UUID and ``occurred_at`` the server's clock. Events are built through the same pydantic models
the worker validates with, so what the API publishes is what the join accepts.
"""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any

from rl_export.model.codec import dumps
from rl_export.model.events import LabelKind, LabelRetracted, LabelSkipped, LabelSubmitted

LabelEvent = LabelSubmitted | LabelSkipped | LabelRetracted


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


def encode(event: LabelEvent) -> bytes:
    """The Kafka value: the event as one JSON object (unset optional fields left out)."""
    return dumps(event.model_dump(mode="json", exclude_none=True))
