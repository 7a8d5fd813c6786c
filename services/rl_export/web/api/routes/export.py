"""The Export tab's routes (scope ``export``): stats, the preview and direct exports.

Stats and the preview are queries on this instance's index of the source's corpus; a direct
export streams from the corpora (the same code as ``rl-export export``) on a thread of its
own; a background export is a job (:mod:`rl_export.web.api.routes.jobs`).

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
from typing import Annotated, Any, Literal, TypeVar

import orjson
from fastapi import APIRouter, Query, Request, Response
from fastapi.responses import StreamingResponse

from rl_export.corpora.store import ObjectStore
from rl_export.export import (
    ExportSummary,
    content_type,
    file_name,
    iter_export,
    source_ref,
)
from rl_export.export import preview as export_preview
from rl_export.export import stats as export_stats
from rl_export.export.attachments import AttachmentPolicy
from rl_export.export.templated import Fitting, template_chat
from rl_export.formats.chat import HF, Chat, ChatStyle, SystemMode
from rl_export.formats.filters import Filters
from rl_export.formats.render import TABULAR_FORMATS, Completion, preference_pairs, render_row
from rl_export.formats.turns import TurnMask
from rl_export.index.queryindex import CorpusKey, QueryIndex
from rl_export.index.sql import BINS
from rl_export.model.errors import (
    ExportError,
    NoDataError,
)
from rl_export.privacy.kinds import add_counts
from rl_export.privacy.redact import Redactor, redactor
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
from rl_export.web.api.exportparams import (
    DUPLICATES_HEADER,
    EXPORT_CONTENT,
    asked_kinds,
    audit_read,
    chat_options,
    checked_export,
    count_redactions,
    count_skipped,
    disposition,
    needs_raw,
    question_columns_of,
    template_choice,
    training_options,
    turn_mask,
    version_at,
)
from rl_export.web.errors import ClientGone, Invalid, NotFound
from rl_export.web.fresh import FreshStore
from rl_export.web.models import (
    CHAT_STYLE_HELP,
    CHAT_TEMPLATE_HELP,
    COMPLETION_HELP,
    ON_UNRENDERABLE_HELP,
    SYSTEM_HELP,
    File,
    Format,
    HistogramBin,
    RecordsOut,
    Source,
    StatsOut,
)
from rl_export.web.services import Services
from rl_export.web.streaming import read_spool, spooled

T = TypeVar("T")

router = APIRouter(prefix="/api/v1/{org}/{project}", tags=["export"])

SourceQuery = Annotated[Source, Query(description="human, evaluator or traces")]
FormatQuery = Annotated[Format, Query(description="A JSON Lines or tabular format")]
ColumnsQuery = Annotated[
    str | None, Query(description="Tabular formats: PATH[:HEADER],... in order")
]
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
TemplateQuery = Annotated[str | None, Query(description=CHAT_TEMPLATE_HELP)]
OnUnrenderableQuery = Annotated[
    Literal["skip", "fail"] | None, Query(description=ON_UNRENDERABLE_HELP)
]
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
    at = await version_at(svc, org, project, source, version)
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
    fitting: Fitting | None = None,
) -> list[dict[str, Any]]:
    """The first ``size`` rows of the format over the matching records, in read order,
    redacted by ``scrub`` (what it replaced added to ``counts``); with ``fitting``, made for
    its chat template (the rows it leaves out counted in its summary)."""
    counts = {} if counts is None else counts
    tools = fitting is not None
    shaped = template_chat(chat) if tools else chat
    if fmt == "preference":
        # ``limit`` is the preview's rows, here pairs: the pairs are made among the first
        # PAIRING_SAMPLE matching records, not among ``limit`` of them (issue 56: a preview
        # of 5 pairs from 5 records was empty).
        unlimited = filters.model_copy(update={"limit": None})
        sample = _records(await query(index.preview, corpus_id, unlimited, PAIRING_SAMPLE))
        # Made on the prompts as stored.
        out = []
        for pair in preference_pairs(sample, completion=completion, chat=shaped, tools=tools):
            made = _scrubbed(scrub, pair, counts)
            if fitting is not None:
                made = fitting.row(made, f"{pair['trace_chosen']}, {pair['trace_rejected']}")
            if made is not None:
                out.append(made)
            if len(out) >= size:
                break
        return out
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
                row = render_row(fmt, record, mask=mask, chat=shaped, tools=tools)
                if row is not None:
                    row = _scrubbed(scrub, row, counts)
                if row is not None and fitting is not None:
                    row = fitting.row(row, record.get("trace_id"))
                if row is not None:
                    rows.append(row)
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
    chat_template: TemplateQuery = None, on_unrenderable: OnUnrenderableQuery = None,
) -> RecordsOut:  # fmt: skip
    mask = turn_mask(format, mask_failed_turns, mask_types)
    chat, pairing = chat_options(format, chat_style, system, completion)
    columns = await question_columns_of(svc, org, project, format, columns)
    template = template_choice(svc, format, chat, chat_template, on_unrenderable)
    picked = checked_export(format, columns, mask=mask, chat=chat, completion=pairing,
                            template=template is not None)  # fmt: skip
    kinds = asked_kinds(svc, redact)
    raw = needs_raw(svc, caller, kinds)
    scrub = redactor(kinds) if kinds else None
    size = filters.limit if filters.limit is not None else 10
    if not 1 <= size <= PREVIEW_MAX:
        raise Invalid(f"limit: a preview has 1 to {PREVIEW_MAX} rows, not {size}")
    picked_split, picked_dedup = training_options(
        split=split, splits=splits, split_by=split_by, split_salt=split_salt, dedup=dedup,
        dedup_threshold=dedup_threshold, dedup_on=dedup_on,
    )  # fmt: skip
    followed = await corpus(svc, org, project, source)
    at = await version_at(svc, org, project, source, version)
    items: list[dict[str, Any]] = []
    counts = dict.fromkeys(scrub.kinds, 0) if scrub is not None else {}
    summary = ExportSummary()
    # The index holds no metadata, only the latest view and every row: read the corpus.
    if filters.metadata or at is not None or picked_split or picked_dedup:
        try:
            tabular = format in TABULAR_FORMATS
            items = await export_preview(
                svc.store, source_ref(org, project, source),
                format="trajectory" if tabular else format, filters=filters, limit=size,
                mask=mask, redact=",".join(kinds) or "none", summary=summary,
                chat=chat, completion=pairing, at=at, split=picked_split, dedup=picked_dedup,
                template=template,
            )  # fmt: skip
            if tabular:
                items = [{c.header: c.value(item) for c in picked} for item in items]
            add_counts(counts, summary.redactions)
        except NoDataError:
            items = []
        except ExportError as exc:  # on_unrenderable=fail
            raise Invalid(str(exc)) from None
    elif followed.corpus_id is not None:
        fitting = None
        if template is not None:
            fitting = Fitting(template, format, "jsonl", chat, summary)
        try:
            items = await _preview(
                svc.index, followed.corpus_id, filters, fmt=format, columns=picked, size=size,
                mask=mask, scrub=scrub, counts=counts, chat=chat, completion=pairing,
                fitting=fitting,
            )  # fmt: skip
        except ExportError as exc:  # on_unrenderable=fail
            raise Invalid(str(exc)) from None
    if raw:
        await audit_read(svc, caller, "records", filters, kinds, rows=len(items))
    count_redactions(svc, response.headers, counts)
    count_skipped(response.headers, summary)
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


@router.get(
    "/export",
    summary="Stream an export (JSON Lines, CSV, JSON, Parquet or zip)",
    response_class=StreamingResponse,
    responses={200: {"content": EXPORT_CONTENT, "description": "The export's file."}},
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
    chat_template: TemplateQuery = None, on_unrenderable: OnUnrenderableQuery = None,
) -> StreamingResponse:  # fmt: skip
    mask = turn_mask(format, mask_failed_turns, mask_types)
    chat, pairing = chat_options(format, chat_style, system, completion)
    template = template_choice(svc, format, chat, chat_template, on_unrenderable)
    asked = asked_kinds(svc, redact)
    kinds = ",".join(asked) or "none"
    columns = await question_columns_of(svc, org, project, format, columns)
    checked_export(
        format,
        columns,
        mask=mask,
        file=file,
        redact=kinds,
        chat=chat,
        completion=pairing,
        template=template is not None,
    )
    picked_split, picked_dedup = training_options(
        split=split, splits=splits, split_by=split_by, split_salt=split_salt, dedup=dedup,
        dedup_threshold=dedup_threshold, dedup_on=dedup_on,
    )  # fmt: skip
    raw = needs_raw(svc, caller, asked)
    ref = source_ref(org, project, source)
    at = await version_at(svc, org, project, source, version)
    summary = ExportSummary()

    # The latest state has the trajectories topic's new lines too (web/fresh.py).
    fresh = b"" if at is not None else svc.fresh.recent(CorpusKey(org, project, ref.corpus))

    def make(store: ObjectStore) -> AsyncIterator[bytes]:
        if fresh:
            store = FreshStore(store, ref, fresh)
        return iter_export(
            store, ref, format=format, filters=filters, columns=columns, mask=mask, file=file,
            redact=kinds, summary=summary, chat=chat, completion=pairing, split=picked_split,
            dedup=picked_dedup, attachments=AttachmentPolicy.from_settings(svc.settings), at=at,
            template=template,
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

    headers = {"Content-Disposition": disposition(file_name(ref, format, file))}
    # A dedup groups the rows before the first chunk: its count is known now.
    if picked_dedup is not None:
        headers[DUPLICATES_HEADER] = str(summary.duplicates_removed)
    if kinds != "none" or raw or template is not None:
        # The counts are known at the end, and a header goes first: the export is made whole.
        # So is a raw read, whose audit entry (with its rows) is written before it leaves.
        try:
            spool = await _unless_gone(request, spooled(stream, first))
        except ExportError as exc:  # on_unrenderable=fail, past the first chunk
            raise Invalid(str(exc)) from None
        if raw:
            try:
                await audit_read(svc, caller, "export", filters, asked, rows=summary.records)
            except BaseException:
                spool.close()
                raise
        if kinds != "none":
            count_redactions(svc, headers, summary.redactions)
        count_skipped(headers, summary)
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
