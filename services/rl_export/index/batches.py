"""A writer's batch: what the index takes in one transaction, as DuckDB rows.

The index (:mod:`rl_export.index.queryindex`) takes lines in batches; this module makes them. A
batch is a relation named ``batch`` on the writer's connection, a row per line: the columns
the filters need (:data:`rl_export.index.sql.EXTRACT`), the line's place (``_o`` its
offset and ``_n`` its length in segment ``_seg``) and ``_q``, the order it was read in
(segment, then place). Two sources:

- :func:`from_columns`: objects' index sidecars (Parquet rows verified by the reader), as one
  Arrow table under a view; their bodies stay in the store.
- :func:`from_json`: a segment of verified lines written by the index, read by DuckDB's JSON
  reader into a temporary table, its rows matched to the lines by their order (checked).

Each is a context manager that makes the batch and drops it after, and yields how to narrow
it to the lines kept (:data:`Narrow`).
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import duckdb
import numpy as np
import numpy.typing as npt
import orjson
import pyarrow as pa

from rl_export.corpora.sidecar import int64s
from rl_export.index.sql import EXTRACT, JSON_COLUMNS

CHECKED_ROWS = 64  # rows per slice whose trace id is checked against the segment's bytes
CHUNK_ROWS = 16_384  # a sidecar is read in chunks of this many rows: one per DuckDB thread


class IndexError_(Exception):
    """The index could not take a batch (a line DuckDB cannot read as a record)."""


@dataclass(frozen=True)
class Slice:
    """Where a slice's lines are: offsets and lengths in its segment, and its bytes."""

    offsets: list[int]
    lengths: list[int]
    data: bytes
    begin: int  # where the slice starts in ``data``


Narrow = Callable[["npt.NDArray[np.int64]"], None] | None
"""Narrows a batch that is a view to the lines kept, by their ``_q`` (None: a table, narrowed
in SQL)."""


def arrow_array(kind: pa.DataType, values: npt.NDArray[Any]) -> pa.Array:
    """A NumPy array as an Arrow array of ``kind``, from its buffer (``pa.array`` of a NumPy
    array imports pandas when it is installed: 45 MiB the service has no use for)."""
    return pa.Array.from_buffers(kind, len(values), [None, pa.py_buffer(values)])


def first_row(result: duckdb.DuckDBPyConnection) -> tuple[Any, ...] | None:
    """A result's first row, fetched to its end: DuckDB refuses to ``register`` a table on a
    connection whose last result was left unfinished (a writer reads its cursor, then
    ingests)."""
    rows = result.fetchall()
    return rows[0] if rows else None


def _chunked(table: pa.Table) -> pa.Table:
    """The table in chunks of :data:`CHUNK_ROWS` rows: one per DuckDB thread."""
    return pa.Table.from_batches(table.to_batches(CHUNK_ROWS), schema=table.schema)


@contextlib.contextmanager
def from_columns(db: duckdb.DuckDBPyConnection, first: int, tables: list[Any]) -> Iterator[Narrow]:
    """Sidecars' columns, a row per line, with the line's place; the n-th table's lines are
    in segment ``first + n``.

    ``batch`` is a view over the tables joined into one (their buffers are not copied), with
    a column of segment numbers: DuckDB reads one table in parallel chunks three times faster
    than a UNION ALL of many, and through a view each statement derives only the columns it
    uses, where a temporary table would copy every one once more. What it yields narrows the
    view to the lines kept (their ``_q``), filtered in Arrow: an insert filtered by a join in
    SQL cost DuckDB 1.3 µs more a row."""
    counts = [t.num_rows for t in tables]
    segs = np.repeat(np.arange(first, first + len(tables), dtype=np.int32), counts)
    joined = pa.concat_tables(tables).append_column("_seg", arrow_array(pa.int32(), segs))

    def narrow(kept: npt.NDArray[np.int64]) -> None:
        offsets = int64s(joined, "line_offset")
        assert offsets is not None  # the reader checked the line places tile the object
        places = (segs.astype(np.int64) << 40) + offsets
        rows = joined.take(arrow_array(pa.int64(), np.flatnonzero(np.isin(places, kept))))
        db.register("sidecar_rows", _chunked(rows))

    db.register("sidecar_rows", _chunked(joined))
    try:
        db.execute(
            f"CREATE OR REPLACE TEMP VIEW batch AS SELECT {EXTRACT}, line_offset AS _o, "
            "line_length AS _n, _seg, (_seg::BIGINT << 40) + line_offset AS _q "
            "FROM sidecar_rows"
        )
        found = first_row(db.execute("SELECT count(*) FROM batch"))
        if found is None or found[0] != sum(counts):
            raise IndexError_(f"DuckDB read {found} rows from sidecars of {sum(counts)}")
        yield narrow
    finally:
        db.execute("DROP VIEW IF EXISTS batch")
        db.unregister("sidecar_rows")


@contextlib.contextmanager
def from_json(
    db: duckdb.DuckDBPyConnection, segment: int, path: Path, lines: Slice, reads: threading.Lock
) -> Iterator[Narrow]:
    """A segment's lines through DuckDB's JSON reader, a row per line in the file's order,
    then where each line is (the temporary table ``batch``). ``reads``: held while DuckDB
    reads, one JSON read at a time (each holds buffers twice the largest object, 512 MiB, and
    two at once would pass the memory limit)."""
    columns = "{" + ", ".join(f"'{k}': '{v}'" for k, v in JSON_COLUMNS.items()) + "}"
    # The index's column is ``labels`` (as in the sidecars): a record's ``human_labels``, or
    # record schema 2's ``labels``.
    source = (
        f"(SELECT * EXCLUDE (human_labels, labels), coalesce(human_labels, labels) AS labels "
        f"FROM read_json('{path}', format = 'newline_delimited', "
        f"columns = {columns}, maximum_object_size = 268435456))"
    )
    # A new table's rowids start at a base of its own, in the order its rows were inserted:
    # rowid - base is the line's place in the slice (checked).
    with reads:
        db.execute(f"CREATE OR REPLACE TEMP TABLE lines AS SELECT {EXTRACT} FROM {source}")
    first = first_row(db.execute("SELECT min(rowid) FROM lines"))
    db.execute(
        "CREATE OR REPLACE TEMP TABLE batch AS SELECT l.*, o._o, o._n, ?::INTEGER AS _seg, "
        "(?::BIGINT << 40) + o._o AS _q FROM lines l JOIN (SELECT unnest(?::BIGINT[]) AS _o, "
        "unnest(?::BIGINT[]) AS _n, generate_subscripts(?::BIGINT[], 1) - 1 + ? AS row) o "
        "ON l.rowid = o.row",
        [segment, segment, lines.offsets, lines.lengths, lines.offsets, first[0] if first else 0],
    )
    _check_order(db, lines)
    db.execute("DROP TABLE lines")
    try:
        yield None  # a table: narrowed in SQL
    finally:
        db.execute("DROP TABLE IF EXISTS batch")


def _check_order(db: duckdb.DuckDBPyConnection, lines: Slice) -> None:
    """:func:`from_json`'s guard: DuckDB read as many rows as there are lines, each got a
    place, and rows taken across the slice name the trace their line starts with (a record's
    first key): were the rows not in the file's order, the lines would not match."""
    count = len(lines.offsets)
    counts = first_row(db.execute("SELECT (SELECT count(*) FROM lines), count(*) FROM batch"))
    if counts is None or counts[0] != count or counts[1] != count:
        raise IndexError_(f"DuckDB read {counts} rows from a slice of {count} lines")
    picks = sorted({0, count - 1, *range(0, count, max(count // CHECKED_ROWS, 1))})
    rows = db.execute(
        "SELECT _o, trace_id FROM batch WHERE list_contains(?::BIGINT[], _o)",
        [[lines.offsets[n] for n in picks]],
    ).fetchall()
    if len(rows) != len(picks):
        raise IndexError_(f"{len(rows)} of {len(picks)} checked rows found in the slice")
    for offset, trace_id in rows:
        start = lines.begin + int(offset)
        head = b'{"trace_id":' + orjson.dumps(trace_id)
        if lines.data[start : start + len(head)] != head:
            raise IndexError_(
                f"the row at offset {offset} is not its line (DuckDB changed the order?)"
            )
