"""Exports for trainers and analysts: the latest view of a corpus, rendered in any format.

Above ``corpora`` (which it reads), beside ``labeling`` (neither imports the other), below
``index``, ``worker``, ``web``, ``local`` and ``cli`` (which call it): imports ``corpora``,
``stream`` and the ground floor. The entry points are in :mod:`rl_export.export.exports`;
the modules:

- :mod:`~rl_export.export.latest`      the latest revision per trace in bounded memory
- :mod:`~rl_export.export.settling`    the compaction settled against the tail (the view's step 3)
- :mod:`~rl_export.export.runs`        the view's index: packed entries, bitmaps, sorted runs
- :mod:`~rl_export.export.scan`        the view read, parsed (or partly), filtered, counted
- :mod:`~rl_export.export.pairs`       the preference pairs, in bounded memory
- :mod:`~rl_export.corpora.identity`    a line's trace_id, revision and tombstone flag, cheaply
- :mod:`~rl_export.export.columns`     tabular columns: defaults, ``--columns``, cells
- :mod:`~rl_export.export.tabular`     CSV, JSON array and Parquet encoders
- :mod:`~rl_export.export.attachments` attachment fetching for zip exports
- :mod:`~rl_export.export.card`        the dataset card (README.md) of an export
- :mod:`~rl_export.export.stats`       stats and the reward histogram
- :mod:`~rl_export.export.splits`      ``--split``: stable splits by a hash of a field
- :mod:`~rl_export.export.dedup`       ``--dedup``: exact and near duplicates grouped
- :mod:`~rl_export.export.selection`   what a scan keeps beyond the filters (split, dedup)
- :mod:`~rl_export.export.lineage`     ``<file>.manifest.json`` and ``--from-manifest``
- :mod:`~rl_export.export.requests`    an export's parameters checked; names, content types
- :mod:`~rl_export.export.exports`     ``write_export``, ``iter_export``, ``preview``
- :mod:`~rl_export.export.queries`     ``stats``, ``latest_records``: the view, no file
"""

from rl_export.export.dedup import Dedup, parse_dedup
from rl_export.export.exports import iter_export, preview, write_export
from rl_export.export.queries import latest_records, stats
from rl_export.export.requests import (
    SOURCES,
    check_export,
    content_type,
    file_for,
    file_name,
    parse_chat_style,
    parse_completion,
    parse_margin,
    parse_mask,
    parse_pair_by,
    source_ref,
)
from rl_export.export.scan import ExportSummary
from rl_export.export.splits import Split, parse_split
from rl_export.export.stats import StatsAccumulator, reward_histogram

__all__ = [
    "SOURCES",
    "Dedup",
    "ExportSummary",
    "Split",
    "StatsAccumulator",
    "check_export",
    "content_type",
    "file_for",
    "file_name",
    "iter_export",
    "latest_records",
    "parse_chat_style",
    "parse_completion",
    "parse_dedup",
    "parse_margin",
    "parse_mask",
    "parse_pair_by",
    "parse_split",
    "preview",
    "reward_histogram",
    "source_ref",
    "stats",
    "write_export",
]
