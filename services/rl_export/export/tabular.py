"""Encoders of the tabular exports: CSV, one JSON array, Parquet (pyarrow), and the zip archive
with its data file and attachments.

CSV and JSON are produced as byte chunks (:class:`CsvEncoder`, :class:`JsonEncoder`), so they
stream; Parquet goes to a file in row groups (:class:`ParquetEncoder`), so memory holds one
row group. Parquet column types are fixed by the column, not by the data: known scalar fields
are typed (strings, int64, float64, bool), anything else is text, nested values JSON-encoded
as in CSV.
"""

from __future__ import annotations

import csv
import io
from typing import IO, TYPE_CHECKING, Any

if TYPE_CHECKING:
    import pyarrow as pa

from rl_export.common.codec import dumps
from rl_export.export.columns import Column, csv_cell

_STRING_FIELDS = frozenset(
    {
        ("trace_id",), ("org",), ("project",), ("reward_source",), ("agent_version",),
        ("scenario",), ("completed_at",), ("updated_at",), ("evaluation", "evaluation_id"),
        ("evaluation", "occurred_at"),
    }
)  # fmt: skip
_INT_FIELDS = frozenset({("revision",), ("labels_count",), ("rules_version",)})
_FLOAT_FIELDS = frozenset({("reward",), ("pass_threshold",)})
_BOOL_FIELDS = frozenset({("passed",)})


def arrow_type(column: Column) -> pa.DataType:
    """The Parquet type of a column (see the module docstring)."""
    import pyarrow as pa  # only Parquet exports pay for importing pyarrow

    path = column.path
    if path in _INT_FIELDS:
        return pa.int64()
    if path in _FLOAT_FIELDS or (
        path[:1] in (("rubric",), ("evaluator_scores",)) and len(path) == 2
    ):
        return pa.float64()
    if path in _BOOL_FIELDS:
        return pa.bool_()
    return pa.string()


def _typed(value: Any, kind: pa.DataType) -> Any:
    import pyarrow as pa

    if value is None:
        return None
    if kind == pa.string():
        return value if isinstance(value, str) else csv_cell(value)
    if kind == pa.float64():
        return (
            float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None
        )
    return value


class CsvEncoder:
    """A header line, then rows; RFC 4180 quoting (the csv module), ``\\r\\n`` line ends."""

    def __init__(self, columns: list[Column]) -> None:
        self.columns = columns
        self.getters = [c.getter() for c in columns]

    def _encode(self, rows: list[list[str]]) -> bytes:
        buffer = io.StringIO()
        csv.writer(buffer).writerows(rows)
        return buffer.getvalue().encode()

    def begin(self) -> bytes:
        return self._encode([[c.header for c in self.columns]])

    def encode(self, records: list[dict[str, Any]]) -> bytes:
        getters, cell = self.getters, csv_cell
        return self._encode([[cell(get(r)) for get in getters] for r in records])

    def end(self) -> bytes:
        return b""


class JsonEncoder:
    """One JSON array of objects ``{header: value}``, one object per line, final newline."""

    def __init__(self, columns: list[Column]) -> None:
        self.columns = columns
        self.cells = [(c.header, c.getter()) for c in columns]
        self.first = True

    def begin(self) -> bytes:
        return b"["

    def encode(self, records: list[dict[str, Any]]) -> bytes:
        if not records:
            return b""
        cells = self.cells
        body = b",\n".join(dumps({header: get(r) for header, get in cells}) for r in records)
        lead = b"\n" if self.first else b",\n"
        self.first = False
        return lead + body

    def end(self) -> bytes:
        return b"]\n" if self.first else b"\n]\n"


class ParquetEncoder:
    """Rows into a Parquet file, one row group per :meth:`write` call."""

    def __init__(self, columns: list[Column], sink: IO[bytes]) -> None:
        import pyarrow as pa
        import pyarrow.parquet as pq

        self.pa = pa
        self.columns = columns
        self.types = [arrow_type(c) for c in columns]
        self.schema = pa.schema(
            [pa.field(c.header, t) for c, t in zip(columns, self.types, strict=True)]
        )
        self.writer = pq.ParquetWriter(sink, self.schema, compression="zstd")

    def write(self, records: list[dict[str, Any]]) -> None:
        if not records:
            return
        pa = self.pa
        arrays = [
            pa.array([_typed(c.value(r), t) for r in records], type=t)
            for c, t in zip(self.columns, self.types, strict=True)
        ]
        self.writer.write_table(pa.Table.from_arrays(arrays, schema=self.schema))

    def close(self) -> None:
        self.writer.close()
