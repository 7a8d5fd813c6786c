"""The Label tab's routes (scope ``label``): the queue, labels, skips and retractions.

The queue is a query on this instance's index of the ``traces`` corpus, corrected by what the
labeler did since (:mod:`rl_export.web.overlay`). A label, skip or retraction is checked
against that corpus (404 for a trace not in this org/project), published with acks=all
(503 when the broker does not acknowledge it), noted for the labeler's queue, then answered
202 with the event's id.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime
from typing import Annotated

from fastapi import APIRouter, Path, Query
from fastapi.responses import Response

from rl_export.common.codec import dumps
from rl_export.web.api.deps import (
    LabelCaller,
    OrgPath,
    ProjectPath,
    Svc,
    corpus,
    index_state,
    query,
)
from rl_export.web.errors import NotFound, Unavailable
from rl_export.web.index import QueueAsk
from rl_export.web.labels import LabelEvent, label_retracted, label_skipped, label_submitted
from rl_export.web.models import TRACE_ID_PATTERN, AcceptedOut, LabelIn, QueueOut, SkipIn
from rl_export.web.services import Services

router = APIRouter(prefix="/api/v1/{org}/{project}", tags=["label"])

TRACES = "traces"
QUEUE_MAX = 100


@router.get(
    "/queue",
    summary="The caller's queue: traces they have neither labeled nor skipped, oldest first",
    response_model=QueueOut,
)
async def get_queue(
    *,
    org: OrgPath, project: ProjectPath, caller: LabelCaller, svc: Svc,
    limit: Annotated[int, Query(ge=1, le=QUEUE_MAX)] = 10,
) -> Response:  # fmt: skip
    followed = await corpus(svc, org, project, TRACES)
    bodies: list[bytes] = []
    remaining = 0
    if followed.corpus_id is not None:
        hidden, returned = svc.overlay.ask(org, project, caller.subject)
        ask = QueueAsk(caller.subject, limit, hidden=hidden, returned=returned)
        bodies, remaining = await query(svc.index.queue, followed.corpus_id, ask)
    # The records are the corpus's lines: handed on as they are, never parsed here.
    state = dumps(index_state(followed, time.monotonic()).model_dump())
    content = b'{"items":[%b],"remaining":%d,"index":%b}' % (b",".join(bodies), remaining, state)
    return Response(content, media_type="application/json")


async def _known_trace(svc: Services, org: str, project: str, trace_id: str) -> None:
    followed = await corpus(svc, org, project, TRACES)
    if followed.corpus_id is None or followed.passes == 0:
        raise Unavailable(
            f"this instance is still reading the traces of {org}/{project}; retry in a moment"
        )
    if not await query(svc.index.has_trace, followed.corpus_id, trace_id):
        raise NotFound(f"no trace {trace_id!r} in {org}/{project}")


async def _publish(svc: Services, event: LabelEvent) -> AcceptedOut:
    await svc.publisher.publish(event)  # 503 unless the broker acknowledged it
    svc.overlay.note(event)  # read-your-writes: the caller's queue changes at once
    return AcceptedOut(event_id=event.event_id)


@router.post("/labels", status_code=202, summary="Label a trace (label.submitted)")
async def post_label(
    *, org: OrgPath, project: ProjectPath, caller: LabelCaller, svc: Svc, body: LabelIn
) -> AcceptedOut:
    await _known_trace(svc, org, project, body.trace_id)
    event = label_submitted(org, project, body.trace_id, caller.subject, rubric=body.rubric,
                            comment=body.comment, now=datetime.now(UTC))  # fmt: skip
    return await _publish(svc, event)


@router.post("/skips", status_code=202, summary="Skip a trace (label.skipped)")
async def post_skip(
    *, org: OrgPath, project: ProjectPath, caller: LabelCaller, svc: Svc, body: SkipIn
) -> AcceptedOut:
    await _known_trace(svc, org, project, body.trace_id)
    event = label_skipped(org, project, body.trace_id, caller.subject, datetime.now(UTC))
    return await _publish(svc, event)


@router.delete(
    "/labels/{trace_id}", status_code=202, summary="Retract the caller's label (label.retracted)"
)
async def delete_label(
    *,
    org: OrgPath, project: ProjectPath, caller: LabelCaller, svc: Svc,
    trace_id: Annotated[str, Path(min_length=1, max_length=512, pattern=TRACE_ID_PATTERN)],
) -> AcceptedOut:  # fmt: skip
    await _known_trace(svc, org, project, trace_id)
    event = label_retracted(org, project, trace_id, caller.subject, datetime.now(UTC))
    return await _publish(svc, event)
