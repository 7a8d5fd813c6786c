"""Exports of a corpus's latest view, streamed in bounded memory: what ``rl-export export``,
the API's ``GET export`` and ``GET records`` and export jobs run (stats and plain records of
the same view: :mod:`rl_export.export.queries`).

Public interface::

    # The parameters are checked by rl_export.export.requests (check_export, source_ref,
    # parse_mask, parse_pair_by, parse_margin, file_for, content_type, file_name).
    async def iter_export(store, ref, *, format, filters=Filters(), columns=None, pair_by=(),
                          margin=0.0, max_pairs=1, zip_data="csv", mask=None, file="jsonl",
                          redact=None, chat=HF, completion="turn", progress=None,
                          summary=None, attachments=None) -> AsyncIterator[bytes]
    async def write_export(store, ref, *, format, out, filters=Filters(), columns=None,
                           pair_by=(), margin=0.0, max_pairs=1, zip_data="csv", mask=None,
                           file="jsonl", card=False, redact=None, chat=HF, completion="turn",
                           progress=None, attachments=None) -> ExportSummary
    async def preview(store, ref, *, format, filters=Filters(), limit=20, pair_by=(),
                      margin=0.0, max_pairs=1) -> list[dict]
        # the first rows of a JSON Lines format, as dicts (the API's GET records)

``format`` is one of :data:`~rl_export.formats.render.JSONL_FORMATS` or
:data:`~rl_export.formats.render.TABULAR_FORMATS`; ``columns`` (tabular only) is the
``PATH[:HEADER],...`` text or list; ``pair_by``/``margin``/``max_pairs`` are for
``preference``; ``zip_data`` picks ``data.csv`` or ``data.json`` in a zip; ``mask`` (a
:class:`~rl_export.formats.turns.TurnMask`, ``--mask-failed-turns``) weighs the assistant
messages of ``messages`` and ``prompt_completion`` rows, and the summary counts the failing
outcomes whose turn is outside the conversation (``turns_outside``); ``file="parquet"``
writes ``rl_prompts`` as Parquet (verl's files), else JSON Lines. ``card`` writes a
Hugging Face dataset card (:mod:`rl_export.export.card`) as ``README.md`` beside a JSON
Lines or Parquet file ``out``; a zip always carries one. ``redact`` is the kinds to redact
(:func:`~rl_export.privacy.kinds.parse_kinds`: ``secrets,email``, ``pii``, ``all``, ``none``;
None is the default, ``secrets``); the summary's ``redactions`` counts what was replaced.
``chat`` (a :class:`~rl_export.formats.chat.Chat`, ``--chat-style``/``--system``) is the chat
style of the chat formats' messages, ``hf`` by default; ``completion`` is ``preference``'s
``--completion`` (``turn`` or ``rest``). ``progress(done,
total)`` is called as latest records are read (``total`` is known once the view is open).
``out`` is a path (written to a temporary name beside it, renamed when complete, removed on
any error: never a partial file under the name) or a binary file object (``sys.stdout.buffer``).
``iter_export`` yields the bytes of any format (Parquet and zip are built in a temporary file
first, then streamed); pass an :class:`ExportSummary` as ``summary`` to have it filled in.
Bad input raises :class:`~rl_export.model.errors.ExportError` (a ConfigError; its
``setting`` names the parameter) before any byte is produced; a corpus with no data at all
raises :class:`~rl_export.model.errors.NoDataError`; filters that match nothing give a
valid empty file.

How an export travels:

1. :class:`~rl_export.export.latest.LatestView` finds the latest revision per trace
   (tombstones dropped) in two passes over the corpus.
2. Its lines are parsed in batches (:class:`~rl_export.export.scan.Scan`; not at all for
   ``trajectory`` without filters: the corpus lines are already strict JSON Lines and are
   copied), filtered, rendered (:func:`~rl_export.formats.render.render_row`, or the
   tabular columns), and encoded.
3. ``preference`` first reads the view once for each record's prompt group and reward,
   pairs them (:func:`~rl_export.formats.render.pair_candidates`), then reads it again and
   spills the paired records' halves to a temporary file, from which the pairs are written
   (:mod:`rl_export.export.pairs`).
4. ``zip`` writes the data file to a temporary file while each record's attachments are
   fetched into the archive where ``attachments`` (an
   :class:`~rl_export.export.attachments.AttachmentPolicy`; None fetches nothing) allows
   it, text ones redacted like the rows and others counted as ``unscanned``, then adds the
   data file, ``files/manifest.json`` (every attachment with its status) and ``README.md``
   (the dataset card).
5. To a path, the lineage manifest ``<file>.manifest.json`` and, with ``card``, the card
   ``README.md`` are written beside it once the data file has its name, each replaced
   atomically; none of the three is written over unless an export to the same file made
   it (:mod:`rl_export.export.targets`, checked before anything is written).
6. Redaction (docs/guides/exports.md) applies to what is written, after the limit: a
   ``trajectory`` line no gate of :mod:`rl_export.privacy.redact` opens for is copied without
   being parsed; other rows are redacted as they are written; ``preference`` redacts the
   paired records of its second pass (pairs are made on the prompts as stored).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
import tempfile
from collections.abc import AsyncGenerator, Sequence
from pathlib import Path
from typing import IO, Any, BinaryIO

from rl_export.corpora.layout import CorpusRef
from rl_export.corpora.store import ObjectStore
from rl_export.export.atomic import Chunk, write_atomically, write_chunks
from rl_export.export.attachments import (
    AttachmentPolicy,
)
from rl_export.export.card import CARD_NAME, card_facts, dataset_card
from rl_export.export.columns import Column
from rl_export.export.comparisons import comparison_chunks
from rl_export.export.dedup import Dedup
from rl_export.export.latest import ViewPosition
from rl_export.export.lazy import export_fields
from rl_export.export.lineage import encode_manifest, export_manifest, manifest_path
from rl_export.export.pairs import preference_chunks
from rl_export.export.requests import ZipData, check_export
from rl_export.export.scan import ExportSummary, Progress, Scan, limited, open_view
from rl_export.export.selection import selector
from rl_export.export.splits import Split
from rl_export.export.tabular import (
    MessagesParquetEncoder,
    ParquetEncoder,
    PromptsParquetEncoder,
)
from rl_export.export.targets import check_targets
from rl_export.export.templated import (
    Fitting,
    LineMaking,
    TemplateChoice,
    template_lines,
    template_parquet,
)
from rl_export.export.writers import row_groups, tabular_chunks, zip_archive
from rl_export.formats.chat import HF, Chat
from rl_export.formats.filters import Filters
from rl_export.formats.render import (
    CHAT_FORMATS,
    JSONL_FORMATS,
    PAIR_FORMATS,
    TABULAR_FORMATS,
    Completion,
    render_row,
)
from rl_export.formats.turns import TurnMask, outside_turns, report_of
from rl_export.model.codec import RawJson, dumps_line, loads
from rl_export.model.errors import ExportError
from rl_export.model.pairs import COMPARISONS
from rl_export.privacy.kinds import parse_kinds
from rl_export.privacy.redact import Redactor, redactor

_CHUNK = 1 << 20  # bytes gathered before a chunk is yielded


# --- records --------------------------------------------------------------------------------


def _rows(
    fmt: str,
    records: list[dict[str, Any]],
    mask: TurnMask | None,
    summary: ExportSummary,
    limit: int | None,
    *,
    chat: Chat = HF,
) -> list[dict[str, Any]]:
    """The rows of a batch of records, up to the ``limit`` of the export (records without a
    row counted as skipped)."""
    room = None if limit is None else max(limit - summary.records, 0)
    rows: list[dict[str, Any]] = []
    for record in records:
        if room is not None and len(rows) >= room:
            break
        row = render_row(fmt, record, mask=mask, chat=chat)
        if row is None:
            summary.skipped += 1
            continue
        rows.append(row)
        if mask is not None:
            summary.turns_outside += _outside(record, mask)
    return rows


def _outside(record: dict[str, Any], mask: TurnMask) -> int:
    """How many failing outcomes of the record point outside its conversation."""
    messages = record["messages"]
    if isinstance(messages, RawJson):
        messages = messages.value()
    return outside_turns(messages, report_of(record), mask)


async def _jsonl(
    scan: Scan,
    fmt: str,
    limit: int | None,
    summary: ExportSummary,
    mask: TurnMask | None,
    *,
    chat: Chat,
) -> AsyncGenerator[bytes | memoryview, None]:
    if (
        fmt == "trajectory" and scan.filters.is_empty() and not scan.collect_rules
        and scan.select is None
    ):  # fmt: skip
        # The corpus's lines are already strict JSON Lines: copied as they are (but for the
        # lines redaction changes).
        async for block, count in scan.raw():
            summary.records += count
            yield scan.redact_block(block)
        return
    async for batch in scan.lines():
        if fmt == "trajectory":
            out = [line for line, _ in scan.redact(limited(batch, summary, limit))]
        else:
            rows = _rows(fmt, [record for _, record in batch], mask, summary, limit, chat=chat)
            rows = limited(rows, summary, limit)
            out = [dumps_line(r) for _, r in scan.redact([(b"", r) for r in rows])]
        yield b"".join(out)
        if limit is not None and summary.records >= limit:
            return


async def _parquet(
    scan: Scan, columns: list[Column], limit: int | None, summary: ExportSummary, sink: IO[bytes]
) -> None:
    """The tabular columns as a Parquet file."""

    def rows(batch: list[tuple[bytes, dict[str, Any]]]) -> list[dict[str, Any]]:
        return [record for _, record in scan.redact(limited(batch, summary, limit))]

    await row_groups(scan, ParquetEncoder(columns, sink), rows, limit, summary)


async def _rows_parquet(
    scan: Scan,
    fmt: str,
    limit: int | None,
    summary: ExportSummary,
    sink: IO[bytes],
    *,
    mask: TurnMask | None = None,
    chat: Chat = HF,
) -> None:
    """``rl_prompts`` (verl's RL files: :class:`~rl_export.export.tabular.
    PromptsParquetEncoder`) or ``messages`` (its multi-turn SFT files:
    :class:`~rl_export.export.tabular.MessagesParquetEncoder`) as a Parquet file."""

    def rows(batch: list[tuple[bytes, dict[str, Any]]]) -> list[dict[str, Any]]:
        made = _rows(fmt, [record for _, record in batch], mask, summary, limit, chat=chat)
        return limited([row for _, row in scan.redact([(b"", r) for r in made])],
                       summary, limit)  # fmt: skip

    encoder = PromptsParquetEncoder(sink) if fmt == "rl_prompts" else MessagesParquetEncoder(sink)
    await row_groups(scan, encoder, rows, limit, summary)


async def iter_export(
    store: ObjectStore,
    ref: CorpusRef,
    *,
    format: str,
    filters: Filters | None = None,
    columns: str | Sequence[str] | None = None,
    pair_by: Sequence[str] = (),
    margin: float = 0.0,
    max_pairs: int = 1,
    zip_data: str = "csv",
    mask: TurnMask | None = None,
    file: str = "jsonl",
    redact: str | Sequence[str] | None = None,
    chat: Chat = HF,
    completion: Completion = "turn",
    split: Split | None = None,
    dedup: Dedup | None = None,
    progress: Progress | None = None,
    summary: ExportSummary | None = None,
    attachments: AttachmentPolicy | None = None,
    at: ViewPosition | None = None,
    template: TemplateChoice | None = None,
) -> AsyncGenerator[bytes, None]:
    """The export's bytes, in chunks (see the module docstring); ``at``: of that position."""
    chunks = _export_chunks(
        store, ref, format=format, filters=filters, columns=columns, pair_by=pair_by,
        margin=margin, max_pairs=max_pairs, zip_data=zip_data, mask=mask, file=file,
        card=False, redact=redact, chat=chat, completion=completion, split=split, dedup=dedup,
        progress=progress, summary=summary, attachments=attachments, at=at, template=template,
    )  # fmt: skip
    async with contextlib.aclosing(chunks):
        async for chunk in chunks:
            yield chunk if isinstance(chunk, bytes) else chunk.tobytes()


async def _export_chunks(
    store: ObjectStore,
    ref: CorpusRef,
    *,
    format: str,
    filters: Filters | None,
    columns: str | Sequence[str] | None,
    pair_by: Sequence[str],
    margin: float,
    max_pairs: int,
    zip_data: str,
    mask: TurnMask | None,
    file: str,
    card: bool,
    redact: str | Sequence[str] | None,
    chat: Chat,
    completion: Completion,
    split: Split | None,
    dedup: Dedup | None,
    at: ViewPosition | None = None,
    progress: Progress | None,
    summary: ExportSummary | None,
    attachments: AttachmentPolicy | None,
    template: TemplateChoice | None = None,
) -> AsyncGenerator[Chunk, None]:
    """:func:`iter_export`'s chunks; large ones may be views of what was read (no copy).
    ``card``: the rules versions are collected for a card (a zip carries one anyway)."""
    filters = filters or Filters()
    picked = check_export(
        format, columns=columns, pair_by=pair_by, margin=margin, max_pairs=max_pairs,
        zip_data=zip_data, mask=mask, file=file, card=card, redact=redact, chat=chat,
        completion=completion, template=template is not None,
    )  # fmt: skip
    kinds = parse_kinds(redact)
    scrub = redactor(kinds) if kinds else None
    summary = summary if summary is not None else ExportSummary()
    if ref.corpus == COMPARISONS and format != "trajectory":  # pairs of two traces' messages
        given = {"pair-by": bool(pair_by), "margin": bool(margin), "max-pairs": max_pairs != 1,
                 "chat-template": template is not None, "file": file != "jsonl"}  # fmt: skip
        refused = [flag for flag, on in given.items() if on]
        if refused:
            raise ExportError(refused[0], "does not apply to --source comparisons (people chose)")
        async for piece in comparison_chunks(
            store, ref, format=format, filters=filters, summary=summary, redactor=scrub,
            chat=chat, completion=completion, split=split, dedup=dedup, progress=progress, at=at,
        ):  # fmt: skip
            yield piece
        return
    if format == "reward_pairs":
        raise ExportError("format", "reward_pairs is made of comparisons: --source comparisons")
    summary.format = format
    view = await open_view(store, ref, progress, at)
    summary.position = view.position.to_json()
    summary.erased = view.erased
    card = card or format == "zip"
    fields = export_fields(format, filters, picked, pair_by, mask=mask is not None, card=card,
                           chat=chat, template=template is not None)  # fmt: skip
    select = await selector(view, filters, summary, split, dedup)
    if select is not None and fields is not None:
        read = {"trace_id"} | ({split.field} if split is not None else set())
        fields = fields[0] | read, fields[1] - read
    scan = Scan(
        view, filters, summary, progress, fields, with_lines=format == "trajectory",
        redactor=None if format == "preference" else scrub, collect_rules=card,
        select=select,
    )  # fmt: skip
    fitting = None
    if template is not None:  # a chat format (check_export): probed once, here
        making = None
        if format != "preference" and file != "parquet":  # rows made in the pool from lines
            kinds = scrub.kinds if scrub is not None else ()
            making = LineMaking(fields, mask, chat, kinds, root=str(ref.root))
        fitting = Fitting(template, format, file, chat, summary, records=view.total,
                          making=making)  # fmt: skip
    chunks = _chunks(
        store, ref, scan, picked, fitting, format=format, filters=filters, pair_by=pair_by,
        margin=margin, max_pairs=max_pairs, zip_data=zip_data, mask=mask, file=file,
        kinds=kinds, scrub=scrub, chat=chat, completion=completion, split=split, dedup=dedup,
        attachments=attachments,
    )  # fmt: skip
    try:
        async with contextlib.aclosing(chunks):
            async for chunk in chunks:
                yield chunk
    finally:
        if fitting is not None:
            fitting.close()


async def _chunks(
    store: ObjectStore,
    ref: CorpusRef,
    scan: Scan,
    picked: list[Column] | None,
    fitting: Fitting | None,
    *,
    format: str,
    filters: Filters,
    pair_by: Sequence[str],
    margin: float,
    max_pairs: int,
    zip_data: str,
    mask: TurnMask | None,
    file: str,
    kinds: Sequence[str],
    scrub: Redactor | None,
    chat: Chat,
    completion: Completion,
    split: Split | None,
    dedup: Dedup | None,
    attachments: AttachmentPolicy | None,
) -> AsyncGenerator[Chunk, None]:
    """The chunks of an export whose view is open and scan ready (:func:`_export_chunks`)."""
    summary, limit = scan.summary, filters.limit
    if format in ("parquet", "zip") or file == "parquet":
        with tempfile.TemporaryFile() as built:
            if fitting is not None and file == "parquet":
                encoder = MessagesParquetEncoder(built)
                await template_parquet(fitting, scan, mask, limit, chat, encoder=encoder)
            elif file == "parquet":
                await _rows_parquet(scan, format, limit, summary, built, mask=mask, chat=chat)
            elif format == "parquet":
                assert picked is not None
                await _parquet(scan, picked, limit, summary, built)
            else:
                assert picked is not None
                data: ZipData = "json" if zip_data == "json" else "csv"

                def zip_card(done: ExportSummary) -> str:
                    return dataset_card(card_facts(
                        ref, "zip", f"data.{data}", data, filters=filters, summary=done,
                        columns=picked, redaction=kinds, split=split, dedup=dedup,
                    ))  # fmt: skip

                await zip_archive(store, scan, picked, limit, summary, sink=built, zip_data=data,
                           card=zip_card, policy=attachments, scrub=scrub)  # fmt: skip
            built.seek(0)
            while piece := built.read(_CHUNK):
                summary.bytes += len(piece)
                yield piece
        return
    chunks: AsyncGenerator[Chunk, None]
    if format == "preference":
        chunks = preference_chunks(
            store, ref, scan, pair_by=tuple(pair_by), margin=margin, max_pairs=max_pairs,
            limit=limit, summary=summary, redactor=scrub, completion=completion, chat=chat,
            fitting=fitting,
        )  # fmt: skip
    elif format in TABULAR_FORMATS:
        assert picked is not None
        chunks = tabular_chunks(scan, format, picked, limit, summary)
    elif fitting is not None:
        chunks = template_lines(fitting, scan, mask, limit, chat)
    else:
        chunks = _jsonl(scan, format, limit, summary, mask, chat=chat)
    pending: list[Chunk] = []
    size = 0
    async with contextlib.aclosing(chunks):
        async for chunk in chunks:
            if not chunk:
                continue
            summary.bytes += len(chunk)
            if len(chunk) >= _CHUNK:  # large enough on its own: passed on as it is
                if pending:
                    yield b"".join(pending)
                    pending, size = [], 0
                yield chunk
                continue
            pending.append(chunk)
            size += len(chunk)
            if size >= _CHUNK:
                yield b"".join(pending)
                pending, size = [], 0
    if pending:
        yield b"".join(pending)


async def write_export(
    store: ObjectStore,
    ref: CorpusRef,
    *,
    format: str,
    out: str | os.PathLike[str] | BinaryIO,
    filters: Filters | None = None,
    columns: str | Sequence[str] | None = None,
    pair_by: Sequence[str] = (),
    margin: float = 0.0,
    max_pairs: int = 1,
    zip_data: str = "csv",
    mask: TurnMask | None = None,
    file: str = "jsonl",
    card: bool = False,
    redact: str | Sequence[str] | None = None,
    chat: Chat = HF,
    completion: Completion = "turn",
    split: Split | None = None,
    dedup: Dedup | None = None,
    at: ViewPosition | None = None,
    progress: Progress | None = None,
    attachments: AttachmentPolicy | None = None,
    template: TemplateChoice | None = None,
) -> ExportSummary:
    """Write the export to a path (atomically) or a binary file object; return its summary.

    A path gets its lineage manifest beside it (``<file>.manifest.json``) and, with
    ``card``, the dataset card ``README.md``, once the file has its name; none of the three
    is written over unless an export to the same file made it
    (:func:`~rl_export.export.targets.check_targets`, before anything is written)."""
    summary = ExportSummary()
    filters = filters or Filters()
    chunks = _export_chunks(
        store, ref, format=format, filters=filters, columns=columns, pair_by=pair_by,
        margin=margin, max_pairs=max_pairs, zip_data=zip_data, mask=mask, file=file,
        card=card, redact=redact, chat=chat, completion=completion, split=split, dedup=dedup,
        progress=progress, summary=summary, at=at, attachments=attachments, template=template,
    )  # fmt: skip
    # Check everything that can be checked before a temporary file exists.
    picked = check_export(
        format, columns=columns, pair_by=pair_by, margin=margin, max_pairs=max_pairs,
        zip_data=zip_data, mask=mask, file=file, card=card, redact=redact, chat=chat,
        completion=completion, template=template is not None,
    )  # fmt: skip
    if not isinstance(out, str | os.PathLike):
        if card:
            await chunks.aclose()
            raise ExportError("card", "a dataset card goes beside a file, not into a stream")
        await write_chunks(chunks, out)
        out.flush()
        return summary
    target = Path(out)
    directory = target.parent if str(target.parent) else Path(".")
    try:
        if not directory.is_dir():
            raise ExportError("output", f"no such directory: {directory}")
        check_targets(target, card=card)  # a user's file is never written over
    except ExportError:
        await chunks.aclose()
        raise
    digest = hashlib.sha256()
    await write_atomically(target, lambda fh: write_chunks(chunks, fh, digest))
    summary.sha256 = digest.hexdigest()
    if card and format != "zip":
        text = dataset_card(card_facts(
            ref, format, target.name,
            file if format in JSONL_FORMATS or format in PAIR_FORMATS else format,
            filters=filters, summary=summary, mask=mask, columns=picked, split=split,
            dedup=dedup, redaction=parse_kinds(redact),
            chat=chat if format in CHAT_FORMATS else None,
        ))  # fmt: skip

        async def write_card(fh: BinaryIO) -> None:
            await asyncio.to_thread(fh.write, text.encode())

        await write_atomically(directory / CARD_NAME, write_card)
    made = export_manifest(
        summary, ref, format, file=file, filters=filters, columns=columns, pair_by=pair_by,
        margin=margin, max_pairs=max_pairs, zip_data=zip_data, mask=mask, split=split,
        dedup=dedup, kinds=parse_kinds(redact), chat=chat, completion=completion,
        output=target.name, template=template,
    )  # fmt: skip
    lineage = encode_manifest(made)

    async def write_manifest(fh: BinaryIO) -> None:
        await asyncio.to_thread(fh.write, lineage)

    await write_atomically(manifest_path(target), write_manifest)
    return summary


async def preview(
    store: ObjectStore,
    ref: CorpusRef,
    *,
    format: str,
    filters: Filters | None = None,
    limit: int = 20,
    pair_by: Sequence[str] = (),
    margin: float = 0.0,
    max_pairs: int = 1,
    mask: TurnMask | None = None,
    redact: str | Sequence[str] | None = None,
    chat: Chat = HF,
    completion: Completion = "turn",
    split: Split | None = None,
    dedup: Dedup | None = None,
    summary: ExportSummary | None = None,
    at: ViewPosition | None = None,
    template: TemplateChoice | None = None,
) -> list[dict[str, Any]]:
    """The first ``limit`` rows of a JSON Lines format, as dicts (``GET records``; at
    ``at``: of the view of that position)."""
    if format not in JSONL_FORMATS + PAIR_FORMATS:
        raise ExportError("format", f"{format!r} is not a JSON Lines format (preview: "
                          f"{', '.join(JSONL_FORMATS + PAIR_FORMATS)})")  # fmt: skip
    # ``limit`` is rows of the format: a preference row is a pair of records, made among
    # every matching record (the filters' own limit, if any), the first ``limit`` pairs kept.
    filters = (filters or Filters()).model_copy(
        update={"limit": None if format == "preference" else limit}
    )
    data = b"".join(
        [c async for c in iter_export(store, ref, format=format, filters=filters,
                                      pair_by=pair_by, margin=margin, max_pairs=max_pairs,
                                      mask=mask, redact=redact, chat=chat,
                                      completion=completion, split=split, dedup=dedup,
                                      summary=summary, at=at, template=template)]
    )  # fmt: skip
    return [loads(line) for line in data.splitlines()[:limit]]
