"""The Export tab's routes (scope ``export``): stats, the preview, exports and export jobs.

Stats and the preview are queries on this instance's index of the source's corpus; a direct
export streams from the corpora (the same code as ``rl-export export``) on a thread of its
own; a background export is a job (:mod:`rl_export.web.jobs`).

Redaction (``redact=``, default ``RL_EXPORT_REDACT``) applies to the preview, the direct
export and jobs; the preview and the direct export say what they replaced in the
``X-RL-Export-Redactions`` header (JSON, kind -> count), a job in its status. A header goes
before the body, so a direct export that redacts is made whole (spooled to a temporary file)
before it is sent; ``redact=none`` streams from the first chunk.
"""

from __future__ import annotations

import asyncio
import contextlib
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable
from typing import IO, Annotated, Any, TypeVar
from urllib.parse import quote

import orjson
from fastapi import APIRouter, Path, Query, Request, Response
from fastapi.responses import StreamingResponse

from rl_export.common.errors import ExportError, FilterError, NoDataError, ObjectNotFoundError
from rl_export.common.filters import Filters, parse_filters
from rl_export.common.formats import TABULAR_FORMATS, preference_pairs, render_row
from rl_export.common.redact import Redactor, add_counts, counts_header, parse_kinds, redactor
from rl_export.common.turns import TurnMask
from rl_export.corpora.store import ObjectStore
from rl_export.export import (
    ExportSummary,
    check_export,
    content_type,
    file_name,
    iter_export,
    parse_mask,
    source_ref,
)
from rl_export.web.api.deps import (
    ExportCaller,
    FiltersQuery,
    OrgPath,
    ProjectPath,
    Svc,
    corpus,
    index_state,
    query,
)
from rl_export.web.errors import ClientGone, Invalid, NotFound
from rl_export.web.index import QueryIndex
from rl_export.web.indexsql import BINS
from rl_export.web.jobs import JobRequest, JobStatus, file_key
from rl_export.web.models import (
    ExportIn,
    File,
    Format,
    HistogramBin,
    JobOut,
    RecordsOut,
    Source,
    StatsOut,
)
from rl_export.web.services import Services
from rl_export.web.streaming import ThreadStream

T = TypeVar("T")

router = APIRouter(prefix="/api/v1/{org}/{project}", tags=["export"])

SourceQuery = Annotated[Source, Query(description="human, evaluator or traces")]
FormatQuery = Annotated[Format, Query(description="A JSON Lines or tabular format")]
ColumnsQuery = Annotated[
    str | None, Query(description="Tabular formats: PATH[:HEADER],... in order")
]
JobPath = Annotated[str, Path(description="The job's id (32 hex digits).")]
MaskQuery = Annotated[
    bool,
    Query(
        description="messages, prompt_completion: a weight on every assistant message, 0 in "
        "turns with a failing outcome (DESIGN.md section 4)"
    ),
]
MaskTypesQuery = Annotated[
    str | None, Query(description="With mask_failed_turns: TYPE,... of the outcomes that mask")
]
FileQuery = Annotated[File, Query(description="rl_prompts: jsonl, or parquet (verl's files)")]
RedactQuery = Annotated[
    str | None,
    Query(
        description="Kinds to replace with [REDACTED:KIND]: secrets, email, phone, credit_card, "
        "iban, ip, pii, all or none (default: the service's RL_EXPORT_REDACT, secrets)"
    ),
]
REDACTIONS_HEADER = "X-RL-Export-Redactions"
_SPOOL_BYTES = 8 << 20  # a redacted direct export is held in memory up to this, then on disk

PREVIEW_MAX = 100
PAIRING_SAMPLE = 2_000  # preference previews pair among the first matching records
PREVIEW_SCAN = 5_000  # records a preview reads at most looking for rows of its format


def _checked(
    fmt: str,
    columns: str | list[str] | None,
    *,
    mask: TurnMask | None = None,
    file: str = "jsonl",
    redact: str | None = None,
) -> Any:
    try:
        return check_export(fmt, columns=columns, mask=mask, file=file, redact=redact)
    except ExportError as exc:
        raise Invalid(str(exc)) from None


def _mask(fmt: str, mask_failed_turns: bool, mask_types: str | list[str] | None) -> Any:
    """The turn mask of a request; 422 naming the parameter when it does not apply."""
    try:
        return parse_mask(fmt, mask_failed_turns, mask_types)
    except ExportError as exc:
        raise Invalid(f"{exc.setting.replace('-', '_')}: {exc.detail}") from None


def _kinds(svc: Services, redact: str | list[str] | None) -> tuple[str, ...]:
    """The kinds a request asks to redact (the service's default when it names none)."""
    try:
        return parse_kinds(redact if redact is not None else svc.settings.redact)
    except ExportError as exc:
        raise Invalid(str(exc)) from None


def _redactor(svc: Services, redact: str | None) -> Redactor | None:
    kinds = _kinds(svc, redact)
    return redactor(kinds) if kinds else None


def _count(svc: Services, headers: Any, counts: dict[str, int]) -> None:
    """Say what was replaced: the header, and the metric."""
    headers[REDACTIONS_HEADER] = counts_header(counts)
    for kind, n in counts.items():
        if n:
            svc.metrics.redactions.labels(kind).inc(n)


@router.get("/stats", summary="Stats of a source's latest records, with a reward histogram")
async def get_stats(
    *,
    org: OrgPath, project: ProjectPath, caller: ExportCaller, svc: Svc, source: SourceQuery,
    filters: FiltersQuery,
) -> StatsOut:  # fmt: skip
    followed = await corpus(svc, org, project, source)
    bins = BINS
    counts = [0] * bins
    records = rewarded = judged = passed = labeled = 0
    reward_sum = 0.0
    if followed.corpus_id is not None:
        stats = await query(svc.index.stats, followed.corpus_id, filters)
        records, rewarded, reward_sum = stats.records, stats.rewarded, stats.reward_sum
        judged, passed, labeled, counts = (stats.judged, stats.passed, stats.human_labeled,
                                           stats.histogram)  # fmt: skip
    return StatsOut(
        records=records,
        avg_reward=reward_sum / rewarded if rewarded else None,
        pass_rate=passed / judged if judged else None,
        human_labeled=labeled,
        reward_histogram=[
            HistogramBin(lo=round(n / bins, 10), hi=round((n + 1) / bins, 10), count=c)
            for n, c in enumerate(counts)
        ],
        index=index_state(followed, time.monotonic()),
    )


def _records(bodies: list[bytes]) -> list[dict[str, Any]]:
    return [orjson.loads(b) for b in bodies]


def _scrubbed(scrub: Redactor | None, item: dict[str, Any], counts: dict[str, int]) -> Any:
    if scrub is None:
        return item
    new, found = scrub.record(item)
    add_counts(counts, found)
    return new


async def _preview(
    index: QueryIndex,
    corpus_id: int,
    filters: Filters,
    *,
    fmt: str,
    columns: Any,
    size: int,
    mask: TurnMask | None = None,
    scrub: Redactor | None = None,
    counts: dict[str, int] | None = None,
) -> list[dict[str, Any]]:
    """The first ``size`` rows of the format over the matching records, in read order,
    redacted by ``scrub`` (what it replaced added to ``counts``)."""
    counts = {} if counts is None else counts
    if fmt == "preference":
        sample = _records(await query(index.preview, corpus_id, filters, PAIRING_SAMPLE))
        pairs = list(preference_pairs(sample))[:size]  # made on the prompts as stored
        return [_scrubbed(scrub, row, counts) for row in pairs]
    rows: list[dict[str, Any]] = []
    offset = 0
    while len(rows) < size and offset < PREVIEW_SCAN:
        # Some records have no row in a format (kto without a verdict): read on until enough,
        # within bounds (a format no record fits must not read the whole corpus).
        batch = _records(await query(index.preview, corpus_id, filters, size * 2, offset))
        if not batch:
            break
        offset += len(batch)
        for record in batch:
            if fmt in TABULAR_FORMATS:
                scrubbed = _scrubbed(scrub, record, counts)
                rows.append({c.header: c.value(scrubbed) for c in columns})
            else:
                row = render_row(fmt, record, mask=mask, index=len(rows))
                if row is not None:
                    rows.append(_scrubbed(scrub, row, counts))
            if len(rows) >= size:
                break
    return rows


@router.get("/records", summary="The first records of an export (the preview)")
async def get_records(
    *,
    org: OrgPath, project: ProjectPath, caller: ExportCaller, svc: Svc, source: SourceQuery,
    filters: FiltersQuery, response: Response, format: FormatQuery = "trajectory",
    columns: ColumnsQuery = None, mask_failed_turns: MaskQuery = False,
    mask_types: MaskTypesQuery = None, redact: RedactQuery = None,
) -> RecordsOut:  # fmt: skip
    mask = _mask(format, mask_failed_turns, mask_types)
    picked = _checked(format, columns, mask=mask)
    scrub = _redactor(svc, redact)
    size = filters.limit if filters.limit is not None else 10
    if not 1 <= size <= PREVIEW_MAX:
        raise Invalid(f"limit: a preview has 1 to {PREVIEW_MAX} rows, not {size}")
    followed = await corpus(svc, org, project, source)
    items: list[dict[str, Any]] = []
    counts = dict.fromkeys(scrub.kinds, 0) if scrub is not None else {}
    if followed.corpus_id is not None:
        items = await _preview(
            svc.index, followed.corpus_id, filters, fmt=format, columns=picked, size=size,
            mask=mask, scrub=scrub, counts=counts,
        )  # fmt: skip
    _count(svc, response.headers, counts)
    return RecordsOut(
        items=items,
        columns=[c.header for c in picked] if picked is not None else None,
        index=index_state(followed, time.monotonic()),
    )


def _disposition(name: str) -> str:
    return f"attachment; filename=\"{name}\"; filename*=UTF-8''{quote(name)}"


_EXPORT_CONTENT: dict[str, dict[str, Any]] = {
    "application/x-ndjson": {}, "text/csv": {}, "application/json": {}, "application/zip": {},
    "application/vnd.apache.parquet": {},
}  # fmt: skip


@router.get(
    "/export",
    summary="Stream an export (JSON Lines, CSV, JSON, Parquet or zip)",
    response_class=StreamingResponse,
    responses={200: {"content": _EXPORT_CONTENT, "description": "The export's file."}},
)
async def get_export(
    *,
    org: OrgPath, project: ProjectPath, caller: ExportCaller, svc: Svc, source: SourceQuery,
    filters: FiltersQuery, request: Request, format: FormatQuery = "trajectory",
    columns: ColumnsQuery = None, mask_failed_turns: MaskQuery = False,
    mask_types: MaskTypesQuery = None, file: FileQuery = "jsonl", redact: RedactQuery = None,
) -> StreamingResponse:  # fmt: skip
    mask = _mask(format, mask_failed_turns, mask_types)
    kinds = ",".join(_kinds(svc, redact)) or "none"
    _checked(format, columns, mask=mask, file=file, redact=kinds)
    ref = source_ref(org, project, source)
    summary = ExportSummary()

    def make(store: ObjectStore) -> AsyncIterator[bytes]:
        return iter_export(
            store, ref, format=format, filters=filters, columns=columns, mask=mask, file=file,
            redact=kinds, summary=summary,
        )  # fmt: skip

    # On the export pool, within the subject's share (429 over it: DESIGN.md section 10).
    stream = svc.exports.stream((org, project, caller.subject), make)
    try:
        # The first chunk before the answer starts: a corpus with no data is a 404, not a
        # broken 200. A client that leaves meanwhile stops the export.
        first = await _unless_gone(request, stream.next())
    except NoDataError as exc:
        stream.close()
        raise NotFound(str(exc)) from None
    except ExportError as exc:
        stream.close()
        raise Invalid(str(exc)) from None
    except BaseException:
        stream.close()
        raise

    headers = {"Content-Disposition": _disposition(file_name(ref, format, file))}
    if kinds != "none":
        # The counts are known at the end, and a header goes first: the export is made whole.
        spool = await _unless_gone(request, _spooled(stream, first))
        _count(svc, headers, summary.redactions)
        media = content_type(format, file)
        return StreamingResponse(_read(spool), media_type=media, headers=headers)

    async def body() -> AsyncIterator[bytes]:
        try:
            chunk = first
            while chunk is not None:
                yield chunk
                chunk = await stream.next()
        finally:
            stream.close()

    return StreamingResponse(body(), media_type=content_type(format, file), headers=headers)


async def _gone(request: Request) -> None:
    """Return once the client has disconnected (the request's body is empty: a GET)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def _unless_gone(request: Request, work: Awaitable[T]) -> T:
    """``work``'s result, or ClientGone (``work`` cancelled) if the client leaves first:
    before the answer starts, nothing else notices a disconnect."""
    doing = asyncio.ensure_future(work)
    watching = asyncio.ensure_future(_gone(request))
    try:
        await asyncio.wait({doing, watching}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        watching.cancel()
        if not doing.done():
            doing.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await doing
            raise ClientGone("the client went away before the export was sent")
    return doing.result()


async def _spooled(stream: ThreadStream, first: bytes | None) -> IO[bytes]:
    """The rest of a stream after its first chunk, in a temporary file (memory up to a bound)."""
    spool = tempfile.SpooledTemporaryFile(max_size=_SPOOL_BYTES)  # noqa: SIM115  # read later
    try:
        chunk = first
        while chunk is not None:
            spool.write(chunk)
            chunk = await stream.next()
    except BaseException:
        spool.close()
        raise
    finally:
        stream.close()
    spool.seek(0)
    return spool


async def _read(spool: IO[bytes]) -> AsyncIterator[bytes]:
    try:
        while piece := spool.read(1 << 20):
            yield piece
    finally:
        spool.close()


def _job_out(status: JobStatus) -> JobOut:
    download = None
    if status.status == "ready":
        download = f"/api/v1/{status.org}/{status.project}/exports/{status.id}/download"
    return JobOut(
        id=status.id, status=status.status, progress=status.progress, records=status.records,
        error=status.error, file_name=status.file_name, download=download,
        turns_outside=status.turns_outside, redactions=status.redactions,
    )  # fmt: skip


@router.post("/exports", status_code=202, summary="Start an export as a background job")
async def post_exports(
    *, org: OrgPath, project: ProjectPath, caller: ExportCaller, svc: Svc, body: ExportIn
) -> JobOut:
    columns = ",".join(body.columns) if isinstance(body.columns, list) else body.columns
    mask_types = ",".join(body.mask_types) if isinstance(body.mask_types, list) else (
        body.mask_types)  # fmt: skip
    mask = _mask(body.format, body.mask_failed_turns, mask_types)
    redact = ",".join(_kinds(svc, body.redact)) or "none"
    _checked(body.format, columns, mask=mask, file=body.file, redact=redact)
    try:
        parse_filters(body.filters)
    except FilterError as exc:
        raise Invalid(str(exc)) from None
    request = JobRequest(
        source=body.source, format=body.format, filters=body.filters, columns=columns,
        mask_failed_turns=body.mask_failed_turns, mask_types=mask_types, file=body.file,
        redact=redact,
    )  # fmt: skip
    started = await svc.jobs.start(org, project, request, caller.subject)
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
    responses={200: {"content": _EXPORT_CONTENT, "description": "The export's file."}},
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
        headers={"Content-Disposition": _disposition(status.file_name)},
    )
