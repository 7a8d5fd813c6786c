"""A labeler's workspace (label scope; docs/guides/rubrics.md): ``GET mylabels`` (their own
labels, newest first, searched) and ``GET traces/{trace_id}`` (one trace, to reopen a label or
to jump to a trace by its id), and the check of a label's answers against its rubric version."""

from __future__ import annotations

import base64
import binascii
import time
from functools import partial
from typing import Annotated, Any, cast

import orjson
from fastapi import APIRouter, Path, Query

from rl_export.corpora.rubrics import StoredRubric
from rl_export.index import labelqueries
from rl_export.index.workspace import Cursor, my_labels
from rl_export.labeling.evaluations import evaluations_shown
from rl_export.model.errors import StoreError
from rl_export.model.events import LabelKind
from rl_export.model.rubrics import check_answers
from rl_export.web.api.deps import LabelCaller, OrgPath, ProjectPath, Svc, index_state, query
from rl_export.web.api.items import items, known_trace, traces_corpus
from rl_export.web.errors import Invalid, Unavailable
from rl_export.web.models import TRACE_ID_PATTERN, LabelIn, MyLabelOut, MyLabelsOut, TraceOut
from rl_export.web.services import Services
from rl_export.web.team import team_of

router = APIRouter(prefix="/api/v1/{org}/{project}", tags=["label"])

MYLABELS_MAX = 100


async def answered_rubric(svc: Services, org: str, project: str, version: int) -> StoredRubric:
    """The rubric version answers were given for: 422 when the project has no such version,
    503 when the store does not answer (labels and comparisons alike)."""
    try:
        found = await svc.rubrics.get(org, project, version)
    except StoreError as exc:
        raise Unavailable(f"the object store did not answer ({exc}); retry") from None
    if found is None:
        raise Invalid(f"rubric_version: {org}/{project} has no rubric version "
                      f"{version} (GET rubric)")  # fmt: skip
    return found


async def check_label_answers(svc: Services, org: str, project: str, body: LabelIn) -> None:
    """422 when the label's answers do not fit its rubric version (or the version does not
    exist); 503 when the store does not answer."""
    found = await answered_rubric(svc, org, project, body.rubric_version)
    problem = check_answers(found.spec, body.rubric)
    if problem is not None:
        raise Invalid(f"{problem} (rubric version {body.rubric_version})")


def _cursor(text: str | None) -> Cursor | None:
    if not text:
        return None
    try:
        value = orjson.loads(base64.urlsafe_b64decode(text.encode() + b"=="))
    except (binascii.Error, ValueError, orjson.JSONDecodeError):
        raise Invalid("cursor: not a cursor this route gave") from None
    if not (isinstance(value, list) and len(value) == 3 and all(isinstance(v, str) for v in value)):
        raise Invalid("cursor: not a cursor this route gave")
    return (value[0], value[1], value[2])


def _next(found: list[Any], limit: int) -> str | None:
    if len(found) < limit:
        return None
    last = found[-1]
    key = orjson.dumps([last.occurred_at, last.trace_id, last.kind])
    return base64.urlsafe_b64encode(key).decode().rstrip("=")


@router.get("/mylabels", summary="The caller's own labels, newest first; q searches them")
async def get_mylabels(
    *, org: OrgPath, project: ProjectPath, caller: LabelCaller, svc: Svc,
    q: Annotated[str, Query(max_length=200, description="Part of a trace id, a scenario or "
                            "the label's comment (any case).")] = "",
    limit: Annotated[int, Query(ge=1, le=MYLABELS_MAX)] = 20,
    cursor: Annotated[str | None, Query(max_length=2000, description="next_cursor of the "
                                        "page before.")] = None,
) -> MyLabelsOut:  # fmt: skip
    """The labels as the corpora show them: a label saved a moment ago appears within the
    sink's shard age and the index's poll (seconds)."""
    after = _cursor(cursor)
    followed = await traces_corpus(svc, org, project)
    found = []
    if followed.corpus_id is not None:
        ask = partial(my_labels, q=q.strip(), limit=limit, after=after)
        found = await query(ask, svc.index, followed.corpus_id, caller.subject)
    out = [MyLabelOut(trace_id=x.trace_id, scenario=x.scenario, agent_version=x.agent_version,
                      occurred_at=x.occurred_at or None, kind=cast(LabelKind, x.kind),
                      rubric_version=x.rubric_version, reward=x.reward, comment=x.comment)
           for x in found]  # fmt: skip
    return MyLabelsOut(items=out, next_cursor=_next(found, limit),
                       index=index_state(followed, time.monotonic()))  # fmt: skip


@router.get("/traces/{trace_id}", summary="One trace as the caller may see it, and their label")
async def get_trace(
    *, org: OrgPath, project: ProjectPath, caller: LabelCaller, svc: Svc,
    trace_id: Annotated[str, Path(min_length=1, max_length=512, pattern=TRACE_ID_PATTERN)],
) -> TraceOut:  # fmt: skip
    """The record as a queue item (blind, redacted), with the evaluators' verdict when the
    project's ``show_evaluations`` allows it for this caller (``after_label``: once they
    labeled the trace), and the caller's own current label (unredacted: their own words)."""
    import time

    corpus_id = await known_trace(svc, org, project, trace_id)
    team = await team_of(svc, org, project)
    row = await query(labelqueries.trace_labels, svc.index, corpus_id, trace_id)
    labeled = row is not None and caller.subject in team.labels(row).sums
    shown = evaluations_shown(team.settings.show_evaluations, labeled)
    bodies = await query(labelqueries.bodies, svc.index, corpus_id, [trace_id])
    mine = None
    if bodies:
        record = orjson.loads(bodies[0])
        mine = next((e for e in record.get("human_labels") or ()
                     if e.get("labeler") == caller.subject
                     and e.get("kind", "label") == "label"), None)  # fmt: skip
    made = await items(svc, bodies, blinded=team.settings.blind, evaluations=shown)
    if not made:  # deleted between the two reads
        raise Unavailable(f"{trace_id!r} changed while it was read; retry")
    followed = await traces_corpus(svc, org, project)
    return TraceOut(item=orjson.loads(made[0]), my_label=mine if labeled else None,
                    labeled=labeled, evaluations_shown=shown,
                    index=index_state(followed, time.monotonic()))  # fmt: skip
