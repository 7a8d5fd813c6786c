"""Which lines of an object may match an export's filters, from its index sidecar (pure).

A filtered export parses every latest record to apply its filters, though most filters read a
field or two that the object's sidecar (:mod:`rl_export.corpora.sidecar`) holds as written.
:func:`sidecar_part` is the part of a :class:`~rl_export.formats.filters.Filters` a sidecar can
answer (``passed``, the reward bounds, ``agent-version``, ``scenario``, ``since``/``until``,
``labeled``, ``min-labels``); :func:`may_match` applies it to a sidecar's rows column by
column, as :meth:`~rl_export.formats.filters.Filters.matches` does to a record (the tests hold
the two to the same answers). A line it turns down is not read any further; the lines it lets
through are parsed and filtered in full as before (the filters it leaves out:
``pass-dimension``, ``max-severity``, ``max-spread``), so the export is the same whichever way
a line went.

The columns are read from Arrow's buffers with NumPy
(:func:`~rl_export.corpora.sidecar.column_values`).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from rl_export.formats.filters import Filters

SIDECAR_FILTERS = (
    "passed", "min_reward", "max_reward", "agent_version", "scenario", "since", "until",
    "labeled", "min_labels",
)  # fmt: skip
"""The filters whose record fields a sidecar holds as written."""


def sidecar_part(filters: Filters) -> Filters | None:
    """The filters a sidecar can answer; None when ``filters`` sets none of them."""
    part = Filters(**{name: getattr(filters, name) for name in SIDECAR_FILTERS})
    return None if part.is_empty() else part


def may_match(part: Filters, table: Any) -> int:
    """A bitmap (bit ``n``: row ``n``) of the rows of a sidecar table (which holds at least
    ``part.fields()``) that ``part`` matches."""
    from rl_export.corpora.sidecar import column_values  # pyarrow: loaded with the sidecar

    keep = np.ones(table.num_rows, dtype=np.bool_)
    if part.passed is not None:
        values, valid = column_values(table, "passed")
        keep &= valid & (values == part.passed)  # a null ``passed`` is not a bool
    if part.min_reward is not None or part.max_reward is not None:
        values, valid = column_values(table, "reward")
        keep &= valid
        if part.min_reward is not None:
            keep &= ~(values < part.min_reward)
        if part.max_reward is not None:
            keep &= ~(values > part.max_reward)
    for name in ("agent_version", "scenario"):
        wanted = getattr(part, name)
        if wanted is not None:
            keep &= np.array([v == wanted for v in table.column(name).to_pylist()], np.bool_)
    if part.labeled is not None or part.min_labels is not None:
        values, valid = column_values(table, "labels_count")
        count = np.where(valid, values, 0)  # absent: none
        if part.labeled is not None:
            keep &= (count != 0) == part.labeled
        if part.min_labels is not None:
            keep &= ~(count < part.min_labels)
    if part.since is not None or part.until is not None:
        stamps = Filters(since=part.since, until=part.until).matches
        keep &= np.array(
            [stamps({"updated_at": v}) for v in table.column("updated_at").to_pylist()], np.bool_
        )
    return int.from_bytes(np.packbits(keep, bitorder="little").tobytes(), "little")
