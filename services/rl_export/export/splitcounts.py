"""How a training set's rows fall into its splits, before it is written (docs/guides/
training-sets.md): the rows per split, the distinct ``--split-by`` values, and what to warn
about.

A split is a hash of each row's ``--split-by`` value (:mod:`rl_export.export.splits`), so
every row of one value lands in one split. Split by a field with few values and the shares
come out far from the ones asked (five scenarios over ``train=0.9,eval=0.1`` may well put
every row in train). :func:`split_warnings` says so, in words the CLI prints on stderr and the
API returns as ``warnings``:

* a split that holds no row;
* fewer distinct values than ten per split (``--split-by`` with 5 values over 2 splits):
  the shares are then decided by a handful of values, not by the fractions.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from rl_export.corpora.layout import CorpusRef
from rl_export.corpora.store import ObjectStore
from rl_export.export.latest import ViewPosition
from rl_export.export.queries import latest_records
from rl_export.export.splits import Split, split_value
from rl_export.formats.filters import Filters

VALUES_PER_SPLIT = 10
"""Fewer distinct --split-by values than this per split draws a warning."""


@dataclass
class SplitCounts:
    """The rows of each split (in the order given), and how many distinct values decided
    them."""

    rows: dict[str, int] = field(default_factory=dict)
    values: int = 0
    warnings: list[str] = field(default_factory=list)


def split_warnings(split: Split, rows: dict[str, int], values: int) -> list[str]:
    """What a training set's author should hear about its splits (see the module)."""
    out = []
    total = sum(rows.values())
    for name, share in split.splits:
        if total and not rows.get(name):
            out.append(f"split {name!r} ({share:g} of the rows asked) holds no row of the "
                       f"{total} matching: its --split-by values ({split.by}) all fell "
                       "elsewhere")  # fmt: skip
    wanted = VALUES_PER_SPLIT * len(split.splits)
    if total and values < wanted:
        out.append(f"--split-by {split.by} has {values} distinct value{'s' * (values != 1)} "
                   f"for {len(split.splits)} splits (fewer than {VALUES_PER_SPLIT} per split): "
                   "rows follow their values, so the splits' sizes are far from the fractions "
                   "asked; split by a field with more values (trace_id, the default)")  # fmt: skip
    return out


def count_splits(split: Split, values: list[str]) -> SplitCounts:
    """The counts of rows whose ``--split-by`` values are ``values`` (pure)."""
    rows = dict.fromkeys((name for name, _ in split.splits), 0)
    seen: dict[str, str] = {}
    for value in values:
        name = seen.get(value)
        if name is None:
            name = seen[value] = split.of_value(value)
        rows[name] += 1
    return SplitCounts(rows, len(seen), split_warnings(split, rows, len(seen)))


async def split_counts(
    store: ObjectStore, ref: CorpusRef, split: Split, *, filters: Filters | None = None,
    at: ViewPosition | None = None,
) -> SplitCounts:  # fmt: skip
    """How the latest records matching ``filters`` fall into ``split``'s splits (a read of
    the view, parsing only the split's field)."""
    values: list[str] = []
    async for batch in latest_records(store, ref, filters=filters, fields={split.field}, at=at):
        values += [split_value(record, split.by) for record in batch]
    return count_splits(split, values)
