"""The Label tab's routes (scope ``label``; ``PUT labeling`` needs ``admin``): the team's queue,
claims, labels, skips, retractions and the project's labeling settings (docs/guides/labeling.md).

``PUT queue/claims/{trace_id}`` claims one named trace (the page's undo, and its claim again
after a lapsed lease or a hidden tab); ``POST queue/claim`` the next ones of the queue.

Thin on purpose: the rules are :mod:`rl_export.labeling` (settings, claims, the queue's
policy) applied over this instance's index by :mod:`rl_export.web.team`. A label, skip or
retraction is checked against the ``traces`` corpus (404 for a trace not in this
org/project), published with acks=all (503 when the broker does not acknowledge it), noted
for every labeler's queue, and settles the caller's place in the trace's slots (a label
turns their claim into its place, a skip ends it, a retraction frees it), then answered 202.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Path, Query
from fastapi.responses import Response

from rl_export.formats.filters import parse_bool
from rl_export.index import labelqueries
from rl_export.index.labelqueries import QueueFilter
from rl_export.labeling.evaluations import evaluations_shown
from rl_export.labeling.queue import target
from rl_export.labeling.settings import LabelingSettings, SettingsInvalid
from rl_export.model.errors import FilterError
from rl_export.web.api.deps import (
    AdminCaller,
    AnyCaller,
    LabelCaller,
    OrgPath,
    ProjectPath,
    Svc,
    check_scope,
    query,
    stamp,
)
from rl_export.web.api.items import answer, items, known_trace, publish, traces_corpus
from rl_export.web.api.routes.review import decide
from rl_export.web.api.routes.workspace import check_label_answers
from rl_export.web.errors import Conflict, Invalid, NotFound, Unavailable
from rl_export.web.labels import label_retracted, label_skipped, label_submitted
from rl_export.web.models import (
    TRACE_ID_PATTERN,
    AcceptedOut,
    ClaimIn,
    ClaimItem,
    ClaimOut,
    ErrorOut,
    LabelIn,
    LabelingIn,
    LabelingOut,
    QueueOut,
    SkipIn,
)
from rl_export.web.services import Services
from rl_export.web.team import Counts, LabelerQueue, Team, team_of
from rl_export.web.tokens import Caller

router = APIRouter(prefix="/api/v1/{org}/{project}", tags=["label"])

TRACES = "traces"
QUEUE_MAX = 100
TraceIdPath = Annotated[str, Path(min_length=1, max_length=512, pattern=TRACE_ID_PATTERN)]


def queue_scope(
    scenario: Annotated[str | None, Query(description="Only traces of this scenario.")] = None,
    agent_version: Annotated[str | None, Query(description="Only this agent version.")] = None,
    passed: Annotated[
        str | None, Query(description="true or false: only traces the evaluators passed (or not).")
    ] = None,
) -> QueueFilter:
    """The queue's filters from the query string; 422 naming a bad one."""
    return _scope(scenario, agent_version, passed)


def _scope(
    scenario: str | None, agent_version: str | None, passed: str | bool | None
) -> QueueFilter:
    verdict = None
    if isinstance(passed, bool):
        verdict = passed
    elif passed is not None:
        try:
            verdict = parse_bool("passed", passed)
        except FilterError as exc:
            raise Invalid(str(exc)) from None
    return QueueFilter(scenario=scenario, agent_version=agent_version, passed=verdict)


async def _items(svc: Services, team: Team, bodies: list[bytes]) -> list[bytes]:
    """Queue or claim items: blind while the project's ``blind`` setting is on, without the
    evaluators' verdict unless ``show_evaluations`` is ``always`` (the caller labeled none of
    them), always redacted with the service's default kinds (docs/guides/security.md)."""
    shown = evaluations_shown(team.settings.show_evaluations, labeled=False)
    return await items(svc, bodies, blinded=team.settings.blind, evaluations=shown)


@router.get(
    "/queue",
    summary="A preview of the caller's queue (claims nothing), in the project's order",
    response_model=QueueOut,
)
async def get_queue(
    *,
    org: OrgPath, project: ProjectPath, caller: LabelCaller, svc: Svc,
    scope: Annotated[QueueFilter, Depends(queue_scope)],
    limit: Annotated[int, Query(ge=1, le=QUEUE_MAX)] = 10,
) -> Response:  # fmt: skip
    followed = await traces_corpus(svc, org, project)
    if followed.corpus_id is None:
        return answer({"remaining": 0, "team_remaining": 0, "labeled": 0}, [], followed)
    team = await team_of(svc, org, project)
    view = await LabelerQueue(svc, followed.corpus_id, team, caller.subject, scope).view(limit)
    return answer(_counts(view.counts), await _items(svc, team, view.bodies), followed)


@router.post(
    "/queue/claim",
    summary="Claim the next traces of the caller's queue (their unexpired claims first)",
    response_model=ClaimOut,
)
async def post_claim(
    *,
    org: OrgPath,
    project: ProjectPath,
    caller: LabelCaller,
    svc: Svc,
    body: ClaimIn | None = None,
) -> Response:
    body = body or ClaimIn()
    scope = _scope(body.scenario, body.agent_version, body.passed)
    followed = await traces_corpus(svc, org, project)
    if followed.corpus_id is None or followed.passes == 0:
        raise Unavailable(
            f"this instance is still reading the traces of {org}/{project}; retry in a moment"
        )
    team = await team_of(svc, org, project)
    queue = LabelerQueue(svc, followed.corpus_id, team, caller.subject, scope)
    got = await queue.claim(body.limit)
    expiries = [e.expires_at for e in got.entries if e.expires_at is not None]
    fields = {
        "lease_expires_at": stamp(min(expiries)) if expiries else None,
        "claims": [
            {"trace_id": e.trace_id, "expires_at": stamp(e.expires_at or 0.0)} for e in got.entries
        ],
        **_counts(got.view.counts),
    }
    return answer(fields, await _items(svc, team, got.view.bodies), followed)


def _counts(counts: Counts) -> dict[str, int]:
    return {"remaining": counts.remaining, "team_remaining": counts.team_remaining,
            "labeled": counts.labeled}  # fmt: skip


@router.put(
    "/queue/claims/{trace_id}",
    summary="Claim (or renew) the caller's place on one trace: 409 when every place is held",
    responses={409: {"model": ErrorOut, "description": "Every place of the trace is held, "
                     "or the caller has a current label on it."}},
)  # fmt: skip
async def put_claim(
    *, org: OrgPath, project: ProjectPath, caller: LabelCaller, svc: Svc, trace_id: TraceIdPath
) -> ClaimItem:
    """The page's claim on the trace it shows: after an undo, when its lease lapsed, or when
    it comes back to the trace. Unlike the queue, a trace the caller skipped may be claimed:
    they asked for it by name."""
    corpus_id = await known_trace(svc, org, project, trace_id)
    team = await team_of(svc, org, project)
    labelers = await _current(svc, team, corpus_id, trace_id)
    if caller.subject in labelers:
        raise Conflict(f"you have a current label on {trace_id!r}: retract it first")
    mine = svc.claim_book.claims_of(org, project, caller.subject, team.now)
    renewing = any(e.trace_id == trace_id for e in mine)
    taken = await svc.claims.claim(
        org, project, trace_id, caller.subject, target=target(team.settings, labelers),
        lease_s=team.settings.lease_s, labelers=labelers.keys(),
    )  # fmt: skip
    if taken is None or taken.entry.expires_at is None:
        svc.metrics.claims.labels("lost").inc()
        raise Conflict(
            f"every place of {trace_id!r} is held by other labelers: a label now would count "
            "over the target"
        )
    svc.metrics.claims.labels("renewed" if renewing else "granted").inc()
    return ClaimItem(trace_id=trace_id, expires_at=stamp(taken.entry.expires_at))


@router.delete(
    "/queue/claims/{trace_id}", status_code=204, summary="Release the caller's claim on a trace"
)
async def delete_claim(
    *, org: OrgPath, project: ProjectPath, caller: LabelCaller, svc: Svc, trace_id: TraceIdPath
) -> Response:
    team = await team_of(svc, org, project)
    slots = team.settings.labels_per_trace + 1  # the most a trace can ask for
    if not await svc.claims.release(org, project, trace_id, caller.subject, slots=slots):
        raise NotFound(f"you hold no unexpired claim on {trace_id!r}")
    svc.metrics.claims.labels("released").inc()
    return Response(status_code=204)


@router.get("/labeling", summary="This project's labeling settings")
async def get_labeling(
    *, org: OrgPath, project: ProjectPath, caller: LabelCaller, svc: Svc
) -> LabelingOut:
    found = await svc.labeling.get(org, project)
    return _labeling(found, caller)


@router.put("/labeling", summary="Change this project's labeling settings (admin)")
async def put_labeling(
    *, org: OrgPath, project: ProjectPath, caller: AdminCaller, svc: Svc, body: LabelingIn
) -> LabelingOut:
    change = body.model_dump(exclude_unset=True)
    try:
        stored = await svc.labeling.put(org, project, change, by=caller.subject,
                                        now=datetime.now(UTC))  # fmt: skip
    except SettingsInvalid as exc:
        raise Invalid(str(exc)) from None
    return _labeling(stored, caller)


def _labeling(found: LabelingSettings, caller: Caller) -> LabelingOut:
    return LabelingOut(**found.model_dump(include=set(LabelingSettings.model_fields)),
                       editable=caller.allows("admin"))  # fmt: skip


async def _current(svc: Services, team: Team, corpus_id: int, trace_id: str) -> dict[str, Any]:
    row = await query(labelqueries.trace_labels, svc.index, corpus_id, trace_id)
    if row is None:
        return {}
    return dict(team.labels(row).sums)


@router.post(
    "/labels", status_code=202,
    summary="Label a trace (label.submitted; label scope), or decide a disputed one (kind "
    "adjudication; review scope)",
)  # fmt: skip
async def post_label(
    *, org: OrgPath, project: ProjectPath, caller: AnyCaller, svc: Svc, body: LabelIn
) -> AcceptedOut:
    """The answers must fit ``rubric_version`` of the project's rubric (GET rubric): 422
    naming the question otherwise. A label of an older version than the newest is accepted
    and keeps its version."""
    check_scope(caller, "review" if body.kind == "adjudication" else "label", svc)
    await check_label_answers(svc, org, project, body)
    corpus_id = await known_trace(svc, org, project, body.trace_id)
    if body.kind == "adjudication":
        place = await decide(svc, org, project, corpus_id, body.trace_id, reviewer=caller.subject)
    else:
        team = await team_of(svc, org, project)
        labelers = await _current(svc, team, corpus_id, body.trace_id)
        place = await svc.claims.label(
            org, project, body.trace_id, caller.subject,
            target=target(team.settings, labelers), labelers=labelers.keys(),
        )  # fmt: skip
    event = label_submitted(org, project, body.trace_id, caller.subject, rubric=body.rubric,
                            comment=body.comment, now=datetime.now(UTC),
                            rubric_version=body.rubric_version, kind=body.kind)  # fmt: skip
    accepted = await publish(svc, event)
    if place == "claim":
        svc.metrics.claims.labels("ended").inc()
    elif place == "over":  # docs/guides/labeling.md's exception: accepted, and counted
        svc.metrics.labels_over_target.inc()
    return accepted


@router.post("/skips", status_code=202, summary="Skip a trace (label.skipped)")
async def post_skip(
    *, org: OrgPath, project: ProjectPath, caller: LabelCaller, svc: Svc, body: SkipIn
) -> AcceptedOut:
    await known_trace(svc, org, project, body.trace_id)
    event = label_skipped(org, project, body.trace_id, caller.subject, datetime.now(UTC))
    accepted = await publish(svc, event)
    team = await team_of(svc, org, project)
    slots = team.settings.labels_per_trace + 1
    if await svc.claims.release(org, project, body.trace_id, caller.subject, slots=slots):
        svc.metrics.claims.labels("ended").inc()
    return accepted


@router.delete(
    "/labels/{trace_id}", status_code=202, summary="Retract the caller's label (label.retracted)"
)
async def delete_label(
    *, org: OrgPath, project: ProjectPath, caller: LabelCaller, svc: Svc, trace_id: TraceIdPath
) -> AcceptedOut:
    corpus_id = await known_trace(svc, org, project, trace_id)
    team = await team_of(svc, org, project)
    if caller.subject not in await _current(svc, team, corpus_id, trace_id):
        # Nothing to retract: publishing would only add a revision to the trace.
        raise NotFound(f"you have no current label on {trace_id!r}")
    event = label_retracted(org, project, trace_id, caller.subject, datetime.now(UTC))
    accepted = await publish(svc, event)
    slots = team.settings.labels_per_trace + 1
    await svc.claims.retract(org, project, trace_id, caller.subject, slots=slots)
    return accepted
