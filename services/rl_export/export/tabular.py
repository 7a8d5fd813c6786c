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
from collections.abc import Sequence
from typing import IO, TYPE_CHECKING, Any

if TYPE_CHECKING:
    import pyarrow as pa

from rl_export.export.columns import Column, csv_cell
from rl_export.formats.adapt import verl_messages, verl_tools
from rl_export.model.codec import dumps

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


def parquet_schema(columns: Sequence[Column]) -> pa.Schema:
    """The Arrow schema of a ``parquet`` export with these columns."""
    import pyarrow as pa

    return pa.schema([pa.field(c.header, arrow_type(c)) for c in columns])


class ParquetEncoder:
    """Rows into a Parquet file, one row group per :meth:`write` call."""

    def __init__(self, columns: list[Column], sink: IO[bytes]) -> None:
        import pyarrow as pa
        import pyarrow.parquet as pq

        self.pa = pa
        self.columns = columns
        self.types = [arrow_type(c) for c in columns]
        self.schema = parquet_schema(columns)
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


# --- rl_prompts as Parquet (verl's RL data files) -------------------------------------------


def prompt_content(content: Any) -> str | None:
    """A prompt message's ``content`` as the Parquet column holds it: a string as it is,
    null as null; a list of text parts as their texts joined (what a chat template renders
    of them); anything else JSON-encoded."""
    if content is None or isinstance(content, str):
        return content
    if isinstance(content, list) and all(
        isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str)
        for p in content
    ):
        return "".join(p["text"] for p in content)
    return dumps(content).decode()


def rl_prompts_schema() -> pa.Schema:
    """The Arrow schema of an ``rl_prompts`` Parquet file (verl's columns)."""
    import pyarrow as pa

    message = pa.struct([pa.field("role", pa.string()), pa.field("content", pa.string())])
    return pa.schema(
        [
            pa.field("data_source", pa.string()),
            pa.field("prompt", pa.list_(message)),
            pa.field("ability", pa.string()),
            pa.field(
                "reward_model",
                pa.struct([pa.field("style", pa.string()), pa.field("ground_truth", pa.string())]),
            ),
            pa.field(
                "extra_info",
                pa.struct(
                    [
                        pa.field("trace_id", pa.string()),
                        pa.field("agent_version", pa.string()),
                        pa.field("reward", pa.float64()),
                        pa.field("passed", pa.bool_()),
                        pa.field("index", pa.int64()),
                    ]
                ),
            ),
        ]
    )


class PromptsParquetEncoder:
    """``rl_prompts`` rows into a Parquet file, one row group per :meth:`write` call.

    Each prompt message keeps ``role`` and ``content`` (:func:`prompt_content`): a Parquet
    column has one type, and verl hands these two to the chat template."""

    def __init__(self, sink: IO[bytes]) -> None:
        import pyarrow as pa
        import pyarrow.parquet as pq

        self.pa = pa
        self.schema = rl_prompts_schema()
        self.writer = pq.ParquetWriter(sink, self.schema, compression="zstd")

    def write(self, rows: list[dict[str, Any]]) -> None:
        if not rows:
            return
        for row in rows:
            row["prompt"] = [
                {"role": m.get("role") if isinstance(m, dict) else None,
                 "content": prompt_content(m.get("content")) if isinstance(m, dict) else None}
                for m in row["prompt"]
            ]  # fmt: skip
            reward = row["extra_info"]["reward"]
            if isinstance(reward, int) and not isinstance(reward, bool):
                row["extra_info"]["reward"] = float(reward)
        self.writer.write_table(self.pa.Table.from_pylist(rows, schema=self.schema))

    def close(self) -> None:
        self.writer.close()


# --- messages as Parquet (verl's multi-turn SFT files) --------------------------------------


def messages_schema() -> pa.Schema:
    """The Arrow schema of a ``messages`` Parquet file, what verl's ``MultiTurnSFTDataset``
    reads (``messages`` and ``tools``; :func:`~rl_export.formats.adapt.verl_messages`)."""
    import pyarrow as pa

    string = pa.string()
    call = pa.struct([
        pa.field("id", string), pa.field("type", string),
        pa.field("function", pa.struct([pa.field("name", string),
                                        pa.field("arguments", string)])),
    ])  # fmt: skip
    message = pa.struct([
        pa.field("role", string), pa.field("content", string),
        pa.field("tool_calls", pa.list_(call)), pa.field("tool_call_id", string),
        pa.field("name", string),
    ])  # fmt: skip
    tool = pa.struct([
        pa.field("type", string),
        pa.field("function", pa.struct([pa.field("name", string),
                                        pa.field("description", string),
                                        pa.field("parameters", string)])),
    ])  # fmt: skip
    return pa.schema([pa.field("messages", pa.list_(message)), pa.field("tools", pa.list_(tool))])


class MessagesParquetEncoder:
    """``messages`` rows into a Parquet file, one row group per :meth:`write` call: every
    message with the same keys (null where it had none), arguments and tool parameters as
    JSON text, a row's ``tools`` (a chat template's rows) or null."""

    def __init__(self, sink: IO[bytes]) -> None:
        import pyarrow as pa
        import pyarrow.parquet as pq

        self.pa = pa
        self.schema = messages_schema()
        self.writer = pq.ParquetWriter(sink, self.schema, compression="zstd")

    def write(self, rows: list[dict[str, Any]]) -> None:
        if not rows:
            return
        table = [{"messages": verl_messages(row["messages"]),
                  "tools": verl_tools(row.get("tools"))} for row in rows]  # fmt: skip
        self.writer.write_table(self.pa.Table.from_pylist(table, schema=self.schema))

    def close(self) -> None:
        self.writer.close()
