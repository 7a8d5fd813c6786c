"""What a corpus's open table holds (DESIGN.md section 13): its columns, and records as rows.

The table is the corpus's latest view, one row per live trace. A ``trajectory`` corpus's
record fields become columns in the record's order: the scalar fields typed
(:data:`SCALARS`: ``revision`` int64, ``reward`` double, ``completed_at`` a UTC timestamp,
...), every other field a JSON string column of the same name (``messages``, ``rubric``,
``human_labels``, ...). A corpus in another format types only ``trace_id`` and ``revision``
(its rows lead with them); its other fields are JSON strings. A field that is absent from a
record, or null, is a SQL NULL. A record field no column names yet (a field added to the
record after the table was made) becomes a new JSON string column (:func:`new_columns`).

Here: the columns and the pure conversion of records to an Arrow table (the merge source,
with a ``_deleted`` column that marks tombstones), and the position a table commit names.
The Delta I/O is :mod:`rl_export.corpora.table`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import pyarrow as pa

from rl_export.model.codec import dumps
from rl_export.model.events import parse_rfc3339
from rl_export.model.records import TrajectoryRecord

TIMESTAMP = pa.timestamp("us", tz="UTC")
"""Timestamps are UTC-aware (Delta ``timestamp``): a naive one would need the
``timestampNtz`` reader feature, which older engines lack."""

SCALARS: dict[str, pa.DataType] = {
    "trace_id": pa.string(),
    "org": pa.string(),
    "project": pa.string(),
    "reward_source": pa.string(),
    "revision": pa.int64(),
    "reward": pa.float64(),
    "passed": pa.bool_(),
    "agent_version": pa.string(),
    "scenario": pa.string(),
    "completed_at": TIMESTAMP,
    "updated_at": TIMESTAMP,
    "labels_count": pa.int32(),
    "pass_threshold": pa.float64(),
    "rules_version": pa.int32(),
}
"""The typed columns of a ``trajectory`` corpus's table (DESIGN.md section 13)."""

KEYS = ("trace_id", "revision")
"""Typed in every table: the merge key and the order of revisions."""

TRAJECTORY_FIELDS: tuple[str, ...] = tuple(TrajectoryRecord.model_fields)
"""The record's fields, in its order; ``comparisons`` is present only where a trace has any."""

DELETED = "_deleted"
"""The merge source's tombstone flag (never a column of the table)."""

STATS_COLUMNS = "revision,updated_at"
"""The only columns whose min/max the Delta log keeps (``delta.dataSkippingStatsColumns``):
a trace id or a message in the log's statistics would outlive the trace's deletion."""


def typed(fmt: str) -> Mapping[str, pa.DataType]:
    """The columns of a corpus in format ``fmt`` that are not JSON strings, with their types."""
    if fmt == "trajectory":
        return SCALARS
    return {name: SCALARS[name] for name in KEYS}


def base_columns(fmt: str) -> list[str]:
    """The columns a new table of a corpus in format ``fmt`` starts with."""
    return list(TRAJECTORY_FIELDS) if fmt == "trajectory" else list(KEYS)


def column_type(fmt: str, name: str) -> pa.DataType:
    return typed(fmt).get(name, pa.string())


def schema(fmt: str, columns: Sequence[str]) -> pa.Schema:
    """The table's Arrow schema: the merge key and revision are never null."""
    return pa.schema([pa.field(c, column_type(fmt, c), nullable=c not in KEYS) for c in columns])


def new_columns(columns: Sequence[str], rows: Iterable[Mapping[str, Any]]) -> list[str]:
    """The fields of live ``rows`` that ``columns`` lacks, in the order first met."""
    known = set(columns) | {"deleted", "deleted_at"}
    found: dict[str, None] = {}
    for row in rows:
        if row.get("deleted"):
            continue
        for name in row:
            if name not in known:
                found[name] = None
    return list(found)


def json_cell(value: Any) -> str | None:
    """A field's JSON string column value (None stays NULL)."""
    return None if value is None else dumps(value).decode()


def to_arrow(fmt: str, columns: Sequence[str], rows: Sequence[Mapping[str, Any]]) -> pa.Table:
    """Records and tombstones as the merge source: the table's columns and :data:`DELETED`.

    A tombstone's row holds its ``trace_id`` and ``revision`` (its other cells are NULL). A
    string-typed scalar (``trace_id``, ``scenario``, ...) is kept as it is; every other
    field not typed is its JSON text.
    """
    kinds = typed(fmt)
    arrays: list[pa.Array] = []
    for name in columns:
        kind = kinds.get(name)
        if kind is None:  # a JSON string column
            values: list[Any] = [json_cell(r.get(name)) for r in rows]
            arrays.append(pa.array(values, pa.string()))
        elif kind == TIMESTAMP:
            arrays.append(pa.array([_stamp(r.get(name)) for r in rows], kind))
        else:
            arrays.append(pa.array([r.get(name) for r in rows], kind))
    arrays.append(pa.array([bool(r.get("deleted")) for r in rows], pa.bool_()))
    fields = [*schema(fmt, columns), pa.field(DELETED, pa.bool_(), nullable=False)]
    return pa.Table.from_arrays(arrays, schema=pa.schema(fields))


def _stamp(value: Any) -> Any:
    return None if value is None else parse_rfc3339(value)


def position(generation: int, chains: Mapping[str, int]) -> dict[str, Any]:
    """What a table commit's ``rl_export_position`` says: the compaction generation and,
    per chain, the offset after the last commit the table reflects."""
    return {"generation": generation, "chains": dict(sorted(chains.items()))}
