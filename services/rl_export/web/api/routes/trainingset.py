"""``GET splits`` (scope ``export``): how a training set's rows fall into its splits before it
is downloaded, and what to warn about (docs/guides/training-sets.md): the rows per split, the
distinct ``split_by`` values, and ``warnings`` (a split that holds no row, a ``split_by`` with
fewer than ten values per split). Reads the corpus's view (:mod:`rl_export.export.splitcounts`)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query
from pydantic import BaseModel, Field

from rl_export.export import source_ref
from rl_export.export.splitcounts import split_counts
from rl_export.export.splits import parse_split, parse_splits
from rl_export.model.errors import ExportError, NoDataError
from rl_export.web.api.deps import ExportCaller, FiltersQuery, OrgPath, ProjectPath, Svc
from rl_export.web.api.exportparams import version_at
from rl_export.web.api.routes.export import SaltQuery, SourceQuery, SplitByQuery, VersionQuery
from rl_export.web.errors import Invalid

router = APIRouter(prefix="/api/v1/{org}/{project}", tags=["export"])


class SplitsOut(BaseModel):
    rows: dict[str, int] = Field(description="Matching rows per split, in the order given.")
    values: int = Field(description="Distinct split_by values among them.")
    split_by: str
    warnings: list[str] = Field(description="What may not be what was meant, in words.")


@router.get("/splits", summary="A training set's rows per split, and warnings, before download")
async def get_splits(
    *, org: OrgPath, project: ProjectPath, caller: ExportCaller, svc: Svc, source: SourceQuery,
    filters: FiltersQuery,
    splits: Annotated[str, Query(description="NAME=FRACTION,... summing to 1")],
    split_by: SplitByQuery = None, split_salt: SaltQuery = None, version: VersionQuery = None,
) -> SplitsOut:  # fmt: skip
    try:
        first = parse_splits(splits)[0][0]
        split = parse_split(first, splits, split_by, split_salt)
    except ExportError as exc:
        raise Invalid(f"{exc.setting.replace('-', '_')}: {exc.detail}") from None
    assert split is not None
    at = await version_at(svc, org, project, source, version)
    try:
        counts = await split_counts(svc.store, source_ref(org, project, source), split,
                                    filters=filters, at=at)  # fmt: skip
    except NoDataError:
        counts = None
    if counts is None:
        return SplitsOut(rows=dict.fromkeys((n for n, _ in split.splits), 0), values=0,
                         split_by=split.by, warnings=[])  # fmt: skip
    return SplitsOut(rows=counts.rows, values=counts.values, split_by=split.by,
                     warnings=counts.warnings)  # fmt: skip
