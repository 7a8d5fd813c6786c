"""Index sidecars: the columns readers filter on, beside each shard and compaction part.

A ``trajectory`` corpus's records are 4 KiB of JSON, mostly messages, and what the web
service's index and the exports filter on (reward, passed, labels, the evaluation's outcomes,
...) is a few hundred bytes of each. A reader that parses every record to find them runs at
about 10,000 records/s. So a writer of an uncompressed ``trajectory`` object also writes its
*sidecar*: one Parquet row per line, in line order, with those fields as written (not derived:
each reader derives what it needs, so a reader's rules can change without rewriting
sidecars) and where the line is in the object (``line_offset``, ``line_length``, newline
excluded), so a reader reads columns and fetches a body by range only when it shows one.

Layout and trust:

- Named by its object (``<data key without .jsonl>.index.parquet``): the object's key
  carries its content hash, so a retry writes the same name, and the same bytes (Parquet
  written with fixed options is deterministic).
- Written after its object and before the commit (or compaction) that names it, which holds
  its sha256, size and row count (:class:`SidecarRef`, the ``index`` of a commit or part).
  Older commits have no ``index``: readers read their records as before.
- The Parquet metadata names the object it describes (``rl_export.shard_sha256``). A reader
  refuses a sidecar (:func:`read_sidecar` raises :class:`SidecarError`) whose bytes do not
  match the commit's sha256, whose object is not the commit's, whose rows are not the
  commit's records, or whose line offsets do not tile the object exactly; it then reads the
  object itself, so a bad sidecar costs speed, never records.
"""

from __future__ import annotations

import asyncio
import hashlib
import io
import logging
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt
import orjson
import pyarrow as pa
import pyarrow.parquet as pq

from rl_export.corpora.commits import SIDECAR_VERSION, Part, SidecarRef, sidecar_key
from rl_export.corpora.layout import CorpusRef
from rl_export.corpora.store import ObjectStore
from rl_export.model.errors import ObjectNotFoundError

log = logging.getLogger(__name__)

_META_VERSION = b"rl_export.sidecar"
_META_SHARD = b"rl_export.shard_sha256"

_RUBRIC = pa.struct(
    [(d, pa.uint8()) for d in ("correctness", "helpfulness", "efficiency", "safety")]
)
_LABEL_V1 = pa.struct([("labeler", pa.string()), ("rubric", _RUBRIC)])
_LABEL = pa.struct(
    [
        *_LABEL_V1,
        ("occurred_at", pa.string()),
        ("comment", pa.string()),
        ("rubric_version", pa.int64()),
        ("kind", pa.string()),
        ("reward", pa.float64()),
    ]
)
"""A ``human_labels`` entry's fields the readers use: version 2 added the label's time and
comment (a labeler's own labels, searched), and a rubric-version label's version, kind and
reward (its spread, its review; docs/guides/rubrics.md)."""
_OUTCOME = pa.struct([("type", pa.string()), ("decision", pa.bool_()), ("severity", pa.int64())])
_RESULT = pa.struct([("evaluator", pa.string()), ("score", pa.float64()), ("passed", pa.bool_())])


def _schema(label: pa.DataType) -> pa.Schema:
    return pa.schema(
        [
            ("trace_id", pa.string()),
            ("revision", pa.int64()),
            ("deleted", pa.bool_()),
            ("reward", pa.float64()),
            ("passed", pa.bool_()),
            ("labels_count", pa.int64()),
            ("agent_version", pa.string()),
            ("scenario", pa.string()),
            ("updated_at", pa.string()),
            ("completed_at", pa.string()),
            ("labelers", pa.list_(pa.string())),
            ("skipped_by", pa.list_(pa.string())),
            ("labels", pa.list_(label)),
            (
                "evaluation",
                pa.struct(
                    [
                        ("report", pa.struct([("outcomes", pa.list_(_OUTCOME))])),
                        ("results", pa.list_(_RESULT)),
                    ]
                ),
            ),
            ("pass_threshold", pa.float64()),
            ("line_offset", pa.int64()),
            ("line_length", pa.int64()),
        ]
    )


SCHEMA = _schema(_LABEL)
"""A record's fields as written (absent: null; ``labels`` is null in a record written
before records carried it, ``deleted`` is true only for a tombstone)."""
SCHEMA_V1 = _schema(_LABEL_V1)
"""Version 1's columns (its labels without time, comment, version, kind and reward): still
read, its labels given the version-2 fields as nulls."""


class SidecarError(ValueError):
    """A sidecar that does not describe its object: refused (the object is read instead)."""


def _dict_or_none(value: Any) -> dict[str, Any] | None:
    return value if isinstance(value, dict) else None


def _list(value: Any) -> list[Any] | None:
    return value if isinstance(value, list) else None


def index_row(r: dict[str, Any]) -> tuple[Any, ...]:
    """The sidecar's fields of one record (or tombstone), in :data:`SCHEMA` order without the
    line's place: small, so a writer keeps it instead of the record. Lists and objects are
    kept as they are: pyarrow takes the keys the schema names and leaves the rest (in C++,
    three times faster than picking them here)."""
    return (
        r.get("trace_id"), r.get("revision"), r.get("deleted") is True, r.get("reward"),
        r.get("passed"), r.get("labels_count"), r.get("agent_version"), r.get("scenario"),
        r.get("updated_at"), r.get("completed_at"), _list(r.get("labelers")),
        _list(r.get("skipped_by")),
        _list(r["human_labels"] if "human_labels" in r else r.get("labels")),  # schema 2: labels
        _dict_or_none(r.get("evaluation")),
        r.get("pass_threshold"),
    )  # fmt: skip


def line_rows(lines: Sequence[bytes]) -> list[tuple[Any, ...]]:
    """:func:`index_row` of each line (parsed one at a time: no record outlives its row)."""
    return [index_row(orjson.loads(line)) for line in lines]


def build_sidecar(rows: Sequence[tuple[Any, ...]], lengths: Sequence[int],
                  shard_sha256: str) -> bytes:  # fmt: skip
    """The sidecar of an uncompressed object of ``len(rows)`` lines (``lengths``: each line's
    bytes, newline included) whose stored bytes hash to ``shard_sha256``. Raises ValueError
    or pyarrow's errors on a field of an unexpected type: the writer then goes without one."""
    if len(rows) != len(lengths):
        raise ValueError(f"{len(rows)} rows for {len(lengths)} lines")
    names = SCHEMA.names
    columns: dict[str, list[Any]] = {name: list(values) for name, values in
                                     zip(names, zip(*rows, strict=True), strict=False)}  # fmt: skip
    if not rows:
        columns = {name: [] for name in names}
    offsets = [0] * len(lengths)
    offset = 0
    for n, length in enumerate(lengths):
        offsets[n] = offset
        offset += length
    columns["line_offset"] = offsets
    columns["line_length"] = [length - 1 for length in lengths]
    schema = SCHEMA.with_metadata({_META_VERSION: SIDECAR_VERSION, _META_SHARD: shard_sha256})
    return _parquet(pa.Table.from_pydict(columns, schema=schema))


def _parquet(table: pa.Table) -> bytes:
    out = io.BytesIO()
    # Fixed options (and no statistics' timestamps in Parquet): a retry writes the same bytes.
    pq.write_table(table, out, compression="zstd", compression_level=3, use_dictionary=True,
                   write_statistics=False, row_group_size=max(table.num_rows, 1))  # fmt: skip
    return out.getvalue()


def index_batch(rows: Sequence[tuple[Any, ...]]) -> pa.Table:
    """:func:`index_row` rows as the sidecar's columns, the line places left out: a writer of
    a large object converts its rows as they come (:func:`build_sidecar_from`) rather than
    keeping them (each holds its record's lists and objects). Raises as :func:`build_sidecar`.
    """
    names = SCHEMA.names[: len(SCHEMA.names) - 2]  # without line_offset and line_length
    schema = pa.schema([SCHEMA.field(name) for name in names])
    columns: dict[str, list[Any]] = {name: list(values) for name, values in
                                     zip(names, zip(*rows, strict=True), strict=True)}  # fmt: skip
    if not rows:
        columns = {name: [] for name in names}
    return pa.Table.from_pydict(columns, schema=schema)


def build_sidecar_from(batches: Sequence[pa.Table], lengths: Sequence[int],
                       shard_sha256: str) -> bytes:  # fmt: skip
    """:func:`build_sidecar` of rows already converted by :func:`index_batch` (the same bytes)."""
    table = pa.concat_tables(batches) if batches else index_batch([])
    if table.num_rows != len(lengths):
        raise ValueError(f"{table.num_rows} rows for {len(lengths)} lines")
    offsets = [0] * len(lengths)
    offset = 0
    for n, length in enumerate(lengths):
        offsets[n] = offset
        offset += length
    table = table.append_column(SCHEMA.field("line_offset"), pa.array(offsets, pa.int64()))
    table = table.append_column(
        SCHEMA.field("line_length"), pa.array([length - 1 for length in lengths], pa.int64())
    )
    schema = SCHEMA.with_metadata({_META_VERSION: SIDECAR_VERSION, _META_SHARD: shard_sha256})
    return _parquet(table.combine_chunks().cast(schema))


def make_ref(key: str, data: bytes, rows: int) -> SidecarRef:
    return SidecarRef(key=key, sha256=hashlib.sha256(data).hexdigest(), bytes=len(data), rows=rows)


def read_sidecar(data: bytes, ref: SidecarRef, *, shard_sha256: str, records: int,
                 shard_bytes: int | None,
                 columns: Sequence[str] | None = None) -> pa.Table:  # fmt: skip
    """The sidecar's table, after checking it describes its object (else SidecarError).

    ``shard_bytes`` is the object's stored size when it is uncompressed (the line offsets
    must then end exactly there), None when it is not known. ``columns`` reads only those
    (and the line places, which are always checked); None reads them all.
    """
    expected = {SIDECAR_VERSION: SCHEMA, "1": SCHEMA_V1}.get(ref.version)
    if expected is None:
        raise SidecarError(f"{ref.key}: sidecar version {ref.version!r}, this reader knows "
                           f"{SIDECAR_VERSION!r} and 1")  # fmt: skip
    digest = hashlib.sha256(data).hexdigest()
    if digest != ref.sha256 or len(data) != ref.bytes:
        raise SidecarError(f"{ref.key}: sha256 {digest[:16]}… does not match its commit's")
    try:
        parquet = pq.ParquetFile(io.BytesIO(data))
        schema = parquet.schema_arrow
        meta = schema.metadata or {}
        if meta.get(_META_SHARD, b"").decode() != shard_sha256:
            raise SidecarError(f"{ref.key}: describes another object than its commit's "
                               f"(sha256 {shard_sha256[:16]}…)")  # fmt: skip
        if not schema.remove_metadata().equals(expected):
            raise SidecarError(f"{ref.key}: its columns are not version {ref.version}'s")
        wanted = None
        if columns is not None:
            wanted = list(dict.fromkeys([*columns, "line_offset", "line_length"]))
        table = parquet.read(columns=wanted)
    except (pa.ArrowException, OSError) as exc:
        raise SidecarError(f"{ref.key}: unreadable Parquet ({exc})") from None
    if table.num_rows != records or ref.rows != records:
        raise SidecarError(f"{ref.key}: {table.num_rows} rows for {records} records")
    _check_tiling(ref.key, table, shard_bytes)
    return table if expected is SCHEMA else _upgrade_labels(table)


def _upgrade_labels(table: pa.Table) -> pa.Table:
    """A version-1 sidecar's table with version 2's label fields, null (its ``labels``
    column's entries get them; no other column changes)."""
    if "labels" not in table.column_names:
        return table
    at = table.column_names.index("labels")
    column = table.column("labels").combine_chunks()
    values = column.values
    count = len(values)
    children = [values.field(f.name) if values.type.get_field_index(f.name) >= 0
                else pa.nulls(count, f.type) for f in _LABEL]  # fmt: skip
    entries = pa.StructArray.from_arrays(children, fields=list(_LABEL))
    offsets = column.offsets
    if column.null_count:  # a null list: a null offset (from_arrays reads it so)
        starts = offsets.to_pylist()
        nulls = column.is_null().to_pylist()
        offsets = pa.array([None if nulls[n] else starts[n] for n in range(len(column))]
                           + [starts[-1]], pa.int32())  # fmt: skip
    return table.set_column(at, "labels", pa.ListArray.from_arrays(offsets, entries))


async def load_sidecar(store: ObjectStore, ref: CorpusRef, part: Part, *,
                       columns: Sequence[str] | None = None) -> pa.Table:  # fmt: skip
    """The sidecar of an uncompressed ``part`` that has one, fetched and checked
    (:func:`read_sidecar`, in a thread); SidecarError when it is missing or refused."""
    if part.index is None or part.compression != "none":
        raise SidecarError(f"{part.key}: no index sidecar")
    key = ref.key(part.index.key)
    try:
        data = await store.get(key)
    except ObjectNotFoundError:
        raise SidecarError(f"{key}: missing") from None
    return await asyncio.to_thread(
        read_sidecar, data, part.index, shard_sha256=part.sha256, records=part.records,
        shard_bytes=part.bytes, columns=columns,
    )  # fmt: skip


async def usable_sidecar(
    store: ObjectStore,
    ref: CorpusRef,
    part: Part,
    *,
    columns: Sequence[str] | None = None,
    refused: Callable[[str], None] | None = None,
) -> pa.Table | None:
    """:func:`load_sidecar`, or None to read the object itself: it has no sidecar, or its
    sidecar is refused (logged, and ``refused(reason)`` told)."""
    if part.index is None or part.compression != "none":
        return None
    try:
        return await load_sidecar(store, ref, part, columns=columns)
    except SidecarError as exc:
        log.warning("%s: index sidecar refused, reading its object instead: %s", part.key, exc)
        if refused is not None:
            refused(str(exc))
        return None


def _check_tiling(key: str, table: pa.Table, shard_bytes: int | None) -> None:
    """Each line starts where the last one's newline ends, from 0 to the object's end."""
    if table.num_rows == 0:
        return
    offsets, lengths = int64s(table, "line_offset"), int64s(table, "line_length")
    if offsets is None or lengths is None or int(lengths.min()) < 0:
        raise SidecarError(f"{key}: line offsets or lengths missing")
    ends = offsets + lengths + 1
    if int(offsets[0]) != 0 or not np.array_equal(offsets[1:], ends[:-1]):
        raise SidecarError(f"{key}: its lines do not follow one another")
    if shard_bytes is not None and int(ends[-1]) != shard_bytes:
        raise SidecarError(f"{key}: its lines end at {int(ends[-1])}, the object at "
                           f"{shard_bytes}")  # fmt: skip


def int64s(table: pa.Table, name: str) -> npt.NDArray[np.int64] | None:
    """An int64 column as a NumPy array (None when it has a null)."""
    values, valid = column_values(table, name)
    return None if not valid.all() else values


def column_values(table: pa.Table, name: str) -> tuple[npt.NDArray[Any], npt.NDArray[np.bool_]]:
    """A bool, int64 or float64 column's values and validity as NumPy arrays, read from
    Arrow's buffers (the values not copied but for booleans, which are unpacked).

    From the buffers: pyarrow's own ``to_numpy`` and compute functions import pandas when it
    is installed, 45 MiB that an export's peak memory has no room for."""
    column = table.column(name).combine_chunks()
    count, offset = len(column), column.offset
    validity, data = column.buffers()[:2]
    valid = np.ones(count, dtype=np.bool_) if validity is None else _bits(validity, offset, count)
    if pa.types.is_boolean(column.type):
        return _bits(data, offset, count), valid
    dtype = np.float64 if pa.types.is_float64(column.type) else np.int64
    return np.frombuffer(data, dtype=dtype, count=count, offset=offset * 8), valid


def _bits(buffer: Any, offset: int, count: int) -> npt.NDArray[np.bool_]:
    packed = np.frombuffer(buffer, dtype=np.uint8)
    return np.unpackbits(packed, bitorder="little")[offset : offset + count].astype(np.bool_)


def line_lengths(data: bytes) -> list[int]:
    """The length of each line of JSON Lines bytes, newline included."""
    lengths = []
    start = 0
    while start < len(data):
        end = data.index(b"\n", start) + 1
        lengths.append(end - start)
        start = end
    return lengths


async def write_sidecar(store: ObjectStore, data_key: str, rows: Sequence[tuple[Any, ...]],
                        lengths: Sequence[int], shard_sha256: str, *,
                        relative: Callable[[str], str]) -> SidecarRef | None:  # fmt: skip
    """Build and store the sidecar of the object at ``data_key``; the reference its commit
    carries (``relative`` makes the key relative to the corpus), or None when the rows
    cannot make one (logged: the object is then read whole, as before sidecars)."""
    return await _stored(store, data_key, len(rows), relative,
                         lambda: build_sidecar(rows, lengths, shard_sha256))  # fmt: skip


async def write_sidecar_from(store: ObjectStore, data_key: str, batches: Sequence[pa.Table],
                             lengths: Sequence[int], shard_sha256: str, *,
                             relative: Callable[[str], str]) -> SidecarRef | None:  # fmt: skip
    """:func:`write_sidecar` of rows converted by :func:`index_batch`."""
    return await _stored(store, data_key, len(lengths), relative,
                         lambda: build_sidecar_from(batches, lengths, shard_sha256))  # fmt: skip


async def _stored(
    store: ObjectStore,
    data_key: str,
    records: int,
    relative: Callable[[str], str],
    build: Callable[[], bytes],
) -> SidecarRef | None:
    try:
        data = await asyncio.to_thread(build)
    except SIDECAR_ERRORS as exc:
        log.warning("%s: no index sidecar (%s: %s)", data_key, type(exc).__name__, exc)
        return None
    key = sidecar_key(data_key)
    await store.put(key, data)
    return make_ref(relative(key), data, records)


SIDECAR_ERRORS = (ValueError, TypeError, OverflowError, pa.ArrowException)
"""What rows that cannot make a sidecar raise (the object then goes without one)."""
