"""Questions over a corpus's latest view that write no file: its stats (``rl-export stats``,
the API's ``GET stats``) and its filtered records as dicts (``rl-export agreement``).

Public interface::

    async def stats(store, ref, *, filters=Filters(), histogram_bins=0, progress=None,
                    at=None) -> dict
        # {records, avg_reward, pass_rate, human_labeled[, reward_histogram][, erased]}
    async def latest_records(store, ref, *, filters=Filters(), fields=None, progress=None,
                             at=None) -> AsyncIterator[list[dict]]
        # batches of the filtered latest records, parsed only as far as ``fields`` (and the
        # filters) need: what ``rl-export agreement`` hands to the labeling package

Both read the view as an export does (:class:`~rl_export.export.scan.Scan` over
:class:`~rl_export.export.latest.LatestView`, :mod:`rl_export.export.exports`).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterable
from typing import Any

from rl_export.corpora.layout import CorpusRef
from rl_export.corpora.store import ObjectStore
from rl_export.export.latest import ViewPosition
from rl_export.export.lazy import export_fields
from rl_export.export.scan import ExportSummary, Progress, Scan, open_view
from rl_export.export.stats import StatsAccumulator
from rl_export.formats.filters import Filters


async def stats(
    store: ObjectStore,
    ref: CorpusRef,
    *,
    filters: Filters | None = None,
    histogram_bins: int = 0,
    progress: Progress | None = None,
    at: ViewPosition | None = None,
) -> dict[str, Any]:
    """``{records, avg_reward, pass_rate, human_labeled}`` over the filtered latest view (at
    ``at``: the view of that position); with ``histogram_bins`` also
    ``reward_histogram: [{lo, hi, count}]``."""
    filters = filters or Filters()
    accumulator = StatsAccumulator(histogram_bins or 10)
    view = await open_view(store, ref, progress, at)
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
    if at is not None:  # a past position: the records deleted since are not counted
        out["erased"] = view.erased
    return out


async def latest_records(
    store: ObjectStore,
    ref: CorpusRef,
    *,
    filters: Filters | None = None,
    fields: Iterable[str] | None = None,
    progress: Progress | None = None,
    at: ViewPosition | None = None,
) -> AsyncIterator[list[dict[str, Any]]]:
    """Batches of the latest records that pass the filters (at most ``limit`` of them), in
    the view's order (at ``at``: the view of that position). With ``fields`` a record holds
    only those top-level fields (and what the filters read), so the rest of each line is
    never built; else the whole record."""
    filters = filters or Filters()
    parsed: tuple[frozenset[str], frozenset[str]] | None = None
    if fields is not None:
        parsed = filters.fields() | frozenset(fields), frozenset()
    view = await open_view(store, ref, progress, at)
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
