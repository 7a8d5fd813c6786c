"""Background export jobs' routes (scope ``export``): start one, list them, ask how one goes,
download it.

A job (:mod:`rl_export.web.jobs`) is checked like a direct export, then runs in the
instance's process pool; its status and file live in the object store, so any instance
answers for any job.

A job belongs to the subject that made it (:func:`~rl_export.web.jobs.may_see`): another
subject is told there is no such job (404), but an admin of the project sees and downloads
jobs that are not raw. A raw job (a redaction weaker than the project's default) needs the
``raw`` scope again at download, and each download is audited with the job's id, before the
first byte leaves.
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
    require_raw,
    template_choice,
    training_options,
    turn_mask,
    version_at,
    weaker_than_default,
)
from rl_export.web.errors import Invalid, NotFound
from rl_export.web.jobs import JobRequest, JobStatus, file_key, may_see
from rl_export.web.models import (
    ExportIn,
    JobOut,
    JobsOut,
)
from rl_export.web.services import Services
from rl_export.web.tokens import Caller

router = APIRouter(prefix="/api/v1/{org}/{project}", tags=["export"])

JobPath = Annotated[str, Path(description="The job's id (32 hex digits).")]


def _job_out(status: JobStatus) -> JobOut:
    download = None
    if status.status == "ready":
        download = f"/api/v1/{status.org}/{status.project}/exports/{status.id}/download"
    return JobOut(
        id=status.id, subject=status.subject, raw=status.raw, created_at=stamp(status),
        status=status.status, progress=status.progress, records=status.records,
        error=status.error, file_name=status.file_name, download=download,
        turns_outside=status.turns_outside, redactions=status.redactions, note=status.note,
        duplicates_removed=status.duplicates_removed, split_left_out=status.split_left_out,
        unrenderable=status.unrenderable, adaptations=status.adaptations,
    )  # fmt: skip


def stamp(status: JobStatus) -> str:
    return status.created_at.isoformat(timespec="milliseconds").replace("+00:00", "Z")


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
    template = template_choice(svc, body.format, chat, body.chat_template, body.on_unrenderable)
    asked = asked_kinds(svc, body.redact)
    redact = ",".join(asked) or "none"
    checked_export(body.format, columns, mask=mask, file=body.file, redact=redact, chat=chat,
                   completion=pairing, template=template is not None)  # fmt: skip
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
        chat_template=body.chat_template, on_unrenderable=body.on_unrenderable,
        split_by=body.split_by, split_salt=body.split_salt, dedup=body.dedup,
        dedup_threshold=threshold, dedup_on=body.dedup_on, version=body.version,
    )  # fmt: skip

    async def audit(job_id: str) -> None:  # once the job has its place; its status counts rows
        await audit_read(svc, caller, "exports", parsed, asked, rows=None, job=job_id)

    started = await svc.jobs.start(org, project, request, caller.subject, raw=raw,
                                   before=audit if raw else None)  # fmt: skip
    return _job_out(started)


@router.get(
    "/exports",
    summary="The caller's background exports, newest first (an admin's: every job of the "
    "project but other subjects' raw ones)",
)
async def get_jobs(
    *, org: OrgPath, project: ProjectPath, caller: ExportCaller, svc: Svc
) -> JobsOut:
    jobs = await svc.jobs.of_project(org, project)
    return JobsOut(items=[_job_out(s) for s in jobs if _sees(svc, caller, s)])


def _raw(svc: Services, status: JobStatus) -> bool:
    """Whether a job is raw: made so, or redacting less than the project's default now."""
    return status.raw or weaker_than_default(svc, asked_kinds(svc, status.request.redact))


def _sees(svc: Services, caller: Caller, status: JobStatus) -> bool:
    return may_see(status, caller.subject, admin=caller.allows("admin"), raw=_raw(svc, status))


async def _job(svc: Services, caller: Caller, org: str, project: str, job_id: str) -> JobStatus:
    """The job, when the caller may see it; 404 otherwise (whether it exists or not)."""
    status = await svc.jobs.get(org, project, job_id)
    if status is None or not _sees(svc, caller, status):
        raise NotFound(f"no export job {job_id!r} in {org}/{project} (or it has expired)")
    return status


@router.get("/exports/{job_id}", summary="A background export's status and progress")
async def get_job(
    *, org: OrgPath, project: ProjectPath, caller: ExportCaller, svc: Svc, job_id: JobPath
) -> JobOut:
    return _job_out(await _job(svc, caller, org, project, job_id))


@router.get(
    "/exports/{job_id}/download",
    summary="A finished background export's file",
    response_class=StreamingResponse,
    responses={200: {"content": EXPORT_CONTENT, "description": "The export's file."}},
)
async def get_job_download(
    *, org: OrgPath, project: ProjectPath, caller: ExportCaller, svc: Svc, job_id: JobPath
) -> StreamingResponse:
    status = await _job(svc, caller, org, project, job_id)
    if status.status != "ready":
        raise NotFound(f"export job {job_id} is {status.status}: it has no file to download")
    kinds = asked_kinds(svc, status.request.redact)
    raw = _raw(svc, status)
    if raw:
        require_raw(svc, caller, kinds)
    chunks = svc.store.chunks(file_key(status))
    try:
        first = await anext(chunks, b"")
    except ObjectNotFoundError:
        raise NotFound(f"the file of export job {job_id} is gone (expired?)") from None
    if raw:  # before any byte leaves: 503 when the entry is not written
        filters = parse_filters(status.request.filters)
        await audit_read(svc, caller, "exports/download", filters, kinds,
                         rows=status.records, job=status.id)  # fmt: skip

    async def body() -> AsyncIterator[bytes]:
        yield first
        async for chunk in chunks:
            yield chunk

    return StreamingResponse(
        body(),
        media_type=status.content_type,
        headers={"Content-Disposition": disposition(status.file_name)},
    )
