"""Record schema 3 (issue 42, DESIGN.md section 4): the per-label detail is ``human_labels``;
records of schema 2 (``labels``) are read as schema 3 by every reader, records written before
the field existed lack it (unknown, not empty), and no output row of any format has a column
named ``labels``, ``input_ids`` or ``attention_mask`` (trainers take those for their own)."""

from __future__ import annotations

import csv
import io
import json
import zipfile
from typing import Any

import pyarrow.parquet as pq
import pytest

from rl_export.corpora.reader import CorpusReader
from rl_export.corpora.store import MemoryStore
from rl_export.export import write_export
from rl_export.formats.filters import parse_filters
from rl_export.formats.render import ALL_FORMATS
from rl_export.labeling.agreement import AgreementBuilder
from rl_export.model.codec import dumps, iter_lines
from rl_export.model.records import upgrade_line, upgrade_lines, upgrade_record
from tests.exportdata import ORG, PROJECT, build_story
from tests.records import record
from tests.unit.export.test_latest_corpora import REF, write_commit

TRAINER_COLUMNS = frozenset({"labels", "input_ids", "attention_mask"})


def schema2(rec: dict[str, Any]) -> dict[str, Any]:
    """A schema-3 record as schema 2 wrote it: ``labels``, still the last field (schema 2
    carried no ``metadata``)."""
    return {("labels" if k == "human_labels" else k): v for k, v in rec.items() if k != "metadata"}


def test_upgrade_record_and_lines() -> None:
    new = {k: v for k, v in record("a", labels=2).items() if k != "metadata"}
    old = schema2(new)
    assert "labels" in old
    assert upgrade_record(dict(old)) == new
    assert list(upgrade_record(dict(old))) == list(new)
    assert upgrade_record(dict(new)) == new
    before = {k: v for k, v in new.items() if k != "human_labels"}
    assert upgrade_record(dict(before)) == before  # unknown stays unknown
    row = {"messages": [], "labels": [1]}  # not a record: left alone
    assert upgrade_record(dict(row)) == row
    assert upgrade_line(dumps(old)) == dumps(new)
    assert upgrade_line(dumps(new)) == dumps(new)
    # a "labels" key nested elsewhere (metadata, attachments) is not the record's
    nested = dict(before, attachments=[{"name": "x", "labels": [1]}])
    assert upgrade_line(dumps(nested)) == dumps(nested)
    block = b"".join(dumps(r) + b"\n" for r in (old, new, before))
    assert upgrade_lines(block) == b"".join(dumps(r) + b"\n" for r in (new, new, before))
    plain = b"".join(dumps(r) + b"\n" for r in (new, before))
    assert upgrade_lines(plain) is plain


@pytest.fixture
async def schema2_store() -> MemoryStore:
    """A corpus of schema-2 records (two labeled, one from before the field existed)."""
    store = MemoryStore()
    recs = [schema2(record(f"tr-{n}", labels=n)) for n in (1, 2)]
    recs.append({k: v for k, v in record("tr-3").items() if k != "human_labels"})
    await write_commit(store, "trajectories-0", 0, recs, gzip=False)
    return store


async def test_every_reader_maps_schema_2(schema2_store: MemoryStore) -> None:
    rows = [r async for r in CorpusReader(schema2_store, REF).records(latest_only=True)]
    by_id = {r["trace_id"]: r for r in rows}
    assert [len(by_id[f"tr-{n}"]["human_labels"]) for n in (1, 2)] == [1, 2]
    assert "human_labels" not in by_id["tr-3"]
    assert not any("labels" in r for r in rows)
    for filters in ({}, {"passed": "true"}, {"max_spread": "1"}):
        out = io.BytesIO()
        await write_export(schema2_store, REF, format="trajectory", out=out,
                           filters=parse_filters(filters))  # fmt: skip
        exported = list(iter_lines(out.getvalue()))
        # max_spread: tr-2's two labels are read, so its spread is known (else it would not pass)
        assert len(exported) == 3, filters
        assert not any("labels" in r for r in exported)
        assert sum(len(r.get("human_labels", [])) for r in exported) == 3
    builder = AgreementBuilder()
    for row in rows:
        builder.add(row)
    assert builder.traces == 3


@pytest.fixture(scope="module")
async def story() -> MemoryStore:
    store = MemoryStore()
    await build_story(store)
    return store


def columns(fmt: str, data: bytes) -> set[str]:
    """Every top-level column of every row of an export."""
    if fmt == "csv":
        return set(next(csv.reader(io.StringIO(data.decode()))))
    if fmt == "parquet":
        return set(pq.read_table(io.BytesIO(data)).column_names)
    if fmt == "json":
        return {k for row in json.loads(data) for k in row}
    if fmt == "zip":
        with zipfile.ZipFile(io.BytesIO(data)) as archive:
            return set(next(csv.reader(io.StringIO(archive.read("data.csv").decode()))))
    return {k for row in iter_lines(data) for k in row}


@pytest.mark.parametrize("fmt", ALL_FORMATS)
async def test_no_row_of_any_format_has_a_trainers_column(story: MemoryStore, fmt: str) -> None:
    from rl_export.corpora.layout import CorpusRef

    out = io.BytesIO()
    summary = await write_export(story, CorpusRef(ORG, PROJECT, "evaluator"), format=fmt, out=out)
    assert summary.records, fmt
    found = columns(fmt, out.getvalue())
    assert found, fmt
    assert not found & TRAINER_COLUMNS, fmt
    if fmt in ("trajectory", "csv", "json", "parquet", "zip"):
        assert "human_labels" in found
