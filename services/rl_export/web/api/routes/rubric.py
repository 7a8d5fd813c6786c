"""``GET rubric`` (any scope) and ``PUT rubric`` (admin): the project's rubric and guidelines
(docs/guides/rubrics.md). Versions are kept by :mod:`rl_export.corpora.rubrics`; a PUT that
changes the rubric makes the next version, and labels keep the version they were made with."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated, Any

from fastapi import APIRouter, Query
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from rl_export.corpora.rubrics import StoredRubric
from rl_export.labeling.guidelines import render_guidelines
from rl_export.model.errors import StoreError
from rl_export.model.rubrics import MAX_GUIDELINES, MAX_QUESTIONS, RubricSpec
from rl_export.web.api.deps import AdminCaller, AnyCaller, OrgPath, ProjectPath, Svc
from rl_export.web.errors import NotFound, Unavailable
from rl_export.web.models import RubricOut
from rl_export.web.tokens import Caller

router = APIRouter(prefix="/api/v1/{org}/{project}", tags=["label"])


def rubric_out(found: StoredRubric, latest: int, caller: Caller, created: bool | None = None
               ) -> RubricOut:  # fmt: skip
    spec = found.spec
    return RubricOut(
        version=found.version, guidelines=spec.guidelines,
        guidelines_html=render_guidelines(spec.guidelines), questions=list(spec.questions),
        created_by=found.created_by, created_at=found.created_at, latest=latest,
        editable=caller.allows("admin"), created=created,
    )  # fmt: skip


@router.get("/rubric", summary="The project's rubric: its newest version, or ?version=N")
async def get_rubric(
    *, org: OrgPath, project: ProjectPath, caller: AnyCaller, svc: Svc,
    version: Annotated[int | None, Query(ge=0, le=1_000_000)] = None,
) -> RubricOut:  # fmt: skip
    try:
        latest = await svc.rubrics.latest_version(org, project)
        found = await svc.rubrics.get(org, project, latest if version is None else version)
    except StoreError as exc:
        raise Unavailable(f"the object store did not answer ({exc}); retry") from None
    if found is None:
        raise NotFound(f"{org}/{project} has no rubric version {version} (newest: {latest})")
    return rubric_out(found, latest, caller)


@router.put(
    "/rubric",
    summary="Change the project's rubric (admin): the next version, unless equal to the newest",
)
async def put_rubric(
    *, org: OrgPath, project: ProjectPath, caller: AdminCaller, svc: Svc, body: RubricSpec
) -> RubricOut:  # fmt: skip
    """422 naming what cannot work (a repeated name, a scale of more than 11 values, a
    rubric without a required scored question, ...)."""
    try:
        made, created = await svc.rubrics.create(
            org, project, body, by=caller.subject, now=datetime.now(UTC)
        )
    except StoreError as exc:
        raise Unavailable(f"the object store did not answer ({exc}); retry") from None
    return rubric_out(made, made.version, caller, created)


class PreviewIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    guidelines: str = Field("", max_length=MAX_GUIDELINES)
    questions: list[Any] = Field(default_factory=list, max_length=MAX_QUESTIONS)


class PreviewOut(BaseModel):
    guidelines_html: str = Field(description="The guidelines as labelers will see them.")
    problem: str | None = Field(description="Why PUT rubric would refuse it (null: it would not).")


@router.post("/rubric/preview", summary="A draft rubric as labelers would see it (admin)")
async def post_rubric_preview(
    *, org: OrgPath, project: ProjectPath, caller: AdminCaller, body: PreviewIn
) -> PreviewOut:
    """Renders the draft's guidelines and checks the draft as PUT rubric would; saves nothing."""
    problem = None
    try:
        RubricSpec.model_validate(body.model_dump())
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "rubric"
        problem = f"{where}: {str(first['msg']).removeprefix('Value error, ')}"
    return PreviewOut(guidelines_html=render_guidelines(body.guidelines), problem=problem)
