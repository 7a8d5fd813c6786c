"""Background export jobs' routes (scope ``export``): start one, ask how it goes, download it.

A job (:mod:`rl_export.web.jobs`) is checked like a direct export, then runs in the
instance's process pool; its status and file live in the object store, so any instance
answers for any job.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Annotated

from fastapi import APIRouter, Path
from fastapi.responses import StreamingResponse

from rl_export.formats.filters import parse_filters
from rl_export.model.errors import (
    FilterError,
    ObjectNotFoundError,
)
from rl_export.web.api.deps import (
    ExportCaller,
    OrgPath,
    ProjectPath,
    Svc,
)
from rl_export.web.api.exportparams import (
    EXPORT_CONTENT,
    asked_kinds,
    audit_read,
    chat_options,
    checked_export,
    disposition,
    needs_raw,
    question_columns_of,
    training_options,
    turn_mask,
    version_at,
)
from rl_export.web.errors import Invalid, NotFound
from rl_export.web.jobs import JobRequest, JobStatus, file_key
from rl_export.web.models import (
    ExportIn,
    JobOut,
)
from rl_export.web.services import Services

router = APIRouter(prefix="/api/v1/{org}/{project}", tags=["export"])

JobPath = Annotated[str, Path(description="The job's id (32 hex digits).")]


def _job_out(status: JobStatus) -> JobOut:
    download = None
    if status.status == "ready":
        download = f"/api/v1/{status.org}/{status.project}/exports/{status.id}/download"
    return JobOut(
        id=status.id, status=status.status, progress=status.progress, records=status.records,
        error=status.error, file_name=status.file_name, download=download,
        turns_outside=status.turns_outside, redactions=status.redactions, note=status.note,
        duplicates_removed=status.duplicates_removed, split_left_out=status.split_left_out,
    )  # fmt: skip


@router.post("/exports", status_code=202, summary="Start an export as a background job")
async def post_exports(
    *, org: OrgPath, project: ProjectPath, caller: ExportCaller, svc: Svc, body: ExportIn
) -> JobOut:
    joined = ",".join(body.columns) if isinstance(body.columns, list) else body.columns
    columns = await question_columns_of(svc, org, project, body.format, joined)
    mask_types = ",".join(body.mask_types) if isinstance(body.mask_types, list) else (
        body.mask_types)  # fmt: skip
    mask = turn_mask(body.format, body.mask_failed_turns, mask_types)
    chat, pairing = chat_options(body.format, body.chat_style, body.system, body.completion)
    asked = asked_kinds(svc, body.redact)
    redact = ",".join(asked) or "none"
    checked_export(body.format, columns, mask=mask, file=body.file, redact=redact, chat=chat,
             completion=pairing)  # fmt: skip
    try:
        parsed = parse_filters(body.filters)
    except FilterError as exc:
        raise Invalid(str(exc)) from None
    threshold = None if body.dedup_threshold is None else repr(body.dedup_threshold)
    training_options(split=body.split, splits=body.splits, split_by=body.split_by,
              split_salt=body.split_salt, dedup=body.dedup, dedup_threshold=threshold,
              dedup_on=body.dedup_on)  # fmt: skip
    raw = needs_raw(svc, caller, asked)
    await version_at(svc, org, project, body.source, body.version)  # 404 for an unknown version now
    request = JobRequest(
        source=body.source, format=body.format, filters=body.filters, columns=columns,
        mask_failed_turns=body.mask_failed_turns, mask_types=mask_types, file=body.file,
        redact=redact, chat_style=body.chat_style, system=body.system,
        completion=body.completion, split=body.split, splits=body.splits,
        split_by=body.split_by, split_salt=body.split_salt, dedup=body.dedup,
        dedup_threshold=threshold, dedup_on=body.dedup_on, version=body.version,
    )  # fmt: skip

    async def audit() -> None:  # once the job has its place; its status counts the rows
        await audit_read(svc, caller, "exports", parsed, asked, rows=None)

    started = await svc.jobs.start(org, project, request, caller.subject,
                                   before=audit if raw else None)  # fmt: skip
    return _job_out(started)


async def _job(svc: Services, org: str, project: str, job_id: str) -> JobStatus:
    status = await svc.jobs.get(org, project, job_id)
    if status is None:
        raise NotFound(f"no export job {job_id!r} in {org}/{project} (or it has expired)")
    return status


@router.get("/exports/{job_id}", summary="A background export's status and progress")
async def get_job(
    *, org: OrgPath, project: ProjectPath, caller: ExportCaller, svc: Svc, job_id: JobPath
) -> JobOut:
    return _job_out(await _job(svc, org, project, job_id))


@router.get(
    "/exports/{job_id}/download",
    summary="A finished background export's file",
    response_class=StreamingResponse,
    responses={200: {"content": EXPORT_CONTENT, "description": "The export's file."}},
)
async def get_job_download(
    *, org: OrgPath, project: ProjectPath, caller: ExportCaller, svc: Svc, job_id: JobPath
) -> StreamingResponse:
    status = await _job(svc, org, project, job_id)
    if status.status != "ready":
        raise NotFound(f"export job {job_id} is {status.status}: it has no file to download")
    chunks = svc.store.chunks(file_key(status))
    try:
        first = await anext(chunks, b"")
    except ObjectNotFoundError:
        raise NotFound(f"the file of export job {job_id} is gone (expired?)") from None

    async def body() -> AsyncIterator[bytes]:
        yield first
        async for chunk in chunks:
            yield chunk

    return StreamingResponse(
        body(),
        media_type=status.content_type,
        headers={"Content-Disposition": disposition(status.file_name)},
    )
