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
from typing import Any

from fastapi import APIRouter

from rl_export.formats.filters import Filters
from rl_export.index.labelqueries import agreement_input
from rl_export.index.queryindex import QueryIndex
from rl_export.labeling.agreement import AgreementBuilder, agreement_report
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
from rl_export.web.models import AgreementOut

router = APIRouter(prefix="/api/v1/{org}/{project}", tags=["label"])


def _report(index: QueryIndex, corpus_id: int, filters: Filters) -> dict[str, Any]:
    data = agreement_input(index, corpus_id, filters)
    return agreement_report(data).model_dump(mode="json")


@router.get(
    "/agreement",
    summary="How far labelers agree (Krippendorff's alpha), and each evaluator with them",
    response_model=AgreementOut,
)
async def get_agreement(
    *, org: OrgPath, project: ProjectPath, caller: ExportCaller, svc: Svc, filters: FiltersQuery
) -> dict[str, Any]:
    followed = await corpus(svc, org, project, "traces")
    if followed.corpus_id is None:
        report = agreement_report(AgreementBuilder().build()).model_dump(mode="json")
        fields = {"computed_at": stamp(time.time()), "updating": False}
    else:
        cid = followed.corpus_id
        answer = await svc.agreement_reports.get(
            (cid, filters.model_dump_json()),
            lambda: svc.index.changes(cid),
            lambda: query(_report, svc.index, cid, filters),
        )
        report = answer.kept.report
        fields = {"computed_at": stamp(answer.kept.wall), "updating": answer.updating}
    return {**report, **fields, "index": index_state(followed, time.monotonic()).model_dump()}
