"""Comparisons (docs/guides/labeling.md#6-comparisons): ``GET compare/queue``, ``POST
compare/claim``, ``DELETE compare/claims/{pair_id}``, ``POST comparisons``, ``DELETE
comparisons/{pair_id}`` (scope ``label``) and ``GET comparisons/ratings`` (scope ``export``).

Queue and claim items are ``{pair_id, trace_a, trace_b, a, b}``: the two records blind (no
labeler's comparisons, labels or counts: nobody sees another's choice) and redacted. A
comparison names two traces of the token's org/project (404 for a trace not in it); the
event names them in order, the choice flipped when the client gave them the other way round
(:func:`~rl_export.web.labels.label_compared`); it takes the caller's claim on the pair as
its place (or a free one, else it counts over the target), is published with acks=all (503
when the broker does not acknowledge it) and noted for every labeler's queue at once.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Path, Query
from fastapi.responses import Response
from pydantic import BaseModel, ConfigDict, Field

from rl_export.labeling.pairs import compare_space
from rl_export.labeling.ratings import RatingsBuilder, RatingsReport, ratings_report
from rl_export.model.events import Answer
from rl_export.model.pairs import pair_id
from rl_export.model.rubrics import MAX_TEXT, check_answers
from rl_export.web.api.deps import (
    ExportCaller,
    FiltersQuery,
    LabelCaller,
    OrgPath,
    ProjectPath,
    Svc,
    query,
    stamp,
)
from rl_export.web.api.items import answer, known_trace, traces_corpus
from rl_export.web.api.routes.workspace import answered_rubric
from rl_export.web.compare import CompareQueue
from rl_export.web.errors import Conflict, Invalid, NotFound, Unavailable
from rl_export.web.labels import comparison_retracted, label_compared
from rl_export.web.models import AcceptedOut, ErrorOut, TraceId
from rl_export.web.services import Services
from rl_export.web.team import Team, team_of

router = APIRouter(prefix="/api/v1/{org}/{project}", tags=["compare"])

QUEUE_MAX = 50
PairIdPath = Annotated[str, Path(pattern=r"^[0-9a-f]{16}$", description="A pair's id.")]


class CompareClaimIn(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    limit: int = Field(1, ge=1, le=10)


class ComparisonIn(BaseModel):
    """A comparison of two traces: ``choice`` says which is better as the client named them
    (``a``: ``trace_a`` as given here), ``tie``, or ``both_bad``."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    trace_a: str = TraceId
    trace_b: str = TraceId
    choice: Literal["a", "b", "tie", "both_bad"]
    strength: int | None = Field(None, ge=1, le=3, description="How much better: 1..3.")
    rubric: dict[str, Answer] | None = Field(
        None, description="Answers to questions of the project's rubric (optional ones)."
    )
    rubric_version: int = Field(0, ge=0, le=1_000_000)
    comment: str | None = Field(None, max_length=MAX_TEXT)


class PairItemOut(BaseModel):
    pair_id: str
    trace_a: str
    trace_b: str
    a: dict[str, Any] = Field(description="trace_a's record, blind and redacted.")
    b: dict[str, Any] = Field(description="trace_b's record, blind and redacted.")


class CompareQueueOut(BaseModel):
    items: list[PairItemOut]
    remaining: int = Field(description="Pairs in the caller's comparison queue.")
    team_remaining: int = Field(description="Pairs short of their target of comparisons.")
    lease_expires_at: str | None
    claims: list[dict[str, str]] = Field(description="[{pair_id, expires_at}] of the claim.")


async def _queue(svc: Services, org: str, project: str, labeler: str) -> CompareQueue:
    followed = await traces_corpus(svc, org, project)
    if followed.corpus_id is None or followed.passes == 0:
        raise Unavailable(
            f"this instance is still reading the traces of {org}/{project}; retry in a moment"
        )
    team = await team_of(svc, org, project)
    return await CompareQueue.of(svc, followed.corpus_id, team, labeler)


def _answer(fields: dict[str, Any], found: list[bytes], queue: CompareQueue,
            followed: Any) -> Response:  # fmt: skip
    counts = queue.counts()
    return answer({**fields, "remaining": counts.remaining,
                   "team_remaining": counts.team_remaining}, found, followed)  # fmt: skip


@router.get("/compare/queue", response_model=CompareQueueOut,
            summary="A preview of the caller's comparison queue (claims nothing)")  # fmt: skip
async def get_compare_queue(
    *, org: OrgPath, project: ProjectPath, caller: LabelCaller, svc: Svc,
    limit: Annotated[int, Query(ge=1, le=QUEUE_MAX)] = 10,
) -> Response:  # fmt: skip
    followed = await traces_corpus(svc, org, project)
    fields: dict[str, Any] = {"lease_expires_at": None, "claims": []}
    if followed.corpus_id is None:  # no trace yet: nothing to compare
        return answer({**fields, "remaining": 0, "team_remaining": 0}, [], followed)
    queue = await _queue(svc, org, project, caller.subject)
    found = await queue.items(queue.head(limit))
    return _answer(fields, found, queue, followed)


@router.post(
    "/compare/claim", response_model=CompareQueueOut,
    summary="Claim the next pairs to compare (the caller's unexpired claims first)",
)  # fmt: skip
async def post_compare_claim(
    *, org: OrgPath, project: ProjectPath, caller: LabelCaller, svc: Svc,
    body: CompareClaimIn | None = None,
) -> Response:  # fmt: skip
    body = body or CompareClaimIn()
    queue = await _queue(svc, org, project, caller.subject)
    pairs, entries = await queue.claim(body.limit)
    expiries = [e.expires_at for e in entries if e.expires_at is not None]
    fields = {
        "lease_expires_at": stamp(min(expiries)) if expiries else None,
        "claims": [
            {"pair_id": e.trace_id, "expires_at": stamp(e.expires_at or 0.0)} for e in entries
        ],
    }
    found = await queue.items(pairs)
    followed = await traces_corpus(svc, org, project)
    return _answer(fields, found, queue, followed)


@router.put(
    "/compare/claims/{pair_id}",
    summary="Claim (or renew) the caller's place on one pair: 409 when every place is held",
    responses={409: {"model": ErrorOut, "description": "Every place of the pair is held, or "
                     "the caller has a current comparison of it."}},
)  # fmt: skip
async def put_compare_claim(
    *, org: OrgPath, project: ProjectPath, caller: LabelCaller, svc: Svc, pair_id: PairIdPath
) -> dict[str, str]:
    """The page's claim on the pair it shows again after an undo."""
    queue = await _queue(svc, org, project, caller.subject)
    pair = queue.pairs.pairs.get(pair_id)
    if pair is None:
        raise NotFound(f"no pair {pair_id!r} to compare in {org}/{project}")
    if caller.subject in queue.voters(pair_id):
        raise Conflict(f"you have a current comparison of pair {pair_id!r}: retract it first")
    entry = await queue.claim_one(pair)
    if entry is None or entry.expires_at is None:
        svc.metrics.claims.labels("lost").inc()
        raise Conflict(f"every place of pair {pair_id!r} is held by other labelers")
    svc.metrics.claims.labels("granted").inc()
    return {"pair_id": pair_id, "expires_at": stamp(entry.expires_at)}


@router.delete("/compare/claims/{pair_id}", status_code=204,
               summary="Release the caller's claim on a pair")  # fmt: skip
async def delete_compare_claim(
    *, org: OrgPath, project: ProjectPath, caller: LabelCaller, svc: Svc, pair_id: PairIdPath
) -> Response:
    team = await team_of(svc, org, project)
    slots = team.settings.comparisons_per_pair
    if not await svc.claims.release(org, compare_space(project), pair_id, caller.subject,
                                    slots=slots):  # fmt: skip
        raise NotFound(f"you hold no unexpired claim on pair {pair_id!r}")
    svc.metrics.claims.labels("released").inc()
    return Response(status_code=204)


async def _check_answers(svc: Services, org: str, project: str, body: ComparisonIn) -> None:
    if body.rubric is None:
        return
    found = await answered_rubric(svc, org, project, body.rubric_version)
    optional = found.spec.model_copy(update={"questions": [
        q.model_copy(update={"required": False}) for q in found.spec.questions]})  # fmt: skip
    problem = check_answers(optional, body.rubric)
    if problem is not None:
        raise Invalid(f"{problem} (rubric version {body.rubric_version})")


async def _voters(svc: Services, team: Team, corpus_id: int, pair_id: str) -> frozenset[str]:
    """Who compared the pair, as this instance knows (corpora, then fresh votes)."""
    voters = set((await query(svc.pairbook.voters, corpus_id)).get(pair_id, ()))
    fresh = svc.overlay.votes.fresh(team.org, team.project).get(pair_id, {})
    for labeler, voted in fresh.items():
        (voters.add if voted else voters.discard)(labeler)
    return frozenset(voters)


@router.post("/comparisons", status_code=202,
             summary="Compare two traces (label.compared): a, b, tie or both_bad")  # fmt: skip
async def post_comparison(
    *, org: OrgPath, project: ProjectPath, caller: LabelCaller, svc: Svc, body: ComparisonIn
) -> AcceptedOut:
    if body.trace_a == body.trace_b:
        raise Invalid("trace_b: a comparison is of two different traces")
    await _check_answers(svc, org, project, body)
    corpus_id = await known_trace(svc, org, project, body.trace_a)
    await known_trace(svc, org, project, body.trace_b)
    event = label_compared(
        org, project, body.trace_a, body.trace_b, caller.subject, choice=body.choice,
        strength=body.strength, rubric=body.rubric, rubric_version=body.rubric_version,
        comment=body.comment, now=datetime.now(UTC),
    )  # fmt: skip
    team = await team_of(svc, org, project)
    pid = pair_id(event.trace_a, event.trace_b)
    voters = await _voters(svc, team, corpus_id, pid)
    place = await svc.claims.label(org, compare_space(project), pid, caller.subject,
                                   target=team.settings.comparisons_per_pair,
                                   labelers=voters)  # fmt: skip
    await svc.publisher.publish(event)
    svc.overlay.note(event)
    if place == "claim":
        svc.metrics.claims.labels("ended").inc()
    elif place == "over":  # accepted (a person did the work), and counted
        svc.metrics.comparisons_over_target.inc()
    return AcceptedOut(event_id=event.event_id)


@router.delete(
    "/comparisons/{pair_id}", status_code=202,
    summary="Retract the caller's comparison of a pair (label.uncompared)",
)  # fmt: skip
async def delete_comparison(
    *, org: OrgPath, project: ProjectPath, caller: LabelCaller, svc: Svc, pair_id: PairIdPath
) -> AcceptedOut:
    followed = await traces_corpus(svc, org, project)
    if followed.corpus_id is None:
        raise NotFound(f"you have no current comparison of pair {pair_id!r}")
    team = await team_of(svc, org, project)
    traces = svc.overlay.votes.traces(pair_id) or await query(
        svc.pairbook.pair_traces, followed.corpus_id, pair_id
    )
    voters = await _voters(svc, team, followed.corpus_id, pair_id)
    if traces is None or caller.subject not in voters:
        # Nothing to retract: publishing would only add a revision to both traces.
        raise NotFound(f"you have no current comparison of pair {pair_id!r}")
    event = comparison_retracted(org, project, *traces, labeler=caller.subject,
                                 now=datetime.now(UTC))  # fmt: skip
    await svc.publisher.publish(event)
    svc.overlay.note(event)
    await svc.claims.retract(org, compare_space(project), pair_id, caller.subject,
                             slots=team.settings.comparisons_per_pair)  # fmt: skip
    return AcceptedOut(event_id=event.event_id)


@router.get(
    "/comparisons/ratings", response_model=RatingsReport,
    summary="Bradley-Terry ratings per agent version and agreement of comparisons",
)  # fmt: skip
async def get_ratings(
    *, org: OrgPath, project: ProjectPath, caller: ExportCaller, svc: Svc, filters: FiltersQuery
) -> RatingsReport:
    if filters.metadata:
        raise Invalid("metadata: ratings read the index, which holds no metadata filter")
    followed = await traces_corpus(svc, org, project)
    if followed.corpus_id is None:
        return ratings_report(RatingsBuilder().build())
    cid = followed.corpus_id

    def compute() -> RatingsReport:  # kept while the corpus does not change
        return ratings_report(svc.pairbook.ratings_input(cid, filters))

    return await query(svc.index.memo, cid, f"ratings {filters.model_dump_json()}", compute)
