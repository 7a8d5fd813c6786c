"""Exports and stats over a corpus's latest view, streamed in bounded memory: what
``rl-export export``/``stats``, the API's ``GET export``/``GET stats`` and export jobs run.

Public interface::

    SOURCES = ("human", "evaluator", "traces")
    def source_ref(org, project, source) -> CorpusRef           # ExportError on a bad source
    def check_export(format, *, columns=None, pair_by=(), margin=0.0, max_pairs=1,
                     zip_data="csv", redact=None) -> list[Column] | None  # ExportError
    def parse_pair_by(text) -> tuple[str, ...]; def parse_margin(text) -> float
    def content_type(format) -> str; def file_name(ref, format) -> str

    async def iter_export(store, ref, *, format, filters=Filters(), columns=None, pair_by=(),
                          margin=0.0, max_pairs=1, zip_data="csv", redact=None,
                          progress=None, summary=None) -> AsyncIterator[bytes]
    async def write_export(store, ref, *, format, out, filters=Filters(), columns=None,
                           pair_by=(), margin=0.0, max_pairs=1, zip_data="csv",
                           redact=None, progress=None) -> ExportSummary
    async def stats(store, ref, *, filters=Filters(), histogram_bins=0) -> dict
        # {records, avg_reward, pass_rate, human_labeled[, reward_histogram]}
    async def preview(store, ref, *, format, filters=Filters(), limit=20, pair_by=(),
                      margin=0.0, max_pairs=1) -> list[dict]
        # the first rows of a JSON Lines format, as dicts (the API's GET records)
    async def latest_records(store, ref, *, filters=Filters(), fields=None,
                             progress=None) -> AsyncIterator[list[dict]]
        # batches of the filtered latest records, parsed only as far as ``fields`` (and the
        # filters) need: what ``rl-export agreement`` hands to the labeling package

``format`` is one of :data:`~rl_export.common.formats.JSONL_FORMATS` or
:data:`~rl_export.common.formats.TABULAR_FORMATS`; ``columns`` (tabular only) is the
``PATH[:HEADER],...`` text or list; ``pair_by``/``margin``/``max_pairs`` are for
``preference``; ``zip_data`` picks ``data.csv`` or ``data.json`` in a zip. ``redact`` is the
kinds to redact (:func:`~rl_export.common.redact.parse_kinds`: ``secrets,email``, ``pii``,
``all``, ``none``; None is the default, ``secrets``); the summary's ``redactions`` counts what
was replaced. ``progress(done,
total)`` is called as latest records are read (``total`` is known once the view is open).
``out`` is a path (written to a temporary name beside it, renamed when complete, removed on
any error: never a partial file under the name) or a binary file object (``sys.stdout.buffer``).
``iter_export`` yields the bytes of any format (Parquet and zip are built in a temporary file
first, then streamed); pass an :class:`ExportSummary` as ``summary`` to have it filled in.
Bad input raises :class:`~rl_export.common.errors.ExportError` (a ConfigError; its
``setting`` names the parameter) before any byte is produced; a corpus with no data at all
raises :class:`~rl_export.common.errors.NoDataError`; filters that match nothing give a
valid empty file.

How an export travels:

1. :class:`~rl_export.export.latest.LatestView` finds the latest revision per trace
   (tombstones dropped) in two passes over the corpus.
2. Its lines are parsed in batches (:class:`~rl_export.export.scan.Scan`; not at all for
   ``trajectory`` without filters: the corpus lines are already strict JSON Lines and are
   copied), filtered, rendered (:func:`~rl_export.common.formats.render_row`, or the
   tabular columns), and encoded.
3. ``preference`` first reads the view once for each record's prompt group and reward,
   pairs them (:func:`~rl_export.common.formats.pair_candidates`), then reads it again and
   spills the paired records' halves to a temporary file, from which the pairs are written
   (:mod:`rl_export.export.pairs`).
4. ``zip`` writes the data file to a temporary file while each record's attachments are
   fetched into the archive, then adds the data file and ``files/errors.json``.
5. Redaction (DESIGN.md section 4) applies to what is written, after the limit: a
   ``trajectory`` line no gate of :mod:`rl_export.common.redact` opens for is copied without
   being parsed; other rows are made from the redacted record; ``preference`` redacts the
   paired records of its second pass (pairs are made on the prompts as stored).
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import os
import shutil
import tempfile
import zipfile
from collections.abc import AsyncGenerator, AsyncIterator, Iterable, Sequence
from pathlib import Path
from typing import IO, Any, BinaryIO, Literal

from rl_export.common.codec import dumps, dumps_line, loads
from rl_export.common.errors import ExportError
from rl_export.common.filters import Filters
from rl_export.common.formats import JSONL_FORMATS, TABULAR_FORMATS, render_row
from rl_export.common.redact import parse_kinds, redactor
from rl_export.common.specs import check_name
from rl_export.corpora.layout import CorpusRef
from rl_export.corpora.store import ObjectStore
from rl_export.export.attachments import Fetcher, FetchError, archive_paths
from rl_export.export.columns import RECORD_FIELDS, Column, parse_columns
from rl_export.export.lazy import export_fields
from rl_export.export.pairs import preference_chunks
from rl_export.export.scan import ExportSummary, Progress, Scan, limited, open_view
from rl_export.export.stats import StatsAccumulator
from rl_export.export.tabular import CsvEncoder, JsonEncoder, ParquetEncoder

SOURCES: tuple[str, ...] = ("human", "evaluator", "traces")
ZipData = Literal["csv", "json"]

_CONTENT_TYPES = {
    "csv": "text/csv; charset=utf-8",
    "json": "application/json",
    "parquet": "application/vnd.apache.parquet",
    "zip": "application/zip",
}
_EXTENSIONS = {"csv": ".csv", "json": ".json", "parquet": ".parquet", "zip": ".zip"}
_CHUNK = 1 << 20  # bytes gathered before a chunk is yielded


# --- requests -------------------------------------------------------------------------------


def source_ref(org: str, project: str, source: str) -> CorpusRef:
    """The corpus of a reward source (``human``, ``evaluator``, ``traces``)."""
    if source not in SOURCES:
        raise ExportError("source", f"unknown source {source!r} (sources: {', '.join(SOURCES)})")
    try:
        return CorpusRef(check_name("org", org), check_name("project", project), source)
    except ValueError as exc:
        raise ExportError("org/project", str(exc)) from None


def content_type(fmt: str) -> str:
    """The HTTP content type of a format's file."""
    return "application/x-ndjson" if fmt in JSONL_FORMATS else _CONTENT_TYPES[fmt]


def file_name(ref: CorpusRef, fmt: str) -> str:
    """A file name for a download: ``<org>-<project>-<source>-<format>.<ext>``."""
    extension = ".jsonl" if fmt in JSONL_FORMATS else _EXTENSIONS[fmt]
    return f"{ref.org}-{ref.project}-{ref.corpus}-{fmt}{extension}"


def parse_pair_by(text: str | Sequence[str] | None) -> tuple[str, ...]:
    """``scenario,agent_version`` -> record fields to pair within; ExportError if unknown."""
    if text is None:
        return ()
    items = text.split(",") if isinstance(text, str) else list(text)
    fields = tuple(i.strip() for i in items if i.strip())
    for field in fields:
        if field not in RECORD_FIELDS:
            raise ExportError(
                "pair-by", f"no record field {field!r} (e.g. scenario, agent_version)"
            )
    return fields


def parse_margin(text: str | float | None) -> float:
    """A reward gap >= 0 (``0.2``); ExportError otherwise."""
    if text is None:
        return 0.0
    try:
        value = float(text)
    except ValueError:
        raise ExportError("margin", f"{text!r} is not a number") from None
    if not math.isfinite(value) or not 0 <= value <= 1:
        raise ExportError("margin", f"{text!r} is not a reward gap between 0 and 1")
    return value


def check_export(
    fmt: str,
    *,
    columns: str | Sequence[str] | None = None,
    pair_by: Sequence[str] = (),
    margin: float = 0.0,
    max_pairs: int = 1,
    zip_data: str = "csv",
    redact: str | Sequence[str] | None = None,
) -> list[Column] | None:
    """Check an export's parameters; return its columns (None for JSON Lines formats)."""
    parse_kinds(redact)
    if fmt not in JSONL_FORMATS and fmt not in TABULAR_FORMATS:
        raise ExportError(
            "format",
            f"unknown format {fmt!r} (formats: {', '.join(JSONL_FORMATS + TABULAR_FORMATS)})",
        )
    if fmt != "preference":
        if pair_by:
            raise ExportError("pair-by", "only applies to --format preference")
        if margin:
            raise ExportError("margin", "only applies to --format preference")
        if max_pairs != 1:
            raise ExportError("max-pairs", "only applies to --format preference")
    parse_pair_by(pair_by)
    parse_margin(margin)
    if isinstance(max_pairs, bool) or not isinstance(max_pairs, int) or max_pairs < 1:
        raise ExportError("max-pairs", f"{max_pairs!r} is not an integer >= 1")
    if zip_data not in ("csv", "json"):
        raise ExportError("zip-data", f"{zip_data!r} is not csv or json")
    if fmt in TABULAR_FORMATS:
        return parse_columns(columns)
    if columns:
        raise ExportError("columns", f"only applies to {', '.join(TABULAR_FORMATS)}")
    return None


# --- records --------------------------------------------------------------------------------


async def _jsonl(
    scan: Scan, fmt: str, limit: int | None, summary: ExportSummary
) -> AsyncGenerator[bytes | memoryview, None]:
    if fmt == "trajectory" and scan.filters.is_empty():
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
            rows = [(record, render_row(fmt, record)) for _, record in batch]
            kept = limited([(r, row) for r, row in rows if row is not None], summary, limit)
            summary.skipped += sum(row is None for _, row in rows)
            redacted = scan.redact([(b"", record) for record, _ in kept])
            # A row is rendered again only from a record redaction changed.
            out = [
                dumps_line(row if new is record else render_row(fmt, new) or row)
                for (record, row), (_, new) in zip(kept, redacted, strict=True)
            ]
        yield b"".join(out)
        if limit is not None and summary.records >= limit:
            return


async def _tabular_chunks(
    scan: Scan, fmt: str, columns: list[Column], limit: int | None, summary: ExportSummary
) -> AsyncGenerator[bytes, None]:
    encoder: CsvEncoder | JsonEncoder = (
        CsvEncoder(columns) if fmt == "csv" else JsonEncoder(columns)
    )
    yield encoder.begin()
    async for batch in scan.lines():
        records = [record for _, record in scan.redact(limited(batch, summary, limit))]
        yield encoder.encode(records)
        if limit is not None and summary.records >= limit:
            break
    yield encoder.end()


async def _parquet(
    scan: Scan, columns: list[Column], limit: int | None, summary: ExportSummary, sink: IO[bytes]
) -> None:
    encoder = ParquetEncoder(columns, sink)
    try:
        pending: list[dict[str, Any]] = []
        async for batch in scan.lines():
            pending.extend(record for _, record in scan.redact(limited(batch, summary, limit)))
            if len(pending) >= 5000:
                encoder.write(pending)
                pending = []
            if limit is not None and summary.records >= limit:
                break
        encoder.write(pending)
    finally:
        encoder.close()


async def _zip(
    store: ObjectStore,
    scan: Scan,
    columns: list[Column],
    limit: int | None,
    summary: ExportSummary,
    *,
    sink: IO[bytes],
    zip_data: ZipData,
) -> None:
    fetcher = Fetcher(store)
    errors: list[dict[str, Any]] = []
    encoder: CsvEncoder | JsonEncoder = CsvEncoder(columns) if zip_data == "csv" else (
        JsonEncoder(columns))  # fmt: skip
    try:
        with (
            zipfile.ZipFile(sink, "w", compression=zipfile.ZIP_DEFLATED) as archive,
            tempfile.TemporaryFile() as data,
        ):
            data.write(encoder.begin())
            async for batch in scan.lines():
                records = [r for _, r in scan.redact(limited(batch, summary, limit))]
                rows = []
                for record in records:
                    attachments = record.get("attachments") or []
                    paths = archive_paths(record["trace_id"], attachments)
                    kept = []
                    for attachment, path in zip(attachments, paths, strict=True):
                        uri = attachment.get("uri") if isinstance(attachment, dict) else None
                        try:
                            if not isinstance(uri, str):
                                raise FetchError("no uri")
                            content = await fetcher.fetch(uri)
                        except FetchError as exc:
                            summary.attachment_errors += 1
                            errors.append({"trace_id": record["trace_id"], "name":
                                           attachment.get("name"), "uri": uri, "path": path,
                                           "error": str(exc)})  # fmt: skip
                            continue
                        archive.writestr(path, content)
                        summary.attachments += 1
                        kept.append(path)
                    rows.append({**record, "attachments": kept})
                data.write(encoder.encode(rows))
                if limit is not None and summary.records >= limit:
                    break
            data.write(encoder.end())
            data.seek(0)
            with archive.open(f"data.{zip_data}", "w") as entry:
                shutil.copyfileobj(data, entry, _CHUNK)
            archive.writestr("files/errors.json", dumps(errors) + b"\n")
    finally:
        await fetcher.close()


Chunk = bytes | memoryview


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
    redact: str | Sequence[str] | None = None,
    progress: Progress | None = None,
    summary: ExportSummary | None = None,
) -> AsyncGenerator[bytes, None]:
    """The export's bytes, in chunks (see the module docstring)."""
    chunks = _export_chunks(
        store, ref, format=format, filters=filters, columns=columns, pair_by=pair_by,
        margin=margin, max_pairs=max_pairs, zip_data=zip_data, redact=redact,
        progress=progress, summary=summary,
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
    redact: str | Sequence[str] | None,
    progress: Progress | None,
    summary: ExportSummary | None,
) -> AsyncGenerator[Chunk, None]:
    """:func:`iter_export`'s chunks; large ones may be views of what was read (no copy)."""
    filters = filters or Filters()
    picked = check_export(
        format, columns=columns, pair_by=pair_by, margin=margin, max_pairs=max_pairs,
        zip_data=zip_data, redact=redact,
    )  # fmt: skip
    kinds = parse_kinds(redact)
    scrub = redactor(kinds) if kinds else None
    summary = summary if summary is not None else ExportSummary()
    summary.format = format
    view = await open_view(store, ref, progress)
    fields = export_fields(format, filters, picked, pair_by)
    scan = Scan(
        view, filters, summary, progress, fields, with_lines=format == "trajectory",
        redactor=None if format == "preference" else scrub,
    )  # fmt: skip
    limit = filters.limit
    if format in ("parquet", "zip"):
        assert picked is not None
        with tempfile.TemporaryFile() as built:
            if format == "parquet":
                await _parquet(scan, picked, limit, summary, built)
            else:
                data: ZipData = "json" if zip_data == "json" else "csv"
                await _zip(store, scan, picked, limit, summary, sink=built, zip_data=data)
            built.seek(0)
            while piece := built.read(_CHUNK):
                summary.bytes += len(piece)
                yield piece
        return
    chunks: AsyncGenerator[Chunk, None]
    if format == "preference":
        chunks = preference_chunks(
            store, ref, scan, pair_by=tuple(pair_by), margin=margin, max_pairs=max_pairs,
            limit=limit, summary=summary, redactor=scrub,
        )  # fmt: skip
    elif format in TABULAR_FORMATS:
        assert picked is not None
        chunks = _tabular_chunks(scan, format, picked, limit, summary)
    else:
        chunks = _jsonl(scan, format, limit, summary)
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
    redact: str | Sequence[str] | None = None,
    progress: Progress | None = None,
) -> ExportSummary:
    """Write the export to a path (atomically) or a binary file object; return its summary."""
    summary = ExportSummary()
    chunks = _export_chunks(
        store, ref, format=format, filters=filters, columns=columns, pair_by=pair_by,
        margin=margin, max_pairs=max_pairs, zip_data=zip_data, redact=redact,
        progress=progress, summary=summary,
    )  # fmt: skip
    if not isinstance(out, str | os.PathLike):
        await _write_chunks(chunks, out)
        out.flush()
        return summary
    target = Path(out)
    # Check everything that can be checked before a temporary file exists.
    check_export(format, columns=columns, pair_by=pair_by, margin=margin, max_pairs=max_pairs,
                 zip_data=zip_data, redact=redact)  # fmt: skip
    directory = target.parent if str(target.parent) else Path(".")
    if not directory.is_dir():
        raise ExportError("output", f"no such directory: {directory}")
    fd, temporary = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=directory)
    try:
        with os.fdopen(fd, "wb") as fh:
            await _write_chunks(chunks, fh)
            fh.flush()
            os.fchmod(fh.fileno(), 0o666 & ~_umask())  # mkstemp makes it 0600
            os.fsync(fh.fileno())
        os.replace(temporary, target)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temporary)
        raise
    return summary


async def _write_chunks(chunks: AsyncGenerator[Chunk, None], out: IO[bytes] | BinaryIO) -> None:
    """Write every chunk, each in a thread while the next one is made (one at a time, in
    order): on two cores reading and writing overlap. ``run_in_executor`` hands the write
    to the thread at once (a ``to_thread`` task would start only at the next await)."""
    loop = asyncio.get_running_loop()
    writing: asyncio.Future[int] | None = None
    try:
        async with contextlib.aclosing(chunks):
            async for chunk in chunks:
                if writing is not None:
                    await writing
                writing = loop.run_in_executor(None, out.write, chunk)
    finally:
        if writing is not None:
            await writing


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
    redact: str | Sequence[str] | None = None,
    summary: ExportSummary | None = None,
) -> list[dict[str, Any]]:
    """The first ``limit`` rows of a JSON Lines format, as dicts (``GET records``)."""
    if format not in JSONL_FORMATS:
        raise ExportError("format", f"{format!r} is not a JSON Lines format (preview: "
                          f"{', '.join(JSONL_FORMATS)})")  # fmt: skip
    filters = (filters or Filters()).model_copy(update={"limit": limit})
    data = b"".join(
        [c async for c in iter_export(store, ref, format=format, filters=filters,
                                      pair_by=pair_by, margin=margin, max_pairs=max_pairs,
                                      redact=redact, summary=summary)]
    )  # fmt: skip
    return [loads(line) for line in data.splitlines()]


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


async def stats(
    store: ObjectStore,
    ref: CorpusRef,
    *,
    filters: Filters | None = None,
    histogram_bins: int = 0,
    progress: Progress | None = None,
) -> dict[str, Any]:
    """``{records, avg_reward, pass_rate, human_labeled}`` over the filtered latest view;
    with ``histogram_bins`` also ``reward_histogram: [{lo, hi, count}]``."""
    filters = filters or Filters()
    accumulator = StatsAccumulator(histogram_bins or 10)
    view = await open_view(store, ref, progress)
    scan = Scan(view, filters, ExportSummary(), progress, export_fields("stats", filters))
    limit = filters.limit
    async for batch in scan.lines():
        for _, record in batch:
            if limit is not None and accumulator.records >= limit:
                break
            accumulator.add(record)
    out = accumulator.result()
    if histogram_bins:
        out["reward_histogram"] = accumulator.histogram()
    return out


async def latest_records(
    store: ObjectStore,
    ref: CorpusRef,
    *,
    filters: Filters | None = None,
    fields: Iterable[str] | None = None,
    progress: Progress | None = None,
) -> AsyncIterator[list[dict[str, Any]]]:
    """Batches of the latest records that pass the filters (at most ``limit`` of them), in
    the view's order. With ``fields`` a record holds only those top-level fields (and what
    the filters read), so the rest of each line is never built; else the whole record."""
    filters = filters or Filters()
    parsed: tuple[frozenset[str], frozenset[str]] | None = None
    if fields is not None:
        parsed = filters.fields() | frozenset(fields), frozenset()
    view = await open_view(store, ref, progress)
    scan = Scan(view, filters, ExportSummary(), progress, parsed)
    left = filters.limit
    async for batch in scan.lines():
        records = [record for _, record in batch]
        if left is not None:
            records = records[:left]
            left -= len(records)
        if records:
            yield records
        if left == 0:
            return
