"""What the open-table tests share: a table's rows compared with our latest view, field by field.

A table row and a record are each brought to the same plain values, independently of the
writer's conversion: a JSON string column parsed, a timestamp column and an RFC 3339 field
both as UTC datetimes, a missing field and a NULL both as None. Engines give rows as dicts
(deltalake and Polars through pyarrow, pandas through ``to_dict``, Spark through
``Row.asDict``); :func:`plain_row` takes any of them.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping
from datetime import UTC, datetime
from typing import Any

from rl_export.corpora.tablerows import TIMESTAMP, typed
from rl_export.model.events import parse_rfc3339


def _missing(value: Any) -> bool:
    """None, and pandas' and numpy's stand-ins for a NULL."""
    if value is None:
        return True
    if isinstance(value, float) and math.isnan(value):
        return True
    return type(value).__name__ in ("NaTType", "NAType")


def _when(value: Any) -> datetime:
    if isinstance(value, str):
        return parse_rfc3339(value)
    if hasattr(value, "to_pydatetime"):  # pandas' Timestamp
        value = value.to_pydatetime()
    if value.tzinfo is None:  # Spark gives naive datetimes in the session's zone (UTC)
        value = value.replace(tzinfo=UTC)
    return value.astimezone(UTC)


def _scalar(value: Any) -> Any:
    """numpy's scalars as Python's (pandas gives numpy.int64, numpy.bool_)."""
    return value.item() if hasattr(value, "item") and not isinstance(value, str) else value


def plain_record(record: Mapping[str, Any], columns: Iterable[str], fmt: str) -> dict[str, Any]:
    """A record of our latest view as plain values, one per table column."""
    kinds = typed(fmt)
    out: dict[str, Any] = {}
    for name in columns:
        value = record.get(name)
        if value is None:
            out[name] = None
        elif kinds.get(name) == TIMESTAMP:
            out[name] = _when(value)
        else:
            out[name] = value
    return out


def plain_row(row: Mapping[str, Any], columns: Iterable[str], fmt: str) -> dict[str, Any]:
    """A table row, as an engine gives it, as plain values."""
    kinds = typed(fmt)
    out: dict[str, Any] = {}
    for name in columns:
        value = row.get(name)
        kind = kinds.get(name)
        if _missing(value):
            out[name] = None
        elif kind is None:  # a JSON string column
            out[name] = json.loads(value)
        elif kind == TIMESTAMP:
            out[name] = _when(value)
        else:
            out[name] = _scalar(value)
    return out


def differences(
    rows: Iterable[Mapping[str, Any]],
    records: Iterable[Mapping[str, Any]],
    columns: Iterable[str],
    fmt: str = "trajectory",
) -> list[str]:
    """How a table's rows differ from the latest view's records (empty: row for row)."""
    columns = list(columns)
    got: dict[str, dict[str, Any]] = {}
    problems: list[str] = []
    for row in rows:
        plain = plain_row(row, columns, fmt)
        if plain["trace_id"] in got:
            problems.append(f"{plain['trace_id']}: two rows")
        got[plain["trace_id"]] = plain
    want = {r["trace_id"]: plain_record(r, columns, fmt) for r in records}
    problems += [f"{t}: in the table, not in the view" for t in sorted(got.keys() - want.keys())]
    problems += [f"{t}: in the view, not in the table" for t in sorted(want.keys() - got.keys())]
    for trace_id in sorted(got.keys() & want.keys()):
        for name in columns:
            if got[trace_id][name] != want[trace_id][name]:
                problems.append(
                    f"{trace_id}.{name}: table {got[trace_id][name]!r}, "
                    f"view {want[trace_id][name]!r}"
                )
    return problems
