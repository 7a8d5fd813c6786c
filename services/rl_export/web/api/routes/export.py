"""The Export tab's routes (scope ``export``): stats, the preview, exports and export jobs.

Stats and the preview are queries on this instance's index of the source's corpus; a direct
export streams from the corpora (the same code as ``rl-export export``) on a thread of its
own; a background export is a job (:mod:`rl_export.web.jobs`).

Redaction (``redact=``, default ``RL_EXPORT_REDACT``) applies to the preview, the direct
export and jobs; the preview and the direct export say what they replaced in the
``X-RL-Export-Redactions`` header (JSON, kind -> count), a job in its status. A header goes
before the body, so a direct export that redacts is made whole (spooled to a temporary file)
before it is sent.

Raw access (docs/guides/security.md): a redaction weaker than the project's default
(``redact=none``, or kinds that do not cover ``RL_EXPORT_REDACT``'s) needs the ``raw`` scope
(403 ``raw_required``, whatever the other scopes) and is audited (:mod:`rl_export.web.audit`)
before its data leaves: a raw direct export is made whole first too, so its entry holds the
rows read.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Awaitable
from datetime import UTC, datetime
from typing import Annotated, Any, TypeVar
from urllib.parse import quote

import orjson
from fastapi import APIRouter, Path, Query, Request, Response
from fastapi.responses import StreamingResponse

from rl_export.common.chat import HF, Chat, ChatStyle, SystemMode
from rl_export.common.errors import (
    ExportError,
    FilterError,
    NoDataError,
    ObjectNotFoundError,
    StoreError,
    VersionError,
)
from rl_export.common.filters import Filters, parse_filters
from rl_export.common.formats import TABULAR_FORMATS, Completion, preference_pairs, render_row
from rl_export.common.metrics import REDACTION_KINDS
from rl_export.common.redact import Redactor, add_counts, counts_header, parse_kinds, redactor
from rl_export.common.turns import TurnMask
from rl_export.corpora.store import ObjectStore
from rl_export.export import (
    Dedup,
    ExportSummary,
    Split,
    check_export,
    content_type,
    file_name,
    iter_export,
    parse_chat_style,
    parse_completion,
    parse_dedup,
    parse_mask,
    parse_split,
    source_ref,
)
from rl_export.export import preview as export_preview
from rl_export.export import stats as export_stats
from rl_export.export.attachments import AttachmentPolicy
from rl_export.export.versions import pinned
from rl_export.web import audit
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
from rl_export.web.audit import AuditEntry
from rl_export.web.errors import ClientGone, Invalid, NotFound, RawRequired, Unavailable
from rl_export.web.index import QueryIndex
from rl_export.web.indexsql import BINS
from rl_export.web.jobs import JobRequest, JobStatus, file_key
from rl_export.web.models import (
    CHAT_STYLE_HELP,
    COMPLETION_HELP,
    SYSTEM_HELP,
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
from rl_export.web.streaming import read_spool, spooled
from rl_export.web.tokens import Caller

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
        "turns with a failing outcome (docs/guides/exports.md)"
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
ChatStyleQuery = Annotated[ChatStyle | None, Query(description=CHAT_STYLE_HELP)]
SystemQuery = Annotated[SystemMode | None, Query(description=SYSTEM_HELP)]
CompletionQuery = Annotated[Completion | None, Query(description=COMPLETION_HELP)]
REDACTIONS_HEADER = "X-RL-Export-Redactions"
DUPLICATES_HEADER = "X-RL-Export-Duplicates-Removed"
SplitQuery = Annotated[str | None, Query(description="Keep the rows of this split")]
SplitsQuery = Annotated[
    str | None, Query(description="NAME=FRACTION,... summing to 1 (train=0.9,eval=0.1)")
]
SplitByQuery = Annotated[
    str | None, Query(description="What decides a row's split: trace_id, a field, metadata.KEY")
]
SaltQuery = Annotated[str | None, Query(description="A salt for the split's hash")]
DedupQuery = Annotated[
    str | None, Query(description="exact or near: one row per group of duplicates")
]
ThresholdQuery = Annotated[
    str | None, Query(description="near: least estimated Jaccard similarity (0, 1]; 0.85")
]
VersionQuery = Annotated[
    str | None, Query(description="Read the corpus at this pinned version (GET versions)")
]
DedupOnQuery = Annotated[
    str | None, Query(description="conversation (default) or prompt: the text compared")
]

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
    chat: Chat = HF,
    completion: Completion = "turn",
) -> Any:
    try:
        return check_export(fmt, columns=columns, mask=mask, file=file, redact=redact,
                            chat=chat, completion=completion)  # fmt: skip
    except ExportError as exc:
        raise Invalid(str(exc)) from None


def _chat(
    fmt: str, chat_style: str | None, system: str | None, completion: str | None
) -> tuple[Chat, Completion]:
    """The chat style and preference completion of a request; 422 naming the parameter
    when one does not apply to the format."""
    try:
        return (parse_chat_style(fmt, chat_style, system),
                parse_completion(fmt, completion))  # fmt: skip
    except ExportError as exc:
        raise Invalid(f"{exc.setting.replace('-', '_')}: {exc.detail}") from None


def _mask(fmt: str, mask_failed_turns: bool, mask_types: str | list[str] | None) -> Any:
    """The turn mask of a request; 422 naming the parameter when it does not apply."""
    try:
        return parse_mask(fmt, mask_failed_turns, mask_types)
    except ExportError as exc:
        raise Invalid(f"{exc.setting.replace('-', '_')}: {exc.detail}") from None


def _training(
    *, split: str | None, splits: str | None, split_by: str | None, split_salt: str | None,
    dedup: str | None, dedup_threshold: str | None, dedup_on: str | None,
) -> tuple[Split | None, Dedup | None]:  # fmt: skip
    """A request's split and dedup; 422 naming the parameter for a bad one."""
    try:
        return (parse_split(split, splits, split_by, split_salt),
                parse_dedup(dedup, dedup_threshold, dedup_on))  # fmt: skip
    except ExportError as exc:
        raise Invalid(f"{exc.setting.replace('-', '_')}: {exc.detail}") from None


async def _at(svc: Services, org: str, project: str, source: str, version: str | None) -> Any:
    """The view position of ``version`` (None: the latest view); 404 for an unknown one."""
    if version is None:
        return None
    try:
        return (await pinned(svc.store, source_ref(org, project, source), version, None)).at
    except VersionError as exc:
        raise (Invalid if "is not valid" in exc.detail else NotFound)(exc.detail) from None


def _kinds(svc: Services, redact: str | list[str] | None) -> tuple[str, ...]:
    """The kinds a request asks to redact (the service's default when it names none)."""
    try:
        return parse_kinds(redact if redact is not None else svc.settings.redact)
    except ExportError as exc:
        raise Invalid(str(exc)) from None


def _raw(svc: Services, caller: Caller, kinds: tuple[str, ...]) -> bool:
    """Whether a read redacts less than the project's default (``RL_EXPORT_REDACT``): then
    it needs the ``raw`` scope (403 ``raw_required`` without it) and is audited."""
    default = parse_kinds(svc.settings.redact)
    if set(default) <= set(kinds):
        return False
    if not caller.allows("raw"):
        svc.metrics.auth_failures.labels("scope").inc()
        asked = ",".join(kinds) or "none"
        raise RawRequired(
            f"redact={asked} redacts less than this project's default "
            f"({','.join(default)}): that needs a token with the raw scope"
        )
    return True


async def _audit(
    svc: Services,
    caller: Caller,
    route: str,
    filters: Filters,
    kinds: tuple[str, ...],
    *,
    rows: int | None,
    job: str | None = None,
) -> None:
    """Append the raw read to the project's audit log before its data leaves (503 when the
    store does not take the entry: nothing unaudited is served) and count it."""
    entry = AuditEntry(
        time=datetime.now(UTC), org=caller.org, project=caller.project, subject=caller.subject,
        token_id=caller.token_id, route=route, filters=filters.to_params(), kinds=list(kinds),
        rows=rows, job=job,
    )  # fmt: skip
    try:
        await audit.append(svc.store, entry)
    except StoreError:
        raise Unavailable("the audit log could not be written, so nothing was read") from None
    svc.metrics.raw_reads.labels(route).inc()


def _count(svc: Services, headers: Any, counts: dict[str, int]) -> None:
    """Say what was replaced: the header, and the metric (of the redaction kinds; a zip's
    ``unscanned`` attachments are in the header only)."""
    headers[REDACTIONS_HEADER] = counts_header(counts)
    for kind, n in counts.items():
        if n and kind in REDACTION_KINDS:
            svc.metrics.redactions.labels(kind).inc(n)


@router.get("/stats", summary="Stats of a source's latest records, with a reward histogram")
async def get_stats(
    *,
    org: OrgPath, project: ProjectPath, caller: ExportCaller, svc: Svc, source: SourceQuery,
    filters: FiltersQuery, version: VersionQuery = None,
) -> StatsOut:  # fmt: skip
    followed = await corpus(svc, org, project, source)
    bins = BINS
    counts = [0] * bins
    records = rewarded = judged = passed = labeled = 0
    reward_sum = 0.0
    at = await _at(svc, org, project, source, version)
    # The index holds no metadata and only the latest view: read the corpus itself.
    if filters.metadata or at is not None:
        scanned = await _scanned_stats(svc, org, project, source, filters, at=at)
        return StatsOut(**scanned, index=index_state(followed, time.monotonic()))
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


async def _scanned_stats(
    svc: Services, org: str, project: str, source: str, filters: Filters, *, at: Any = None
) -> dict[str, Any]:
    """Stats read from the corpus (not the index), for filters the index cannot answer and
    for a pinned version (``at``)."""
    try:
        return await export_stats(
            svc.store,
            source_ref(org, project, source),
            filters=filters,
            histogram_bins=BINS,
            at=at,
        )
    except NoDataError:
        return {
            "records": 0, "avg_reward": None, "pass_rate": None, "human_labeled": 0,
            "reward_histogram": [
                {"lo": round(n / BINS, 10), "hi": round((n + 1) / BINS, 10), "count": 0}
                for n in range(BINS)
            ],
        }  # fmt: skip


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
    chat: Chat = HF,
    completion: Completion = "turn",
) -> list[dict[str, Any]]:
    """The first ``size`` rows of the format over the matching records, in read order,
    redacted by ``scrub`` (what it replaced added to ``counts``)."""
    counts = {} if counts is None else counts
    if fmt == "preference":
        sample = _records(await query(index.preview, corpus_id, filters, PAIRING_SAMPLE))
        # Made on the prompts as stored.
        pairs = list(preference_pairs(sample, completion=completion, chat=chat))[:size]
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
                row = render_row(fmt, record, mask=mask, chat=chat)
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
    chat_style: ChatStyleQuery = None, system: SystemQuery = None,
    completion: CompletionQuery = None, version: VersionQuery = None,
    split: SplitQuery = None, splits: SplitsQuery = None, split_by: SplitByQuery = None,
    split_salt: SaltQuery = None, dedup: DedupQuery = None,
    dedup_threshold: ThresholdQuery = None, dedup_on: DedupOnQuery = None,
) -> RecordsOut:  # fmt: skip
    mask = _mask(format, mask_failed_turns, mask_types)
    chat, pairing = _chat(format, chat_style, system, completion)
    picked = _checked(format, columns, mask=mask, chat=chat, completion=pairing)
    kinds = _kinds(svc, redact)
    raw = _raw(svc, caller, kinds)
    scrub = redactor(kinds) if kinds else None
    size = filters.limit if filters.limit is not None else 10
    if not 1 <= size <= PREVIEW_MAX:
        raise Invalid(f"limit: a preview has 1 to {PREVIEW_MAX} rows, not {size}")
    picked_split, picked_dedup = _training(
        split=split, splits=splits, split_by=split_by, split_salt=split_salt, dedup=dedup,
        dedup_threshold=dedup_threshold, dedup_on=dedup_on,
    )  # fmt: skip
    followed = await corpus(svc, org, project, source)
    at = await _at(svc, org, project, source, version)
    items: list[dict[str, Any]] = []
    counts = dict.fromkeys(scrub.kinds, 0) if scrub is not None else {}
    # The index holds no metadata, only the latest view and every row: read the corpus.
    if filters.metadata or at is not None or picked_split or picked_dedup:
        try:
            summary = ExportSummary()
            tabular = format in TABULAR_FORMATS
            items = await export_preview(
                svc.store, source_ref(org, project, source),
                format="trajectory" if tabular else format, filters=filters, limit=size,
                mask=mask, redact=",".join(kinds) or "none", summary=summary,
                chat=chat, completion=pairing, at=at, split=picked_split, dedup=picked_dedup,
            )  # fmt: skip
            if tabular:
                items = [{c.header: c.value(item) for c in picked} for item in items]
            add_counts(counts, summary.redactions)
        except NoDataError:
            items = []
    elif followed.corpus_id is not None:
        items = await _preview(
            svc.index, followed.corpus_id, filters, fmt=format, columns=picked, size=size,
            mask=mask, scrub=scrub, counts=counts, chat=chat, completion=pairing,
        )  # fmt: skip
    if raw:
        await _audit(svc, caller, "records", filters, kinds, rows=len(items))
    _count(svc, response.headers, counts)
    return RecordsOut(
        items=items,
        columns=[c.header for c in picked] if picked is not None else None,
        note=None if items else _empty_note(format),
        index=index_state(followed, time.monotonic()),
    )


def _empty_note(fmt: str) -> str:
    """Why a preview has no row (it reads the first matching records only)."""
    if fmt == "preference":
        return (f"no two of the first {PAIRING_SAMPLE} matching trajectories share a prompt "
                f"(the messages up to the first user message) with different rewards; pairs "
                f"need several runs of the same prompt: try pair_by with fewer fields, a "
                f"smaller margin, or other filters")  # fmt: skip
    return f"no matching record has a {fmt} row (or none matches the filters)"


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
    chat_style: ChatStyleQuery = None, system: SystemQuery = None,
    completion: CompletionQuery = None, split: SplitQuery = None,
    splits: SplitsQuery = None, split_by: SplitByQuery = None, split_salt: SaltQuery = None,
    dedup: DedupQuery = None, dedup_threshold: ThresholdQuery = None,
    dedup_on: DedupOnQuery = None, version: VersionQuery = None,
) -> StreamingResponse:  # fmt: skip
    mask = _mask(format, mask_failed_turns, mask_types)
    chat, pairing = _chat(format, chat_style, system, completion)
    asked = _kinds(svc, redact)
    kinds = ",".join(asked) or "none"
    _checked(format, columns, mask=mask, file=file, redact=kinds, chat=chat, completion=pairing)
    picked_split, picked_dedup = _training(
        split=split, splits=splits, split_by=split_by, split_salt=split_salt, dedup=dedup,
        dedup_threshold=dedup_threshold, dedup_on=dedup_on,
    )  # fmt: skip
    raw = _raw(svc, caller, asked)
    ref = source_ref(org, project, source)
    at = await _at(svc, org, project, source, version)
    summary = ExportSummary()

    def make(store: ObjectStore) -> AsyncIterator[bytes]:
        return iter_export(
            store, ref, format=format, filters=filters, columns=columns, mask=mask, file=file,
            redact=kinds, summary=summary, chat=chat, completion=pairing, split=picked_split,
            dedup=picked_dedup, attachments=AttachmentPolicy.from_settings(svc.settings), at=at,
        )  # fmt: skip

    # On the export pool, within the subject's share (429 over it: docs/guides/security.md).
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
    # A dedup groups the rows before the first chunk: its count is known now.
    if picked_dedup is not None:
        headers[DUPLICATES_HEADER] = str(summary.duplicates_removed)
    if kinds != "none" or raw:
        # The counts are known at the end, and a header goes first: the export is made whole.
        # So is a raw read, whose audit entry (with its rows) is written before it leaves.
        spool = await _unless_gone(request, spooled(stream, first))
        if raw:
            try:
                await _audit(svc, caller, "export", filters, asked, rows=summary.records)
            except BaseException:
                spool.close()
                raise
        if kinds != "none":
            _count(svc, headers, summary.redactions)
        media = content_type(format, file)
        return StreamingResponse(read_spool(spool), media_type=media, headers=headers)

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
    columns = ",".join(body.columns) if isinstance(body.columns, list) else body.columns
    mask_types = ",".join(body.mask_types) if isinstance(body.mask_types, list) else (
        body.mask_types)  # fmt: skip
    mask = _mask(body.format, body.mask_failed_turns, mask_types)
    chat, pairing = _chat(body.format, body.chat_style, body.system, body.completion)
    asked = _kinds(svc, body.redact)
    redact = ",".join(asked) or "none"
    _checked(body.format, columns, mask=mask, file=body.file, redact=redact, chat=chat,
             completion=pairing)  # fmt: skip
    try:
        parsed = parse_filters(body.filters)
    except FilterError as exc:
        raise Invalid(str(exc)) from None
    threshold = None if body.dedup_threshold is None else repr(body.dedup_threshold)
    _training(split=body.split, splits=body.splits, split_by=body.split_by,
              split_salt=body.split_salt, dedup=body.dedup, dedup_threshold=threshold,
              dedup_on=body.dedup_on)  # fmt: skip
    raw = _raw(svc, caller, asked)
    await _at(svc, org, project, body.source, body.version)  # 404 for an unknown version now
    request = JobRequest(
        source=body.source, format=body.format, filters=body.filters, columns=columns,
        mask_failed_turns=body.mask_failed_turns, mask_types=mask_types, file=body.file,
        redact=redact, chat_style=body.chat_style, system=body.system,
        completion=body.completion, split=body.split, splits=body.splits,
        split_by=body.split_by, split_salt=body.split_salt, dedup=body.dedup,
        dedup_threshold=threshold, dedup_on=body.dedup_on, version=body.version,
    )  # fmt: skip

    async def audit() -> None:  # once the job has its place; its status counts the rows
        await _audit(svc, caller, "exports", parsed, asked, rows=None)

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
