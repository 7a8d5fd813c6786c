"""Index sidecars: written beside shards and compaction parts, read instead of the records
where they match their object, refused (and the object read whole) where they do not."""

from __future__ import annotations

import asyncio
import hashlib
from datetime import UTC, datetime
from typing import Any

import orjson
import pytest

from rl_export.corpora.commits import Commit, SidecarRef, sidecar_key
from rl_export.corpora.compaction import compact
from rl_export.corpora.layout import CorpusRef
from rl_export.corpora.reader import CorpusReader, ObjectLines
from rl_export.corpora.replay import replay
from rl_export.corpora.sidecar import (
    SidecarError,
    build_sidecar,
    index_row,
    line_rows,
    read_sidecar,
)
from rl_export.corpora.store import MemoryStore
from rl_export.corpora.verify import verify
from rl_export.formats.specs import CorpusSpec
from rl_export.local.synthetic import SHAPES, generate
from rl_export.model.codec import dumps_line
from rl_export.runtime.settings import Settings
from tests.records import record

START = datetime(2026, 1, 1, tzinfo=UTC)
TRACES = CorpusRef("acme", "support-bot", "traces")


def sidecar_of(lines: list[bytes]) -> tuple[bytes, SidecarRef, str, int]:
    data = b"".join(lines)
    sha = hashlib.sha256(data).hexdigest()
    sidecar = build_sidecar(line_rows(lines), [len(x) for x in lines], sha)
    ref = SidecarRef(key="x.index.parquet", sha256=hashlib.sha256(sidecar).hexdigest(),
                     bytes=len(sidecar), rows=len(lines))  # fmt: skip
    return sidecar, ref, sha, len(data)


def test_a_sidecar_holds_each_lines_fields_and_place_and_is_the_same_bytes_twice() -> None:
    rows = [record("a", labels=2), record("b", source=None, reward=None, passed=None),
            {"trace_id": "c", "org": "acme", "project": "bot", "reward_source": "human",
             "revision": 4, "deleted": True}]  # fmt: skip
    del rows[1]["human_labels"]  # a record of before `human_labels`: unknown, not empty
    lines = [dumps_line(r) for r in rows]
    sidecar, ref, sha, size = sidecar_of(lines)
    assert build_sidecar(line_rows(lines), [len(x) for x in lines], sha) == sidecar
    table = read_sidecar(sidecar, ref, shard_sha256=sha, records=3, shard_bytes=size)
    got = table.to_pylist()
    data = b"".join(lines)
    for row, want in zip(got, rows, strict=True):
        body = data[row["line_offset"] : row["line_offset"] + row["line_length"]]
        assert orjson.loads(body) == want
        assert row["trace_id"] == want["trace_id"]
        assert row["revision"] == want["revision"]
        assert row["deleted"] is bool(want.get("deleted"))
        assert row["reward"] == want.get("reward")
        assert row["labelers"] == want.get("labelers")
    assert [x["labeler"] for x in got[0]["labels"]] == ["ana", "bo"]  # column of human_labels
    assert got[1]["labels"] is None
    assert (
        got[0]["evaluation"]["results"][0]["score"] == rows[0]["evaluation"]["results"][0]["score"]
    )
    assert got[2]["evaluation"] is None


def test_a_sidecar_that_does_not_describe_its_object_is_refused() -> None:
    lines = [dumps_line(record(f"t{n}")) for n in range(5)]
    sidecar, ref, sha, size = sidecar_of(lines)
    other, other_ref, _, _ = sidecar_of([*lines[:4], dumps_line(record("t9"))])

    def refused(data: bytes, ref: SidecarRef, **kw: Any) -> str:
        args = {"shard_sha256": sha, "records": 5, "shard_bytes": size} | kw
        with pytest.raises(SidecarError) as caught:
            read_sidecar(data, ref, **args)
        return str(caught.value)

    assert "sha256" in refused(sidecar[:-1] + b"x", ref)  # its bytes are not its commit's
    assert "another object" in refused(other, other_ref)  # the sidecar of another shard
    assert "rows" in refused(sidecar, ref, records=6)
    assert "end at" in refused(sidecar, ref, shard_bytes=size + 1)
    assert "version" in refused(sidecar, ref.model_copy(update={"version": "9"}))
    assert read_sidecar(sidecar, ref, shard_sha256=sha, records=5, shard_bytes=size).num_rows == 5


def test_fields_of_unexpected_types_make_no_sidecar() -> None:
    bad = record("a", labels=2)
    bad["human_labels"][0]["rubric"]["safety"] = "high"
    with pytest.raises((ValueError, TypeError)):
        build_sidecar([index_row(bad)], [10], "0" * 64)


async def written_corpus() -> MemoryStore:
    store = MemoryStore()
    settings = Settings(partitions=2, shard_max_records=10,
                        corpora=(CorpusSpec(name="traces", source=None),))  # fmt: skip
    events = generate(60, seed=5, shape=SHAPES["standard"], start=START)
    lines = [(f"e:{n}", orjson.dumps(e)) for n, e in enumerate(events, 1)]
    await replay(settings, store, lines, run_id="s1")
    return store


async def read_objects(store: MemoryStore, refused: list[str]) -> list[ObjectLines]:
    reader = CorpusReader(store, TRACES, columns=True, refused=refused.append)
    stop = asyncio.Event()
    stop.set()  # one pass
    return [item async for item in reader.follow_objects(stop=stop)]


async def test_the_sink_and_compaction_write_sidecars_readers_read_them() -> None:
    store = await written_corpus()
    commits = [Commit.model_validate(orjson.loads(v)) for k, v in store.objects.items()
               if "/_manifest/" in k]  # fmt: skip
    assert len(commits) > 2
    for commit in commits:
        assert commit.index is not None
        assert commit.index.key == TRACES.relative(sidecar_key(TRACES.key(commit.shard)))
        assert TRACES.key(commit.index.key) in store.objects
    refused: list[str] = []
    items = await read_objects(store, refused)
    assert refused == []
    assert all(item.columns is not None and item.data == b"" for item in items)
    plain = [item async for item in CorpusReader(store, TRACES).records()]
    from_columns = [(r["trace_id"], r["revision"]) for item in items
                    for r in item.columns.to_pylist()]  # fmt: skip
    assert from_columns == [(r["trace_id"], r["revision"]) for r in plain]
    assert (await verify(store)).ok

    made = await compact(store, TRACES, writer="test")
    assert made is not None
    assert all(part.get("index") for part in made.parts)
    items = await read_objects(store, refused)
    assert refused == []
    assert sum(item.count for item in items) == made.records
    assert all(item.columns is not None for item in items)


async def test_a_tampered_sidecar_is_refused_and_its_shard_read_instead() -> None:
    store = await written_corpus()
    sidecars = sorted(k for k in store.objects if k.endswith(".index.parquet"))
    store.objects[sidecars[0]] = store.objects[sidecars[1]]  # a valid sidecar, not its own
    refused: list[str] = []
    items = await read_objects(store, refused)
    assert len(refused) == 1
    assert "does not match" in refused[0]
    as_lines = [item for item in items if item.columns is None]
    assert len(as_lines) == 1
    assert as_lines[0].data.count(b"\n") == as_lines[0].count  # nothing lost
    del store.objects[sidecars[2]]  # a missing one: read whole too
    refused.clear()
    await read_objects(store, refused)
    assert len(refused) == 2
    report = await verify(store)
    assert not report.ok
    assert any("does not match" in p for p in report.problems)


def test_a_version_1_sidecar_is_read_with_version_2s_label_fields_null() -> None:
    """Sidecars written before labels carried their time, comment, rubric version, kind and
    reward (version 1) are still used, those fields null (not a reason to read the object)."""
    import io

    import pyarrow as pa
    import pyarrow.parquet as pq

    from rl_export.corpora.sidecar import SCHEMA, SCHEMA_V1

    rows = [record("a", labels=2), record("b", source=None, reward=None, passed=None)]
    del rows[1]["human_labels"]
    lines = [dumps_line(r) for r in rows]
    new, _, sha, size = sidecar_of(lines)
    table = pq.read_table(io.BytesIO(new))
    labels = [[{"labeler": x["labeler"], "rubric": x["rubric"]} for x in row] if row else None
              for row in table.column("labels").to_pylist()]  # fmt: skip
    old_table = table.set_column(
        table.column_names.index("labels"),
        "labels",
        pa.array(labels, SCHEMA_V1.field("labels").type),
    ).replace_schema_metadata(table.schema.metadata)
    out = io.BytesIO()
    pq.write_table(old_table, out)
    old = out.getvalue()
    ref = SidecarRef(key="x.index.parquet", sha256=hashlib.sha256(old).hexdigest(),
                     bytes=len(old), rows=2, version="1")  # fmt: skip
    read = read_sidecar(old, ref, shard_sha256=sha, records=2, shard_bytes=size)
    assert read.schema.remove_metadata().equals(SCHEMA)
    got = read.column("labels").to_pylist()
    assert [x["labeler"] for x in got[0]] == ["ana", "bo"]
    assert got[0][0]["rubric"] == rows[0]["human_labels"][0]["rubric"]
    assert {x["occurred_at"] for x in got[0]} == {None}
    assert got[1] is None
    # The current version holds them as written.
    new_ref = SidecarRef(key="x", sha256=hashlib.sha256(new).hexdigest(), bytes=len(new), rows=2)
    current = read_sidecar(new, new_ref, shard_sha256=sha, records=2, shard_bytes=size)
    assert current.column("labels").to_pylist()[0][0]["occurred_at"] == (
        rows[0]["human_labels"][0]["occurred_at"])  # fmt: skip
