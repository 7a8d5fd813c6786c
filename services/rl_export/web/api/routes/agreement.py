"""``GET agreement`` (scope ``export``): the agreement report of docs/guides/labeling.md over the
latest records of the ``traces`` corpus that match the usual filters.

The index hands over the labels and results as columns (:func:`~rl_export.index.labelqueries.
agreement_input`) and :func:`~rl_export.labeling.agreement.agreement_report` computes the
report, bootstrap included, on a worker thread: the event loop never waits on it. Reports are
kept warm (:mod:`rl_export.index.reports`): the answer says when its input was read
(``computed_at``) and whether a newer one is being computed (``updating``).
"""

from __future__ import annotations

import time
from typing import Annotated, Any

import orjson
from fastapi import APIRouter, Query

from rl_export.formats.filters import Filters
from rl_export.index.labelqueries import agreement_input
from rl_export.index.queryindex import QueryIndex
from rl_export.index.workspace import shared_bodies
from rl_export.labeling.agreement import AgreementBuilder, agreement_report
from rl_export.labeling.questions import QuestionsBuilder, with_questions
from rl_export.model.errors import StoreError
from rl_export.model.rubrics import RubricSpec
from rl_export.web.api.deps import (
    ExportCaller,
    FiltersQuery,
    OrgPath,
    ProjectPath,
    Svc,
    corpus,
    index_state,
    query,
    stamp,
)
from rl_export.web.errors import Invalid, Unavailable
from rl_export.web.models import AgreementOut
from rl_export.web.services import Services

router = APIRouter(prefix="/api/v1/{org}/{project}", tags=["label"])


def _report(
    index: QueryIndex, corpus_id: int, filters: Filters, specs: dict[int, RubricSpec],
    version: int | None,
) -> dict[str, Any]:  # fmt: skip
    data = agreement_input(index, corpus_id, filters)
    report = agreement_report(data).model_dump(mode="json")
    builder = QuestionsBuilder()
    for body in shared_bodies(index, corpus_id, filters):
        builder.add(orjson.loads(body))
    return with_questions(report, builder, specs, version)


async def _specs(svc: Services, org: str, project: str) -> dict[int, RubricSpec]:
    """Every version of the project's rubric (each read once, then kept)."""
    try:
        latest = await svc.rubrics.latest_version(org, project)
        found = [await svc.rubrics.get(org, project, n) for n in range(latest + 1)]
    except StoreError as exc:
        raise Unavailable(f"the object store did not answer ({exc}); retry") from None
    return {f.version: f.spec for f in found if f is not None}


@router.get(
    "/agreement",
    summary="How far labelers agree (Krippendorff's alpha), and each evaluator with them",
    response_model=AgreementOut,
)
async def get_agreement(
    *, org: OrgPath, project: ProjectPath, caller: ExportCaller, svc: Svc, filters: FiltersQuery,
    rubric_version: Annotated[int | None, Query(ge=0, le=1_000_000, description="The rubric "
                              "version whose labels by_question compares (default: the newest "
                              "that two labels of a trace share).")] = None,
) -> dict[str, Any]:  # fmt: skip
    specs = await _specs(svc, org, project)
    if rubric_version is not None and rubric_version not in specs:
        raise Invalid(f"rubric_version: {org}/{project} has no rubric version {rubric_version}")
    followed = await corpus(svc, org, project, "traces")
    if followed.corpus_id is None:
        empty = agreement_report(AgreementBuilder().build()).model_dump(mode="json")
        report = with_questions(empty, QuestionsBuilder(), specs, rubric_version)
        fields = {"computed_at": stamp(time.time()), "updating": False}
    else:
        cid = followed.corpus_id
        answer = await svc.agreement_reports.get(
            (cid, f"{filters.model_dump_json()} {rubric_version}"),
            lambda: svc.index.changes(cid),
            lambda: query(_report, svc.index, cid, filters, specs, rubric_version),
        )
        report = answer.kept.report
        fields = {"computed_at": stamp(answer.kept.wall), "updating": answer.updating}
    return {**report, **fields, "index": index_state(followed, time.monotonic()).model_dump()}
