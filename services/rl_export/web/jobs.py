"""Background export jobs: run outside the API's process, status and file in the object store.

A job (``POST exports``) is checked like a direct export, given an id, and its status written
to ``_exports/<org>/<project>/<id>/status.json`` before the API answers 202. Then:

1. One of the instance's export processes (a ``spawn`` process pool, ``web_export_processes``)
   runs the export (:func:`rl_export.export.write_export`, the same code as ``rl-export
   export``) into a local temporary file, rewriting the status with its progress every
   ``web_export_heartbeat_s``.
2. The file goes to ``_exports/<org>/<project>/<id>/<file name>``, its lineage manifest
   (:mod:`rl_export.export.lineage`) beside it as ``<file name>.manifest.json``, then the
   status says ``ready`` (or ``failed`` with the message).
3. Any instance answers ``GET exports/{id}`` from the status object: a ``processing`` job
   whose status has not been rewritten for ``stale_after_s`` lost its process (a restart, a
   crash) and is reported, and recorded, as failed. Finished jobs are deleted after
   ``web_export_retention_s`` (a sweep every few minutes on every instance; a job past its
   retention is not found even before the sweep).

A job belongs to the subject that made it (its status names them): :func:`may_see` is the
rule every route applies, and a job that reads with a redaction weaker than the project's
default (``raw``) is never shown to another subject, admins included (docs/guides/security.md).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import multiprocessing
import tempfile
import uuid
from collections.abc import Awaitable, Callable, Mapping
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from rl_export.corpora.store import ObjectStore, open_store
from rl_export.export import (
    content_type,
    file_name,
    parse_chat_style,
    parse_completion,
    parse_dedup,
    parse_mask,
    parse_split,
    source_ref,
    write_export,
)
from rl_export.export.attachments import AttachmentPolicy
from rl_export.export.lineage import MANIFEST_SUFFIX, manifest_path
from rl_export.export.requests import parse_on_unrenderable
from rl_export.export.templated import TemplateChoice
from rl_export.export.versions import pinned
from rl_export.formats.filters import parse_filters
from rl_export.formats.templates import load_template
from rl_export.model.codec import dumps, loads
from rl_export.model.errors import ObjectNotFoundError, StoreError
from rl_export.model.events import UtcDatetime
from rl_export.runtime.metrics import REDACTION_KINDS, WebMetrics
from rl_export.runtime.orphans import end_with_parent
from rl_export.runtime.settings import Settings
from rl_export.web.limits import Slot, SubjectLimit

log = logging.getLogger(__name__)

PREFIX = "_exports/"
JobState = Literal["processing", "ready", "failed"]
_ID = r"^[0-9a-f]{32}$"
_READ_AT_ONCE = 16  # status objects a listing reads concurrently


class JobRequest(BaseModel):
    """What to export (checked before the job is created)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    source: str
    format: str
    filters: dict[str, str | list[str]] = Field(default_factory=dict)
    columns: str | None = None
    mask_failed_turns: bool = False
    mask_types: str | None = None
    file: str = "jsonl"
    redact: str | None = None  # kinds, "none"; None (older jobs): the service's default
    chat_style: str | None = None  # None: hf (the chat formats)
    system: str | None = None  # None: keep
    chat_template: str | None = None  # a registered or built-in template's name
    on_unrenderable: str | None = None  # with a chat template; None: skip
    completion: str | None = None  # preference; None: turn
    # Training sets (docs/guides/exports.md), as the flags' text: None when not asked.
    split: str | None = None
    splits: str | None = None
    split_by: str | None = None
    split_salt: str | None = None
    dedup: str | None = None
    dedup_threshold: str | None = None
    dedup_on: str | None = None
    version: str | None = None  # a pinned version of the source corpus; None: the latest


class JobStatus(BaseModel):
    """The status object of a job."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    id: str = Field(pattern=_ID)
    org: str
    project: str
    # Who made the job (a token's subject); None: a job made before jobs had owners, which
    # only an admin sees. ``raw``: it reads with a redaction weaker than the default.
    subject: str | None = None
    raw: bool = False
    status: JobState
    progress: float = Field(ge=0, le=1)
    records: int | None = None
    turns_outside: int | None = None
    error: str | None = None
    request: JobRequest
    file_name: str
    content_type: str
    bytes: int | None = None
    redactions: dict[str, int] | None = None  # substrings replaced per kind, once ready
    note: str | None = None  # once ready: why the export has no row
    duplicates_removed: int | None = None  # with dedup, once ready
    split_left_out: int | None = None  # with a split, once ready: rows of other splits
    unrenderable: dict[str, int] | None = None  # with a chat template, once ready
    adaptations: list[str] | None = None  # with a chat template, once ready
    created_at: UtcDatetime
    updated_at: UtcDatetime
    finished_at: UtcDatetime | None = None


def job_prefix(org: str, project: str, job_id: str) -> str:
    return f"{PREFIX}{org}/{project}/{job_id}/"


def status_key(org: str, project: str, job_id: str) -> str:
    return job_prefix(org, project, job_id) + "status.json"


def file_key(status: JobStatus) -> str:
    return job_prefix(status.org, status.project, status.id) + status.file_name


def is_job_id(text: str) -> bool:
    return len(text) == 32 and all(c in "0123456789abcdef" for c in text)


async def write_status(store: ObjectStore, status: JobStatus) -> None:
    key = status_key(status.org, status.project, status.id)
    await store.put(key, dumps(status.model_dump(mode="json")))


async def read_status(store: ObjectStore, org: str, project: str, job_id: str) -> JobStatus | None:
    try:
        data = await store.get(status_key(org, project, job_id))
    except ObjectNotFoundError:
        return None
    try:
        return JobStatus.model_validate(loads(data))
    except (ValueError, ValidationError):
        return None


def new_status(
    org: str, project: str, request: JobRequest, now: datetime, *, subject: str, raw: bool
) -> JobStatus:
    """A fresh ``processing`` status of ``subject``'s job (the request already checked)."""
    ref = source_ref(org, project, request.source)
    return JobStatus(
        id=uuid.uuid4().hex, org=org, project=project, subject=subject, raw=raw,
        status="processing", progress=0.0, request=request,
        file_name=file_name(ref, request.format, request.file),
        content_type=content_type(request.format, request.file), created_at=now,
        updated_at=now,
    )  # fmt: skip


def may_see(status: JobStatus, subject: str, *, admin: bool, raw: bool) -> bool:
    """Whether a caller (``subject``, holding the ``admin`` scope or not) may see a job and
    download its file: the subject that made it may; an admin of the project may see
    another subject's job unless it is ``raw`` (it reads with a redaction weaker than the
    project's default). Anyone else is told there is no such job."""
    if status.subject is not None and status.subject == subject:
        return True
    return admin and not raw


# --- in the export process ------------------------------------------------------------------


def run_job(
    settings_json: Mapping[str, Any], status_json: Mapping[str, Any]
) -> tuple[str, dict[str, int]]:
    """A job, in an export process: write the file, then the final status; return it and
    what the job redacted (the parent counts it in its metric)."""
    settings = Settings.model_validate(settings_json)
    status = JobStatus.model_validate(status_json)
    return asyncio.run(_run(settings, status))


async def _run(settings: Settings, status: JobStatus) -> tuple[JobState, dict[str, int]]:
    store = open_store(settings.store_url)
    progress = [0, 0]  # records read, records the view holds (0 until it is open)

    def note(done: int, total: int | None) -> None:
        progress[0], progress[1] = done, total or 0

    async def heartbeat() -> None:
        while True:
            await asyncio.sleep(settings.web_export_heartbeat_s)
            done, total = progress
            fraction = min(done / total, 0.99) if total else 0.0
            with contextlib.suppress(StoreError):
                await write_status(store, status.model_copy(update={
                    "progress": fraction, "updated_at": datetime.now(UTC)}))  # fmt: skip

    beating = asyncio.create_task(heartbeat())
    try:
        request = status.request
        with tempfile.TemporaryDirectory(prefix="rl-export-job-") as folder:
            out = Path(folder) / status.file_name
            mask = parse_mask(request.format, request.mask_failed_turns, request.mask_types)
            split = parse_split(request.split, request.splits, request.split_by,
                                request.split_salt)  # fmt: skip
            dedup = parse_dedup(request.dedup, request.dedup_threshold, request.dedup_on)
            ref = source_ref(status.org, status.project, request.source)
            at = None if request.version is None else (
                await pinned(store, ref, request.version, None)).at  # fmt: skip
            chat = parse_chat_style(request.format, request.chat_style, request.system)
            template = None
            if request.chat_template is not None:  # checked when the job was asked for
                loaded = load_template(request.chat_template, folder=settings.chat_templates,
                                       files=False)  # fmt: skip
                template = TemplateChoice(loaded, parse_on_unrenderable(
                    request.on_unrenderable, True))  # fmt: skip
            summary = await write_export(
                store, ref,
                format=request.format, out=out, filters=parse_filters(request.filters),
                columns=request.columns, mask=mask, file=request.file, progress=note,
                redact=request.redact if request.redact is not None else settings.redact,
                chat=chat, completion=parse_completion(request.format, request.completion),
                split=split, dedup=dedup,
                attachments=AttachmentPolicy.from_settings(settings), at=at, template=template,
            )  # fmt: skip
            beating.cancel()
            await store.put_file(file_key(status), out)
            # Lineage beside the file: what it read, how, and its sha256.
            await store.put_file(file_key(status) + MANIFEST_SUFFIX, manifest_path(out))
            size = out.stat().st_size
        now = datetime.now(UTC)
        final = status.model_copy(update={
            "status": "ready", "progress": 1.0, "records": summary.records, "bytes": size,
            "redactions": summary.redactions, "updated_at": now, "finished_at": now,
            "turns_outside": summary.turns_outside if mask is not None else None,
            "note": summary.why_empty(),
            "duplicates_removed": summary.duplicates_removed if dedup is not None else None,
            "split_left_out": summary.split_left_out if split is not None else None,
            "unrenderable": summary.unrenderable if template is not None else None,
            "adaptations": summary.adaptations if template is not None else None,
        })  # fmt: skip
    except Exception as exc:  # any failure of the job is the job's status
        log.warning("export job %s failed: %s", status.id, exc)
        now = datetime.now(UTC)
        final = status.model_copy(update={
            "status": "failed", "error": str(exc) or type(exc).__name__, "updated_at": now,
            "finished_at": now,
        })  # fmt: skip
    finally:
        beating.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await beating
    try:
        await write_status(store, final)
    finally:
        await store.close()
    return final.status, final.redactions or {}


# --- in the API's process -------------------------------------------------------------------


class Jobs:
    """Starts jobs in the export processes and answers for any job from the store."""

    def __init__(self, settings: Settings, store: ObjectStore, metrics: WebMetrics) -> None:
        self.settings = settings
        self.store = store
        self.metrics = metrics
        self.stale_after_s = max(30.0, 10 * settings.web_export_heartbeat_s)
        self._pool: ProcessPoolExecutor | None = None
        self._running: set[asyncio.Task[None]] = set()
        self.limit = SubjectLimit(
            settings.web_jobs_per_subject,
            kind="jobs",
            what="export jobs queued or running",
            retry_after_s=30,
        )

    def _executor(self) -> ProcessPoolExecutor:
        if self._pool is None:
            self._pool = ProcessPoolExecutor(
                max_workers=self.settings.web_export_processes,
                mp_context=multiprocessing.get_context("spawn"),
                initializer=end_with_parent,  # a killed web process's jobs end, not wait
            )
        return self._pool

    async def start(
        self, org: str, project: str, request: JobRequest, subject: str, *, raw: bool = False,
        before: Callable[[str], Awaitable[None]] | None = None,
    ) -> JobStatus:  # fmt: skip
        """Record ``subject``'s job as processing, then run it in an export process. TooMany
        when ``subject`` has ``web_jobs_per_subject`` jobs queued or running here already;
        ``before(job_id)`` (a raw read's audit entry) runs once the job has its place, before
        it is recorded, and a failure there starts nothing."""
        slot = self.limit.acquire((org, project, subject))
        status = new_status(org, project, request, datetime.now(UTC), subject=subject, raw=raw)
        try:
            if before is not None:
                await before(status.id)
            await write_status(self.store, status)
        except BaseException:
            slot.release()
            raise
        task = asyncio.create_task(self._watch(status, slot))
        self._running.add(task)
        task.add_done_callback(self._running.discard)
        self.metrics.jobs.labels("started").inc()
        return status

    async def _watch(self, status: JobStatus, slot: Slot) -> None:
        self.metrics.jobs_running.inc()
        try:
            loop = asyncio.get_running_loop()
            settings = self.settings.model_dump(mode="json")
            outcome, redactions = await loop.run_in_executor(
                self._executor(), run_job, settings, status.model_dump(mode="json")
            )
            for kind, n in redactions.items():  # the job's process has no metrics of ours
                if n and kind in REDACTION_KINDS:  # not a zip's count of unscanned attachments
                    self.metrics.redactions.labels(kind).inc(n)
        except Exception as exc:  # the job failed outside its own handling
            if isinstance(exc, BrokenProcessPool):
                self._pool = None  # a broken pool takes no more work: the next job makes one
            outcome = "failed"
            now = datetime.now(UTC)
            with contextlib.suppress(StoreError):
                await write_status(self.store, status.model_copy(update={
                    "status": "failed", "error": f"the export process stopped ({exc})",
                    "updated_at": now, "finished_at": now,
                }))  # fmt: skip
        finally:
            slot.release()
            self.metrics.jobs_running.dec()
        self.metrics.jobs.labels(outcome).inc()

    async def get(self, org: str, project: str, job_id: str) -> JobStatus | None:
        """The job's status as any instance sees it (None: unknown or expired)."""
        if not is_job_id(job_id):
            return None
        status = await read_status(self.store, org, project, job_id)
        if status is None:
            return None
        now = datetime.now(UTC)
        if status.finished_at is not None:
            age = (now - status.finished_at).total_seconds()
            if age > self.settings.web_export_retention_s:
                await self._delete(status)
                return None
            return status
        if (now - status.updated_at).total_seconds() > self.stale_after_s:
            status = status.model_copy(update={
                "status": "failed", "finished_at": now, "updated_at": now,
                "error": "the export stopped without finishing (its process or instance went "
                "away); start it again",
            })  # fmt: skip
            with contextlib.suppress(StoreError):
                await write_status(self.store, status)
        return status

    async def of_project(self, org: str, project: str) -> list[JobStatus]:
        """The project's jobs any instance sees (expired ones left out), newest first."""
        prefix = f"{PREFIX}{org}/{project}/"
        ids = sorted({
            parts[0] for key in await self.store.list(prefix)
            if len(parts := key[len(prefix):].split("/")) == 2 and parts[1] == "status.json"
        })  # fmt: skip
        found: list[JobStatus] = []
        for start in range(0, len(ids), _READ_AT_ONCE):
            batch = ids[start : start + _READ_AT_ONCE]
            found += [s for s in await asyncio.gather(*(self.get(org, project, i) for i in batch))
                      if s is not None]  # fmt: skip
        return sorted(found, key=lambda s: (s.created_at, s.id), reverse=True)

    async def _delete(self, status: JobStatus) -> None:
        with contextlib.suppress(StoreError):
            for key in await self.store.list(job_prefix(status.org, status.project, status.id)):
                await self.store.delete(key)

    async def sweep(self) -> int:
        """Delete the jobs past their retention; return how many."""
        seen: set[tuple[str, str, str]] = set()
        for key in await self.store.list(PREFIX):
            parts = key[len(PREFIX) :].split("/")
            if len(parts) == 4 and parts[3] == "status.json":
                seen.add((parts[0], parts[1], parts[2]))
        removed = 0
        for org, project, job_id in sorted(seen):
            status = await read_status(self.store, org, project, job_id)
            if status is None or status.finished_at is None:
                continue
            age = (datetime.now(UTC) - status.finished_at).total_seconds()
            if age > self.settings.web_export_retention_s:
                await self._delete(status)
                removed += 1
        return removed

    async def sweep_forever(self, stop: asyncio.Event, interval_s: float = 300.0) -> None:
        while not stop.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), interval_s)
            try:
                removed = await self.sweep()
            except StoreError as exc:
                log.warning("export jobs: sweep failed, will retry: %s", exc)
                continue
            if removed:
                log.info("export jobs: removed %d past their retention", removed)

    async def close(self) -> None:
        """Stop the export processes: a job still running is left ``processing`` and is
        reported failed once its status goes stale."""
        pool, self._pool = self._pool, None
        if pool is not None:
            # ProcessPoolExecutor cannot stop a running job (Python 3.14 adds
            # terminate_workers); terminate the processes we started ourselves.
            for process in list(getattr(pool, "_processes", {}).values()):
                process.terminate()
            await asyncio.to_thread(pool.shutdown, wait=True, cancel_futures=True)
        for task in list(self._running):
            task.cancel()
