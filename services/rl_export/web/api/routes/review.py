"""The review queue (scope ``review``, which ``admin`` does not imply; docs/guides/rubrics.md):
``GET review/queue``, ``POST review/claim``, ``DELETE review/claims/{trace_id}``, and the place
a decision (``POST labels`` with ``kind: adjudication``) takes.

Items are not blind: a reviewer sees every label side by side with its labeler. They are
redacted like every item, and carry the evaluators' verdict only when ``show_evaluations`` is
``always``. The rules are :mod:`rl_export.labeling.review`'s, the SQL
:mod:`rl_export.index.workspace`'s; claims are the label queue's (:mod:`rl_export.labeling.claims`)
in the project's review space, one place per trace.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path, Query
from fastapi.responses import Response
from pydantic import BaseModel, ConfigDict, Field

from rl_export.index import labelqueries
from rl_export.index.workspace import ReviewRow, adjudicator, review_count, review_head
from rl_export.labeling.claims import LabelPlace
from rl_export.labeling.evaluations import evaluations_shown
from rl_export.labeling.review import ReviewScope, review_space
from rl_export.web.api.deps import OrgPath, ProjectPath, ReviewCaller, Svc, query, stamp
from rl_export.web.api.items import answer, items, traces_corpus
from rl_export.web.errors import NotFound, Unavailable
from rl_export.web.models import TRACE_ID_PATTERN, ReviewOut
from rl_export.web.services import Services
from rl_export.web.team import Team, team_of

router = APIRouter(prefix="/api/v1/{org}/{project}", tags=["review"])

REVIEW_MAX = 50
MinSpread = Annotated[
    float | None,
    Query(ge=0, le=1, description="Only traces whose labels differ by at least this (default: "
          "the project's adjudicate_spread, else any difference)."),
]  # fmt: skip


class ReviewClaimIn(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    limit: int = Field(1, ge=1, le=10)
    min_spread: float | None = Field(None, ge=0, le=1)


async def decide(
    svc: Services, org: str, project: str, corpus_id: int, trace_id: str, *, reviewer: str
) -> LabelPlace:
    """The place a reviewer's decision takes: their review claim on the trace becomes it (a
    decision without a claim takes the free place, or counts over it)."""
    decided = await query(adjudicator, svc.index, corpus_id, trace_id)
    return await svc.claims.label(org, review_space(project), trace_id, reviewer, target=1,
                                  labelers=[decided] if decided else [])  # fmt: skip


class _Review:
    """One reviewer's queue for one request."""

    def __init__(self, svc: Services, team: Team, corpus_id: int, reviewer: str,
                 scope: ReviewScope) -> None:  # fmt: skip
        self.svc, self.team, self.corpus_id = svc, team, corpus_id
        self.reviewer, self.scope = reviewer, scope
        self.space = review_space(team.project)

    def taken(self, trace_id: str) -> bool:
        """Held by another reviewer, or decided by this one a moment ago (the corpora may not
        show the decision yet)."""
        now = self.team.now
        for entry in self.svc.claim_book.slots(self.team.org, self.space, trace_id).values():
            if entry.holder != self.reviewer and entry.live_claim(now):
                return True
            recent = now - entry.at < self.svc.claim_book.label_grace_s
            if entry.state == "labeled" and recent:
                return True
        return False

    async def head(self, limit: int, exclude: frozenset[str] = frozenset()) -> list[ReviewRow]:
        rows = await query(review_head, self.svc.index, self.corpus_id, self.scope,
                           limit + len(exclude) + 64)  # fmt: skip
        return [r for r in rows if r.trace_id not in exclude and not self.taken(r.trace_id)][:limit]

    async def remaining(self) -> int:
        total = await query(review_count, self.svc.index, self.corpus_id, self.scope)
        held = [t for t in self.svc.claim_book.traces(self.team.org, self.space) if self.taken(t)]
        return max(0, total - len(held))

    async def bodies(self, rows: list[ReviewRow]) -> list[bytes]:
        found = await query(labelqueries.bodies, self.svc.index, self.corpus_id,
                            [r.trace_id for r in rows])  # fmt: skip
        shown = evaluations_shown(self.team.settings.show_evaluations, labeled=False)
        return await items(self.svc, found, blinded=False, evaluations=shown)


async def _review(svc: Services, org: str, project: str, reviewer: str,
                  min_spread: float | None) -> tuple[_Review, int]:  # fmt: skip
    followed = await traces_corpus(svc, org, project)
    if followed.corpus_id is None or followed.passes == 0:
        raise Unavailable(
            f"this instance is still reading the traces of {org}/{project}; retry in a moment"
        )
    team = await team_of(svc, org, project)
    scope = ReviewScope.of(team.settings, min_spread)
    return _Review(svc, team, followed.corpus_id, reviewer, scope), followed.corpus_id


@router.get(
    "/review/queue", response_model=ReviewOut,
    summary="Traces whose labels disagree, oldest first, every label with its labeler (review)",
)  # fmt: skip
async def get_review_queue(
    *, org: OrgPath, project: ProjectPath, caller: ReviewCaller, svc: Svc,
    limit: Annotated[int, Query(ge=1, le=REVIEW_MAX)] = 10, min_spread: MinSpread = None,
) -> Response:  # fmt: skip
    review, _ = await _review(svc, org, project, caller.subject, min_spread)
    rows = await review.head(limit)
    followed = await traces_corpus(svc, org, project)
    return answer({"remaining": await review.remaining(), "claims": [], "lease_expires_at": None},
                  await review.bodies(rows), followed)  # fmt: skip


@router.post(
    "/review/claim", response_model=ReviewOut,
    summary="Claim the next disputed traces to decide (the caller's unexpired claims first)",
)  # fmt: skip
async def post_review_claim(
    *, org: OrgPath, project: ProjectPath, caller: ReviewCaller, svc: Svc,
    body: ReviewClaimIn | None = None,
) -> Response:  # fmt: skip
    body = body or ReviewClaimIn()
    review, _ = await _review(svc, org, project, caller.subject, body.min_spread)
    team = review.team
    lease = team.settings.lease_s
    held = svc.claim_book.claims_of(org, review.space, caller.subject, team.now)
    entries = []
    for entry in held[: body.limit]:  # renewed
        taken = await svc.claims.claim(org, review.space, entry.trace_id, caller.subject,
                                       target=1, lease_s=lease, labelers=())  # fmt: skip
        if taken is not None:
            entries.append(taken.entry)
    tried = frozenset(e.trace_id for e in entries)
    for row in await review.head(2 * body.limit + 4, tried):
        if len(entries) >= body.limit:
            break
        taken = await svc.claims.claim(org, review.space, row.trace_id, caller.subject,
                                       target=1, lease_s=lease, labelers=())  # fmt: skip
        svc.metrics.claims.labels("lost" if taken is None else "granted").inc()
        if taken is not None:
            entries.append(taken.entry)
    rows = [ReviewRow(e.trace_id, (), (0, 0, 0)) for e in entries]
    expiries = [e.expires_at for e in entries if e.expires_at is not None]
    fields = {
        "remaining": await review.remaining(),
        "claims": [
            {"trace_id": e.trace_id, "expires_at": stamp(e.expires_at or 0.0)} for e in entries
        ],
        "lease_expires_at": stamp(min(expiries)) if expiries else None,
    }
    followed = await traces_corpus(svc, org, project)
    return answer(fields, await review.bodies(rows), followed)


@router.delete("/review/claims/{trace_id}", status_code=204,
               summary="Release the caller's review claim on a trace")  # fmt: skip
async def delete_review_claim(
    *, org: OrgPath, project: ProjectPath, caller: ReviewCaller, svc: Svc,
    trace_id: Annotated[str, Path(min_length=1, max_length=512, pattern=TRACE_ID_PATTERN)],
) -> Response:  # fmt: skip
    if not await svc.claims.release(org, review_space(project), trace_id, caller.subject,
                                    slots=1):  # fmt: skip
        raise NotFound(f"you hold no unexpired review claim on {trace_id!r}")
    return Response(status_code=204)
