"""The open table (corpora/table.py): compaction keeps a Delta table equal to the latest view.

Read back with deltalake itself (no JVM; Spark, Polars and pandas read it in
``make test-engines``)."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from deltalake import DeltaTable
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rl_export.corpora import tablerows
from rl_export.corpora.compacted import read_compaction
from rl_export.corpora.compaction import compact
from rl_export.corpora.erasures import record_erasures
from rl_export.corpora.layout import CorpusRef
from rl_export.corpora.store import LocalStore, MemoryStore
from rl_export.corpora.table import (
    APP_ID,
    POSITION_KEY,
    TableLocation,
    TableSync,
    locate,
    s3_options,
    table_key,
    write_table,
)
from tests.tablecheck import differences
from tests.unit.corpora.test_compaction import REF, Chains, rec, tomb

COLUMNS = list(tablerows.TRAJECTORY_FIELDS)


def record(trace: str, revision: int, **fields: Any) -> dict[str, Any]:
    """A trajectory record with every kind of column filled."""
    return rec(
        trace, revision, org=REF.org, project=REF.project, reward_source="human",
        reward=revision / 10, passed=revision % 2 == 0, labels_count=revision,
        agent_version=f"v{revision}", scenario="s", completed_at="2024-01-01T00:00:00.5Z",
        pass_threshold=0.5, rules_version=1, rubric={"correctness": 4.0}, labelers=["ann"],
        skipped_by=[], evaluator_scores=None, evaluation=None, attachments=[],
        messages=[{"role": "user", "content": f"ünïcode {trace} \u2028 {revision}"}],
        human_labels=[], metadata={"k": [1, {"n": None}]}, **fields,
    )  # fmt: skip


def table_path(root: Path, ref: CorpusRef = REF) -> Path:
    return root / table_key(ref)


def rows_of(path: Path, version: int | None = None) -> list[dict[str, Any]]:
    table = DeltaTable(str(path), version=version)
    rows: list[dict[str, Any]] = table.to_pyarrow_table().to_pylist()
    return rows


async def latest_records(store: LocalStore) -> list[dict[str, Any]]:
    from rl_export.corpora.compacted import latest_compaction

    base = await latest_compaction(store, REF)
    assert base is not None
    return list(await read_compaction(store, REF, base))


async def compacted(store: LocalStore, sync: TableSync | None = None) -> Any:
    sync = sync or TableSync()
    made = await compact(store, REF, writer="test", table=sync)
    assert sync.error is None
    return made, sync


async def test_a_compaction_writes_the_latest_view_as_a_table(tmp_path: Path) -> None:
    store = LocalStore(tmp_path)
    chains = Chains(store)  # type: ignore[arg-type]
    await chains.add(0, [record("a", 1), record("b", 1), record("c", 1)])
    await chains.add(1, [record("d", 1), record("a", 2)])

    made, sync = await compacted(store)

    assert made is not None
    assert sync.written is not None
    assert sync.written.inserted == 4
    assert differences(rows_of(table_path(tmp_path)), await latest_records(store), COLUMNS) == []
    schema = DeltaTable(str(table_path(tmp_path))).to_pyarrow_table().schema
    assert schema.field("revision").type == pa.int64()
    assert schema.field("labels_count").type == pa.int32()
    assert schema.field("passed").type == pa.bool_()
    assert schema.field("updated_at").type == pa.timestamp("us", tz="UTC")
    assert schema.field("messages").type == pa.string()


async def test_re_scores_replace_rows_and_tombstones_delete_them(tmp_path: Path) -> None:
    store = LocalStore(tmp_path)
    chains = Chains(store)  # type: ignore[arg-type]
    await chains.add(0, [record("a", 1), record("b", 1), record("c", 1)])
    await compacted(store)
    # A newer revision, a stale one (older than the table's), a tombstone, a new trace.
    await chains.add(0, [record("a", 3), tomb("b", 2), record("e", 1)])
    await chains.add(1, [record("a", 2)])

    _, sync = await compacted(store)

    assert sync.written is not None
    assert (sync.written.inserted, sync.written.updated, sync.written.deleted) == (1, 1, 1)
    rows = rows_of(table_path(tmp_path))
    assert {r["trace_id"]: r["revision"] for r in rows} == {"a": 3, "c": 1, "e": 1}
    assert differences(rows, await latest_records(store), COLUMNS) == []


async def test_every_table_commit_names_the_position_it_reflects(tmp_path: Path) -> None:
    store = LocalStore(tmp_path)
    chains = Chains(store)  # type: ignore[arg-type]
    await chains.add(0, [record("a", 1)])
    first, _ = await compacted(store)
    await chains.add(1, [record("a", 1)])  # a repeat: the MERGE changes nothing
    second, sync = await compacted(store)

    table = DeltaTable(str(table_path(tmp_path)))
    assert table.transaction_version(APP_ID) == second.generation == 2
    newest, before = table.history(2)
    assert newest[POSITION_KEY] == {"generation": 2, "chains": second.positions}
    assert before[POSITION_KEY] == {"generation": 1, "chains": first.positions}
    assert sync.written is not None
    assert sync.written.version == newest["version"]
    assert differences(rows_of(table_path(tmp_path)), await latest_records(store), COLUMNS) == []


async def test_an_erased_trace_is_in_no_version_of_the_table(tmp_path: Path) -> None:
    """Deletion wins: after the erasure no version returns the trace (older versions may not
    be readable at all), and no file of the table holds its id, its log included."""
    store = LocalStore(tmp_path)
    chains = Chains(store)  # type: ignore[arg-type]
    secret = "trace-7f3a-secret"
    await chains.add(0, [record(secret, 1), record("keep", 1)])
    await compacted(store)
    await chains.add(0, [record(secret, 2), record("keep", 2)])  # a re-score: a new version
    await compacted(store)
    await record_erasures(store, REF.org, REF.project, "trajectories-0", [(9, secret, 3)])
    await chains.add(0, [tomb(secret, 3)])

    _, sync = await compacted(store)

    assert sync.written is not None
    assert sync.written.vacuumed
    path = table_path(tmp_path)
    for version in range(DeltaTable(str(path)).version() + 1):
        try:
            rows = rows_of(path, version)
        except Exception:  # its files are gone: it cannot be read, so it returns nothing
            continue
        assert secret not in {r["trace_id"] for r in rows}, version
    holding = [p for p in path.rglob("*") if p.is_file() and secret.encode() in p.read_bytes()]
    assert holding == []
    assert [r["trace_id"] for r in rows_of(path)] == ["keep"]


async def test_a_table_that_is_behind_is_rebuilt_from_the_records(tmp_path: Path) -> None:
    """Made after the corpus (tables switched on late) or missing a generation (its write
    failed): the next write merges every live record and drops what no record names."""
    store = LocalStore(tmp_path)
    chains = Chains(store)  # type: ignore[arg-type]
    await chains.add(0, [record("a", 1), record("b", 1)])
    await compact(store, REF, writer="test")  # no table
    await chains.add(0, [tomb("b", 2), record("c", 1)])

    _, sync = await compacted(store)

    assert sync.written is not None
    assert sync.written.full
    assert differences(rows_of(table_path(tmp_path)), await latest_records(store), COLUMNS) == []


async def test_shards_compact_catches_a_table_up_with_nothing_new(tmp_path: Path) -> None:
    store = LocalStore(tmp_path)
    await Chains(store).add(0, [record("a", 1)])  # type: ignore[arg-type]
    await compact(store, REF, writer="test")  # no table

    assert await compact(store, REF, writer="test", table=TableSync()) is None
    assert not table_path(tmp_path).exists()  # the worker's passes leave it
    assert await compact(store, REF, writer="test", table=TableSync(catch_up=True)) is None
    assert differences(rows_of(table_path(tmp_path)), await latest_records(store), COLUMNS) == []


async def test_a_record_field_the_table_lacks_becomes_a_json_column(tmp_path: Path) -> None:
    store = LocalStore(tmp_path)
    chains = Chains(store)  # type: ignore[arg-type]
    await chains.add(0, [record("a", 1)])
    await compacted(store)
    await chains.add(0, [record("b", 1, comparisons=[{"with": "a"}], novel={"x": 1})])

    await compacted(store)

    rows = rows_of(table_path(tmp_path))
    assert differences(rows, await latest_records(store), [*COLUMNS, "novel"]) == []
    assert {r["trace_id"]: r["novel"] for r in rows} == {"a": None, "b": '{"x":1}'}


async def test_the_memory_store_has_no_table() -> None:
    store = MemoryStore()
    await Chains(store).add(0, [record("a", 1)])
    sync = TableSync()
    assert await compact(store, REF, writer="test", table=sync) is not None
    assert (sync.written, sync.error) == (None, None)
    assert locate(store, REF) is None


def test_s3_options_come_from_the_store_s_own_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    given = {"AWS_ACCESS_KEY_ID": "AKID", "AWS_SECRET_ACCESS_KEY": "SECRET",
             "AWS_SESSION_TOKEN": "TOKEN", "AWS_REGION": "eu-west-3"}  # fmt: skip
    for name, value in given.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("AWS_CONFIG_FILE", "/nonexistent")
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", "/nonexistent")

    local = s3_options("http://127.0.0.1:8333")
    assert local == {
        "AWS_REGION": "eu-west-3", "AWS_ACCESS_KEY_ID": "AKID", "AWS_SECRET_ACCESS_KEY": "SECRET",
        "AWS_SESSION_TOKEN": "TOKEN", "AWS_ENDPOINT_URL": "http://127.0.0.1:8333",
        "AWS_ALLOW_HTTP": "true",
    }  # fmt: skip
    aws = s3_options(None)
    assert "AWS_ENDPOINT_URL" not in aws
    assert "AWS_ALLOW_HTTP" not in aws
    assert repr(TableLocation("s3://b/t", local)).count("SECRET") == 0


def test_two_writers_at_once_leave_the_newest_generation(tmp_path: Path) -> None:
    """Two compactors racing on one table (generations 2 and 3, from a table at 1): the
    conditional commit lets one win; the other reloads and decides again. Whatever the order,
    the table ends at generation 3 with its records."""
    location = TableLocation(str(tmp_path / "t"))
    one = [record("a", 1), record("b", 1)]
    three = [record("a", 3), record("c", 1)]
    assert write_table(location, "trajectory", changes=one, records=None, applies_to=0,
                       generation=1, position=tablerows.position(1, {})) is not None  # fmt: skip
    start = threading.Barrier(2)
    errors: list[BaseException] = []

    def write(changes: list[dict[str, Any]], applies_to: int, generation: int,
              records: list[dict[str, Any]]) -> None:  # fmt: skip
        start.wait()
        try:
            write_table(location, "trajectory", changes=changes, records=lambda: records,
                        applies_to=applies_to, generation=generation,
                        position=tablerows.position(generation, {}))  # fmt: skip
        except BaseException as exc:
            errors.append(exc)

    threads = [
        threading.Thread(target=write, args=([record("a", 2)], 1, 2,
                                             [record("a", 2), record("b", 1)])),
        threading.Thread(target=write, args=([record("a", 3), tomb("b", 2), record("c", 1)], 2,
                                             3, three)),
    ]  # fmt: skip
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert errors == []
    table = DeltaTable(location.uri)
    assert table.transaction_version(APP_ID) == 3
    assert differences(table.to_pyarrow_table().to_pylist(), three, COLUMNS) == []


# --- generated histories -------------------------------------------------------------------

TRACES = st.sampled_from(["t1", "t2", "t3", "t4", "t5"])
LINE = st.tuples(TRACES, st.integers(1, 6), st.booleans(), st.integers(0, 1))
HISTORY = st.lists(
    st.tuples(st.lists(LINE, min_size=1, max_size=5), st.booleans()), min_size=1, max_size=6
)


@settings(
    max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(history=HISTORY)
async def test_after_any_history_the_table_is_the_latest_view(
    tmp_path_factory: pytest.TempPathFactory, history: list[tuple[list[Any], bool]]
) -> None:
    """Commits of records and tombstones in any order, on two chains, compacted now and
    then: after every compaction the table holds exactly the compaction's records."""
    root = tmp_path_factory.mktemp("table")
    store = LocalStore(root)
    chains = Chains(store)  # type: ignore[arg-type]
    for lines, compact_now in [*history[:-1], (history[-1][0], True)]:
        for partition in (0, 1):
            rows = [record(t, r) if not gone else tomb(t, r)
                    for t, r, gone, p in lines if p == partition]  # fmt: skip
            if rows:
                await chains.add(partition, rows)
        if compact_now:
            made, _sync = await compacted(store)
            if made is None:
                continue
            rows = rows_of(table_path(root))
            assert differences(rows, await latest_records(store), COLUMNS) == []


async def view_records(store: LocalStore, at: Any = None) -> list[dict[str, Any]]:
    """Our latest view (the exports' reader), at a position or now."""
    from rl_export.export.latest import LatestView
    from rl_export.model.codec import loads

    view = LatestView(store, REF, at=at)
    await view.open()
    return [loads(line) async for batch in view.lines() for line in batch]


async def test_a_pinned_version_records_the_delta_version_of_its_position(tmp_path: Path) -> None:
    """A version pinned with commits after the latest compaction: the table is written at
    that position (the tail merged), and reading the table at the version's Delta version
    gives the version's view after more traffic and another compaction."""
    from rl_export.export.latest import ViewPosition
    from rl_export.export.versions import pin

    store = LocalStore(tmp_path)
    chains = Chains(store)  # type: ignore[arg-type]
    await chains.add(0, [record("a", 1), record("b", 1), record("c", 1)])
    await compacted(store)
    await chains.add(1, [record("a", 2), tomb("c", 2), record("d", 1)])  # the tail

    version = await pin(store, REF, "v1", fmt="trajectory")

    assert version.delta_version is not None
    pinned = await view_records(store, ViewPosition.from_json(version.position()))
    assert {r["trace_id"] for r in pinned} == {"a", "b", "d"}
    path = table_path(tmp_path)
    assert differences(rows_of(path, version.delta_version), pinned, COLUMNS) == []
    position = DeltaTable(str(path)).history(1)[0][POSITION_KEY]
    assert position == {"generation": 1, "chains": version.ends}

    await chains.add(0, [record("b", 2), record("e", 1)])
    await compacted(store)
    assert differences(rows_of(path), await view_records(store), COLUMNS) == []
    assert differences(rows_of(path, version.delta_version), pinned, COLUMNS) == []
    assert (await pin(store, REF, "v0")).delta_version is None  # no format: no table write
