"""The file writers of an export that are not JSON Lines: CSV and JSON chunks, Parquet row
groups, and the zip archive with each record's attachments (fetched where
:class:`~rl_export.export.attachments.AttachmentPolicy` allows, text ones redacted like the
rows, others counted as ``unscanned``) and its ``files/manifest.json``. What
:mod:`rl_export.export.exports` runs for the tabular formats."""

from __future__ import annotations

import shutil
import tempfile
import zipfile
from collections.abc import AsyncGenerator, Callable
from typing import IO, Any

from rl_export.corpora.store import ObjectStore
from rl_export.export.attachments import (
    MESSAGES,
    AttachmentPolicy,
    Fetcher,
    archive_paths,
    is_text,
)
from rl_export.export.card import CARD_NAME
from rl_export.export.columns import Column
from rl_export.export.requests import ZipData
from rl_export.export.scan import ExportSummary, Scan, limited
from rl_export.export.tabular import (
    CsvEncoder,
    JsonEncoder,
    MessagesParquetEncoder,
    ParquetEncoder,
    PromptsParquetEncoder,
)
from rl_export.model.codec import dumps
from rl_export.privacy.kinds import add_counts
from rl_export.privacy.redact import Redactor

ROW_GROUP = 5000  # rows per Parquet row group
COPY_CHUNK = 1 << 20  # bytes copied at a time into the archive
# Every archive entry carries this time, not the clock's: the same export gives the same bytes
# (and sha256) whenever it runs, as the other formats do.
ENTRY_TIME = (1980, 1, 1, 0, 0, 0)


def _entry(name: str) -> zipfile.ZipInfo:
    info = zipfile.ZipInfo(name, date_time=ENTRY_TIME)
    info.compress_type = zipfile.ZIP_DEFLATED
    info.external_attr = 0o644 << 16  # a plain readable file when unpacked
    return info


async def tabular_chunks(
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


async def row_groups(
    scan: Scan,
    encoder: ParquetEncoder | PromptsParquetEncoder | MessagesParquetEncoder,
    rows_of: Callable[[list[tuple[bytes, dict[str, Any]]]], list[dict[str, Any]]],
    limit: int | None,
    summary: ExportSummary,
) -> None:
    """Each batch's rows (``rows_of`` counts them against the limit) into the encoder, a row
    group per :data:`ROW_GROUP` rows; the encoder closed whatever happens."""
    try:
        pending: list[dict[str, Any]] = []
        async for batch in scan.lines():
            pending.extend(rows_of(batch))
            if len(pending) >= ROW_GROUP:
                encoder.write(pending)
                pending = []
            if limit is not None and summary.records >= limit:
                break
        encoder.write(pending)
    finally:
        encoder.close()


async def zip_archive(
    store: ObjectStore,
    scan: Scan,
    columns: list[Column],
    limit: int | None,
    summary: ExportSummary,
    *,
    sink: IO[bytes],
    zip_data: ZipData,
    card: Callable[[ExportSummary], str],
    policy: AttachmentPolicy | None,
    scrub: Redactor | None,
) -> None:
    fetcher = Fetcher(store, policy)
    manifest: list[dict[str, Any]] = []
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
                    kept = await _attachments(
                        record, fetcher=fetcher, archive=archive, manifest=manifest,
                        summary=summary, scrub=scrub,
                    )  # fmt: skip
                    rows.append({**record, "attachments": kept})
                data.write(encoder.encode(rows))
                if limit is not None and summary.records >= limit:
                    break
            data.write(encoder.end())
            data.seek(0)
            with archive.open(_entry(f"data.{zip_data}"), "w") as entry:
                shutil.copyfileobj(data, entry, COPY_CHUNK)
            archive.writestr(_entry("files/manifest.json"), dumps(manifest) + b"\n")
            archive.writestr(_entry(CARD_NAME), card(summary))
    finally:
        await fetcher.close()


async def _attachments(
    record: dict[str, Any],
    *,
    fetcher: Fetcher,
    archive: zipfile.ZipFile,
    manifest: list[dict[str, Any]],
    summary: ExportSummary,
    scrub: Redactor | None,
) -> list[str]:
    """Fetch a record's attachments into the archive (text ones redacted), list each in the
    manifest with its status, and return the archive paths of those fetched."""
    attachments = record.get("attachments") or []
    if not isinstance(attachments, list):
        attachments = []
    paths = archive_paths(record["trace_id"], attachments)
    kept = []
    for attachment, path in zip(attachments, paths, strict=True):
        item = attachment if isinstance(attachment, dict) else {}
        status, content = await fetcher.fetch(item.get("uri"))
        entry: dict[str, Any] = {"trace_id": record["trace_id"], "name": item.get("name"),
                                 "status": status}  # fmt: skip
        if content is None:
            summary.attachment_errors += 1
            entry["error"] = MESSAGES.get(status)
            manifest.append(entry)
            continue
        if scrub is not None:
            if is_text(item.get("content_type"), item.get("name")):
                text, counts = scrub.text(content.decode("utf-8", errors="replace"))
                add_counts(summary.redactions, counts)
                content = text.encode()
            else:
                add_counts(summary.redactions, {"unscanned": 1})
        archive.writestr(_entry(path), content)
        summary.attachments += 1
        entry.update(path=path, bytes=len(content))
        manifest.append(entry)
        kept.append(path)
    return kept
