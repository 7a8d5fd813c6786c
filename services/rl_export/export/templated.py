"""Rows made for a chat template in an export (``--chat-template``, DESIGN.md section 4).

An export of a chat format with a template:

1. loads the template (:func:`~rl_export.formats.templates.load_template`) when its request
   is checked, and probes it once, when the export starts
   (:meth:`~rl_export.formats.fit.TemplateFit.probed`): what the template requires, for the
   reader of the file (JSON Lines as written; verl's Parquet as verl reads it);
2. renders its rows with the trace's tools (:func:`~rl_export.formats.render.render_row`'s
   ``tools``), in the ``hf`` chat style with an assistant's text and calls in one message,
   and redacts them;
3. adapts and checks each row (:meth:`~rl_export.formats.fit.TemplateFit.row`): the rows that
   pass are written, the others counted by reason in the summary (at most
   :data:`MAX_REASONS` distinct reasons, the rest as one), or, with ``--on-unrenderable
   fail``, the export stops at the first with an ExportError naming the trace and the reason.

Rendering is the cost of such an export. A large one (at least :data:`POOL_RECORDS` records
in the view, more than one CPU) makes its rows in a pool of processes, each holding the
template compiled once: this process reads chunks of the corpus's lines (whole blocks when
no filter, split or dedup is set; else the lines of the records that passed) and sends
their bytes; a pool process decodes them, makes, redacts, adapts, renders and checks the
rows and sends back the finished JSON Lines and what the summary counts (steps 2 and 3);
the chunks come back in order. The bytes go both ways through memory the processes share
(:mod:`rl_export.export.slots`), what does not fit there through the pool's pipes. A
Parquet file's rows are made here and fitted in the pool.

Public interface::

    TemplateChoice(loaded, on_unrenderable="skip", processes=None)
    LineMaking(fields, mask, chat, kinds)                    # steps 2-3 in a pool process
    class Fitting(choice, fmt, file, chat, summary, *, records=0, making=None)
        .row(row, trace_id) -> dict | None                   # one row, here
        async .lines(batches) -> AsyncIterator[list[bytes]]  # JSON Lines, in order
        async .made_lines(chunks) -> AsyncIterator[(bytes, int)]  # in the pool, from lines
        async .rows(batches) -> AsyncIterator[list[dict]]    # rows (Parquet), in order
        .close()
    def template_chat(chat) -> Chat                          # the chat style rows are made in
    async def template_lines(fitting, scan, mask, limit, chat) -> AsyncIterator[bytes]
    async def template_parquet(fitting, scan, mask, limit, chat, *, encoder)
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import multiprocessing
import os
from collections import deque
from collections.abc import AsyncGenerator, AsyncIterator
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from typing import Any, Literal

import orjson

from rl_export.corpora.commits import ChainError, block_lines
from rl_export.export.lazy import DecodeError, FieldDecoder
from rl_export.export.scan import ExportSummary, Scan, limited
from rl_export.export.slots import Attached, Slots, make_slots
from rl_export.export.tabular import MessagesParquetEncoder
from rl_export.formats.adapt import Reading
from rl_export.formats.chat import Chat
from rl_export.formats.fit import TemplateFit
from rl_export.formats.render import render_row
from rl_export.formats.templates import LoadedTemplate
from rl_export.formats.turns import TurnMask, outside_turns, report_of
from rl_export.model.codec import RawJson, dumps_line
from rl_export.model.errors import ExportError
from rl_export.privacy.kinds import add_counts
from rl_export.privacy.redact import redactor
from rl_export.runtime.orphans import end_with_parent

OnUnrenderable = Literal["skip", "fail"]
ON_UNRENDERABLE: tuple[str, ...] = ("skip", "fail")
POOL_RECORDS = 20_000
"""The size of a view from which an export renders in a process pool."""
MAX_REASONS = 20
OTHER = "raises: (other messages)"
"""Where the reasons past the first :data:`MAX_REASONS` distinct ones are counted."""
CHUNK_BYTES = 1 << 20
"""About how many bytes of the corpus's lines a pool process is sent at a time."""


@dataclass(frozen=True)
class TemplateChoice:
    """The template an export's rows are made for, and what to do with a row it refuses."""

    loaded: LoadedTemplate
    on_unrenderable: OnUnrenderable = "skip"
    processes: int | None = None  # the pool's size; None: the CPUs, for a large view

    def as_dict(self) -> dict[str, Any]:
        """How the summary, the card and the manifest name it."""
        template = self.loaded.template
        return {"given": self.loaded.given, "origin": self.loaded.origin,
                "name": template.name, "sha256": template.sha256,
                "on_unrenderable": self.on_unrenderable}  # fmt: skip


def template_chat(chat: Chat) -> Chat:
    """The chat style rows for a template are made in: ``hf``, the system mode asked, an
    assistant's text and calls in one message (the fit places them)."""
    return Chat("hf", chat.system, split=False)


@dataclass(frozen=True)
class LineMaking:
    """What a pool process needs to make an export's rows from the corpus's lines, as this
    process would (:func:`template_batches`): the fields the scan reads (``(parsed, raw)``,
    None: whole records), the turn mask, the chat style asked and the redaction's kinds."""

    fields: tuple[frozenset[str], frozenset[str]] | None
    mask: TurnMask | None
    chat: Chat
    kinds: tuple[str, ...] = ()
    root: str = ""  # the corpus's, for an error's message


@dataclass
class Made:
    """A chunk's rows as a pool process made them: the kept rows' lines, the refused rows'
    trace ids and reasons (in order), and the counts the summary adds."""

    lines: list[bytes]
    refused: list[tuple[Any, str]]
    skipped: int = 0
    turns_outside: int = 0
    redactions: dict[str, int] | None = None
    kept: int = 0  # the rows kept (their lines in ``lines``, or in a slot: ``given``)
    given: int | None = None  # the size of the lines left in the task's slot


# --- in a pool's processes ------------------------------------------------------------------

_FIT: TemplateFit | None = None
_MAKING: LineMaking | None = None
_DECODER: FieldDecoder | None = None
_SLOTS: Attached | None = None


GC_THRESHOLD = 20_000
"""A pool process's first-generation threshold of the cyclic garbage collector (Python's is
700): a chunk's records and rows live while it is made, and at 700 the collector scans
them again and again, for about a tenth of the CPU a record; they hold no cycles."""


def _start(
    fit: TemplateFit, making: LineMaking | None = None, slots: tuple[str, int] | None = None
) -> None:
    global _FIT, _MAKING, _DECODER, _SLOTS  # noqa: PLW0603 - one per pool process, made once
    end_with_parent()  # killed, the export sends no word: the pool would wait forever
    gc.set_threshold(GC_THRESHOLD, *gc.get_threshold()[1:])
    _FIT, _MAKING = fit, making
    if making is not None and making.fields is not None:
        _DECODER = FieldDecoder(*making.fields)
    if slots is not None:
        # A process started as the export ends finds the slots gone; it is sent no slot.
        with contextlib.suppress(FileNotFoundError):
            _SLOTS = Attached(*slots)


def _fitted(
    fit: TemplateFit, fmt: str, rows: list[dict[str, Any]], encode: bool
) -> tuple[list[Any], list[tuple[int, str]]]:
    """The rows a template keeps (encoded as lines when ``encode``), and the others' index
    and reason."""
    kept: list[Any] = []
    refused: list[tuple[int, str]] = []
    for n, row in enumerate(rows):
        made, reason = fit.row(fmt, row)
        if made is None:
            refused.append((n, reason or "unrenderable"))
        else:
            kept.append(dumps_line(made) if encode else made)
    return kept, refused


def _pooled(fmt: str, batch: bytes, encode: bool) -> Any:
    """A batch of rows (JSON: cheaper to send than pickles of the same dicts) made for the
    pool's template: the kept rows' lines (or, for a Parquet file, the rows as JSON)."""
    assert _FIT is not None, "the pool's initializer sets the fit"
    kept, refused = _fitted(_FIT, fmt, orjson.loads(batch), encode)
    return (kept if encode else orjson.dumps(kept)), refused


def _decoded(chunk: bytes | memoryview, root: str) -> list[dict[str, Any]]:
    """The records of a chunk of whole lines, decoded as the export's scan decodes them."""
    try:
        if _DECODER is not None:
            return _DECODER.decode(chunk)
        return [orjson.loads(line) for line in block_lines((bytes(chunk), 0, len(chunk)))]
    except (DecodeError, orjson.JSONDecodeError) as exc:
        raise ChainError(f"{root}: a line is not a record ({exc})") from None


def _made(fmt: str, chunk: bytes | memoryview) -> Made:
    """Steps 2 and 3 for a chunk of the corpus's lines (records that passed the filters):
    the rows made, redacted, adapted, rendered and checked, as finished lines."""
    fit, making = _FIT, _MAKING
    assert fit is not None, "the pool's initializer sets it"
    assert making is not None, "the pool's initializer sets it"
    mask, chat = making.mask, template_chat(making.chat)
    scrub = redactor(making.kinds) if making.kinds else None
    made = Made([], [], redactions={} if scrub is not None else None)
    kept = made.lines
    for record in _decoded(chunk, making.root):
        row = render_row(fmt, record, mask=mask, chat=chat, tools=True)
        if row is None:
            made.skipped += 1
            continue
        if mask is not None:
            messages = record["messages"]
            messages = messages.value() if isinstance(messages, RawJson) else messages
            made.turns_outside += outside_turns(messages, report_of(record), mask)
        if scrub is not None:
            row, counts = scrub.record(row)
            if counts:
                add_counts(made.redactions, counts)  # type: ignore[arg-type]  # set above
        fitted, reason = fit.row(fmt, row)
        if fitted is None:
            made.refused.append((record.get("trace_id"), reason or "unrenderable"))
        else:
            kept.append(dumps_line(fitted))
    made.kept = len(kept)
    return made


def _made_in(fmt: str, slot: int, length: int) -> Made:
    """:func:`_made` for the chunk the export put in a slot, its lines left in the slot when
    they fit there."""
    assert _SLOTS is not None, "a task names a slot only when the process has them"
    made = _made(fmt, _SLOTS.chunk(slot, length))
    made.given = _SLOTS.give(slot, made.lines)
    if made.given is not None:
        made.lines = []
    return made


# --- in the export's process ----------------------------------------------------------------


class Fitting:
    """One export's rows made for a template (the module)."""

    def __init__(
        self,
        choice: TemplateChoice,
        fmt: str,
        file: str,
        chat: Chat,
        summary: ExportSummary,
        *,
        records: int = 0,
        making: LineMaking | None = None,
    ) -> None:
        self.choice = choice
        self.fmt = fmt
        self.summary = summary
        reading = Reading("verl_parquet" if file == "parquet" else "jsonl")
        self.fit = TemplateFit.probed(
            choice.loaded.template, reading, merge_system=chat.system == "merge"
        )
        summary.template = {**choice.as_dict(), "reading": reading.kind}
        summary.adaptations = self.fit.adaptations()
        processes = choice.processes
        workers = processes if processes is not None else (os.cpu_count() or 1)
        self.depth = 2 * workers
        self.pool: ProcessPoolExecutor | None = None
        self.slots: Slots | None = None
        if workers > 1 and (processes is not None or records >= POOL_RECORDS):
            if making is not None:  # chunks in flight: at most depth + 1
                self.slots = make_slots(self.depth + 1)
            slots = (self.slots.name, self.slots.size) if self.slots is not None else None
            self.pool = ProcessPoolExecutor(
                max_workers=workers, mp_context=multiprocessing.get_context("spawn"),
                initializer=_start, initargs=(self.fit, making, slots),
            )  # fmt: skip
        self.making = making if self.pool is not None else None
        self._encode = True

    def _refused(self, reason: str, trace_id: Any) -> None:
        if self.choice.on_unrenderable == "fail":
            raise ExportError(
                "on-unrenderable", f"a {self.fmt} row (trace {trace_id}) cannot be rendered "
                f"with chat template {self.choice.loaded.given}: {reason}",
            )  # fmt: skip
        counts = self.summary.unrenderable
        if reason not in counts and len(counts) >= MAX_REASONS:
            reason = OTHER
        counts[reason] = counts.get(reason, 0) + 1

    def row(self, row: dict[str, Any], trace_id: Any = None) -> dict[str, Any] | None:
        """One row made for the template here, or None (counted, or the export stopped)."""
        made, reason = self.fit.row(self.fmt, row)
        if made is None:
            self._refused(reason or "unrenderable", trace_id)
        return made

    async def _batches(
        self, batches: AsyncIterator[tuple[list[dict[str, Any]], list[Any]]], encode: bool
    ) -> AsyncIterator[list[Any]]:
        """Each batch's kept rows, in order: here, or in the pool with up to ``depth``
        batches in flight while the next ones are read."""
        if self.pool is None:
            async for rows, ids in batches:
                kept, refused = _fitted(self.fit, self.fmt, rows, encode)
                for n, reason in refused:
                    self._refused(reason, ids[n])
                yield kept
            return
        loop = asyncio.get_running_loop()
        self._encode = encode
        pending: deque[tuple[asyncio.Future[Any], list[Any]]] = deque()
        try:
            async for rows, ids in batches:
                batch = orjson.dumps(rows)
                future = loop.run_in_executor(self.pool, _pooled, self.fmt, batch, encode)
                pending.append((future, ids))
                while pending and (len(pending) > self.depth or pending[0][0].done()):
                    done, done_ids = pending.popleft()
                    yield self._taken(done_ids, await done)
            while pending:
                done, done_ids = pending.popleft()
                yield self._taken(done_ids, await done)
        finally:
            for future, _ in pending:
                future.cancel()

    def _taken(self, ids: list[Any], result: Any) -> list[Any]:
        kept, refused = result
        for n, reason in refused:
            self._refused(reason, ids[n])
        return list(kept) if self._encode else list(orjson.loads(kept))

    async def made_lines(self, chunks: AsyncIterator[Chunk]) -> AsyncIterator[tuple[bytes, int]]:
        """JSON Lines of each chunk's kept rows and their number, made in the pool from the
        corpus's lines (:attr:`making` set), in order, with up to ``depth`` chunks in
        flight: through the shared slots where they fit, else the pool's pipes."""
        assert self.pool is not None
        loop = asyncio.get_running_loop()
        pending: deque[tuple[asyncio.Future[Made], int | None]] = deque()
        try:
            async for chunk in chunks:
                slot = self.slots.put(chunk) if self.slots is not None else None
                if slot is None:
                    future = loop.run_in_executor(self.pool, _made, self.fmt, b"".join(chunk))
                else:
                    size = sum(map(len, chunk))
                    future = loop.run_in_executor(self.pool, _made_in, self.fmt, slot, size)
                pending.append((future, slot))
                while pending and (len(pending) > self.depth or pending[0][0].done()):
                    future, slot = pending.popleft()
                    yield self._counted(await future, slot)
            while pending:
                future, slot = pending.popleft()
                yield self._counted(await future, slot)
        finally:
            for future, _ in pending:
                future.cancel()

    def _counted(self, made: Made, slot: int | None) -> tuple[bytes, int]:
        """A chunk's lines and their number, its counts added to the summary."""
        if slot is not None and made.given is not None:
            assert self.slots is not None
            blob = self.slots.take(slot, made.given)
        else:
            if slot is not None and self.slots is not None:
                self.slots.free(slot)
            blob = b"".join(made.lines)
        summary = self.summary
        summary.skipped += made.skipped
        summary.turns_outside += made.turns_outside
        if made.redactions:
            add_counts(summary.redactions, made.redactions)
        for trace_id, reason in made.refused:
            self._refused(reason, trace_id)
        return blob, made.kept

    def lines(
        self, batches: AsyncIterator[tuple[list[dict[str, Any]], list[Any]]]
    ) -> AsyncIterator[list[bytes]]:
        """JSON Lines of each batch's kept rows (batches of rows and their trace ids)."""
        return self._batches(batches, True)

    def rows(
        self, batches: AsyncIterator[tuple[list[dict[str, Any]], list[Any]]]
    ) -> AsyncIterator[list[dict[str, Any]]]:
        """Each batch's kept rows, as rows (a Parquet file's)."""
        return self._batches(batches, False)

    def close(self) -> None:
        if self.pool is not None:
            self.pool.shutdown(wait=False, cancel_futures=True)
            self.pool = None
        if self.slots is not None:
            self.slots.close()  # a process still making a chunk keeps its own mapping
            self.slots = None


# --- an export's rows -----------------------------------------------------------------------


async def template_batches(
    scan: Scan, fmt: str, mask: TurnMask | None, summary: ExportSummary, chat: Chat
) -> AsyncIterator[tuple[list[dict[str, Any]], list[Any]]]:
    """Each batch's rows with the trace's tools, redacted, and their trace ids (step 2)."""
    async for batch in scan.lines():
        rows: list[dict[str, Any]] = []
        ids: list[Any] = []
        for _, record in batch:
            row = render_row(fmt, record, mask=mask, chat=template_chat(chat), tools=True)
            if row is None:
                summary.skipped += 1
                continue
            rows.append(row)
            ids.append(record.get("trace_id"))
            if mask is not None:
                messages = record["messages"]
                messages = messages.value() if isinstance(messages, RawJson) else messages
                summary.turns_outside += outside_turns(messages, report_of(record), mask)
        yield [r for _, r in scan.redact([(b"", r) for r in rows])], ids


Chunk = list[bytes | memoryview]
"""Whole lines of the corpus for a pool process: pieces, one after another."""


async def line_chunks(scan: Scan) -> AsyncIterator[Chunk]:
    """The corpus's lines of the records that pass the filters (and the split or dedup), in
    chunks of about :data:`CHUNK_BYTES`: the view's blocks as read when nothing is left out
    and no record need be read here (no dataset card's rules versions), a block longer
    than a chunk cut at line ends, shorter ones together; else the lines of the records
    the scan yields."""
    if scan.filters.is_empty() and scan.select is None and not scan.collect_rules:
        chunk: Chunk = []
        size = 0
        async for block, _ in scan.raw():
            for piece in _pieces(block) if len(block) > CHUNK_BYTES else (block,):
                if size and size + len(piece) > CHUNK_BYTES:
                    yield chunk
                    chunk, size = [], 0
                if piece:
                    chunk.append(piece)
                    size += len(piece)
        if chunk:
            yield chunk
        return
    async for batch in scan.lines(with_lines=True):
        yield [b"".join(line for line, _ in batch)]


def _pieces(block: memoryview) -> list[memoryview]:
    """A block of whole lines cut at line ends into pieces of about :data:`CHUNK_BYTES`
    (views of one copy of the block)."""
    data = bytes(block)
    view = memoryview(data)
    pieces = []
    start, size = 0, len(data)
    while start < size:
        end = data.find(b"\n", min(start + CHUNK_BYTES, size) - 1) + 1 or size
        pieces.append(view[start:end])
        start = end
    return pieces


async def template_lines(
    fitting: Fitting, scan: Scan, mask: TurnMask | None, limit: int | None, chat: Chat
) -> AsyncGenerator[bytes | memoryview, None]:
    """The export's JSON Lines, the rows the template keeps (step 3), up to the limit: made
    in the pool from the corpus's lines when the fitting has a pool and :class:`LineMaking`,
    else made here."""
    summary = fitting.summary
    if fitting.making is not None:
        made = fitting.made_lines(line_chunks(scan))
        async with contextlib.aclosing(made):  # type: ignore[type-var]  # an async generator
            async for blob, count in made:
                kept = count
                if limit is not None and summary.records + count > limit:
                    kept = max(limit - summary.records, 0)
                summary.records += kept
                yield blob if kept == count else first_lines(blob, kept)
                if limit is not None and summary.records >= limit:
                    return
        return
    batches = fitting.lines(template_batches(scan, fitting.fmt, mask, summary, chat))
    async with contextlib.aclosing(batches):  # type: ignore[type-var]  # an async generator
        async for lines in batches:
            yield b"".join(limited(lines, summary, limit))
            if limit is not None and summary.records >= limit:
                return


def first_lines(blob: bytes, count: int) -> bytes:
    """The first ``count`` lines of JSON Lines ``blob``."""
    end = 0
    for _ in range(count):
        end = blob.index(b"\n", end) + 1
    return blob[:end]


async def template_parquet(
    fitting: Fitting,
    scan: Scan,
    mask: TurnMask | None,
    limit: int | None,
    chat: Chat,
    *,
    encoder: MessagesParquetEncoder,
) -> None:
    """The rows the template keeps into a Parquet file (verl's), a row group per batch."""
    summary = fitting.summary
    batches = fitting.rows(template_batches(scan, fitting.fmt, mask, summary, chat))
    try:
        async with contextlib.aclosing(batches):  # type: ignore[type-var]  # an async generator
            async for rows in batches:
                encoder.write(limited(rows, summary, limit))
                if limit is not None and summary.records >= limit:
                    return
    finally:
        encoder.close()
