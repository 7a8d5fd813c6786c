"""``GET versions`` (scope ``export``), ``POST versions`` and ``DELETE versions/{name}``
(scope ``admin``): a project's pinned corpus versions (docs/concepts/corpora.md, "Versions"), the
same objects as ``rl-export versions``."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query

from rl_export.corpora.layout import CorpusRef
from rl_export.corpora.versions import delete_version, list_versions, project_versions
from rl_export.export.versions import pin, table_format
from rl_export.formats.specs import check_name
from rl_export.model.errors import NoDataError, VersionError
from rl_export.web.api.deps import AdminCaller, ExportCaller, OrgPath, ProjectPath, Svc
from rl_export.web.errors import Conflict, Invalid, NotFound
from rl_export.web.models import VersionIn, VersionOut, VersionsOut

router = APIRouter(prefix="/api/v1/{org}/{project}", tags=["export"])

CorpusQuery = Annotated[str, Query(description="The corpus (human, evaluator, traces, ...)")]
AnyCorpusQuery = Annotated[str | None, Query(description="Only this corpus's versions")]


def _ref(org: str, project: str, corpus: str) -> CorpusRef:
    try:
        return CorpusRef(org, project, check_name("corpus", corpus))
    except ValueError as exc:
        raise Invalid(str(exc)) from None


@router.get("/versions", summary="The pinned versions of the project (or of one corpus)")
async def get_versions(
    *, org: OrgPath, project: ProjectPath, caller: ExportCaller, svc: Svc,
    corpus: AnyCorpusQuery = None,
) -> VersionsOut:  # fmt: skip
    if corpus is None:
        versions = await project_versions(svc.store, org, project)
    else:
        versions = await list_versions(svc.store, _ref(org, project, corpus))
    return VersionsOut(items=[VersionOut(**v.model_dump()) for v in versions])


@router.post("/versions", status_code=201, summary="Pin a corpus's current position")
async def post_version(
    *, org: OrgPath, project: ProjectPath, caller: AdminCaller, svc: Svc, body: VersionIn
) -> VersionOut:
    ref = _ref(org, project, body.corpus)
    try:
        version = await pin(svc.store, ref, body.name, body.note,
                            fmt=table_format(svc.settings, ref.corpus))  # fmt: skip
    except NoDataError as exc:
        raise NotFound(exc.detail) from None
    except VersionError as exc:
        if "already exists" in exc.detail:
            raise Conflict(exc.detail) from None
        raise Invalid(exc.detail) from None
    return VersionOut(**version.model_dump())


@router.delete("/versions/{name}", summary="Delete a pinned version")
async def remove_version(
    *, org: OrgPath, project: ProjectPath, name: str, caller: AdminCaller, svc: Svc,
    corpus: CorpusQuery,
) -> VersionOut:  # fmt: skip
    ref = _ref(org, project, corpus)
    try:
        version = await delete_version(svc.store, ref, name)
    except VersionError as exc:
        raise (Invalid if "is not valid" in exc.detail else NotFound)(exc.detail) from None
    return VersionOut(**version.model_dump())
