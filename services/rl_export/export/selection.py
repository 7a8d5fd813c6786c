"""What an export's scan keeps beyond the filters: the rows of one split, and the rows a
dedup keeps of each group of duplicates (docs/guides/exports.md, training sets)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from rl_export.export.dedup import Dedup, Deduplicator
from rl_export.export.latest import LatestView
from rl_export.export.scan import ExportSummary, Scan
from rl_export.export.splits import Split
from rl_export.formats.filters import Filters

DEDUP_FIELDS = frozenset({"trace_id", "reward", "updated_at", "messages"})
"""What a dedup's first pass reads of each record."""


async def selector(
    view: LatestView,
    filters: Filters,
    summary: ExportSummary,
    split: Split | None,
    dedup: Dedup | None,
) -> Callable[[dict[str, Any]], bool] | None:
    """What a :class:`Scan` asks of each record that passed the filters: in the split, and
    kept by the dedup (None: neither asked). A dedup first reads the view once (filtered,
    every split: a duplicate in another split is a duplicate too, so no conversation is in
    two splits) and groups the rows; the summary counts the rows of the split it removed,
    and (as the export reads) those of other splits."""
    if split is None and dedup is None:
        return None
    kept: set[str] | None = None
    if dedup is not None:
        grouping = Deduplicator(dedup)
        read = DEDUP_FIELDS | filters.fields() | ({split.field} if split is not None else set())
        first = Scan(view, filters, ExportSummary(), None, (frozenset(read), frozenset()))
        async for batch in first.lines():
            for _, record in batch:
                grouping.add(
                    record["trace_id"], record.get("reward"), record.get("updated_at"),
                    record.get("messages"), counted=split is None or split.matches(record),
                )  # fmt: skip
        kept, summary.duplicates_removed = await asyncio.to_thread(grouping.kept)

    def select(record: dict[str, Any]) -> bool:
        if split is not None and not split.matches(record):
            summary.split_left_out += 1
            return False
        return kept is None or record["trace_id"] in kept

    return select
