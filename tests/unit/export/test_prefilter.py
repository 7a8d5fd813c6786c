"""Exports read through index sidecars are the exports read from the records: the lines a
sidecar turns down are lines the filters turn down, every export is the same bytes with
sidecars, without them (history written before them) and with sidecars refused, and a shard
that changed under its sidecar still fails the export."""

from __future__ import annotations

import hashlib
import io
from datetime import UTC, datetime
from typing import Any

import orjson
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rl_export.corpora.commits import ChainError
from rl_export.corpora.layout import CorpusRef
from rl_export.corpora.sidecar import build_sidecar, index_row, make_ref, read_sidecar
from rl_export.corpora.store import MemoryStore
from rl_export.export import kept, write_export
from rl_export.export.latest import LatestView
from rl_export.export.prefilter import SIDECAR_FILTERS, may_match, sidecar_part
from rl_export.formats.filters import Filters
from rl_export.model.codec import dumps, dumps_line, loads
from tests.exportdata import ORG, PROJECT, build_story
from tests.unit.export.test_lazy import CASES, FILTERS

# --- the prefilter against Filters.matches ----------------------------------------------------

STAMPS = ["2026-01-01T00:04:00Z", "2026-01-01T00:05:00Z", "2026-01-01T00:05:00.5+00:00",
          "2026-01-02T00:00:00Z", "not a time", ""]  # fmt: skip
well_typed = st.fixed_dictionaries(
    {},
    optional={
        "passed": st.one_of(st.none(), st.booleans()),
        "reward": st.one_of(st.none(), st.sampled_from([0.0, 0.25, 0.3, 0.5, 1.0]),
                            st.floats(0, 1)),
        "agent_version": st.one_of(st.none(), st.sampled_from(["v1", "v2", "", "v2 "])),
        "scenario": st.one_of(st.none(), st.sampled_from(["travel", "refund", "Travel"])),
        "updated_at": st.one_of(st.none(), st.sampled_from(STAMPS)),
        "labels_count": st.one_of(st.none(), st.integers(0, 4)),
    },
).map(lambda r: {"trace_id": "t", "revision": 1, **r})  # fmt: skip
sidecar_filters = st.builds(
    Filters,
    passed=st.one_of(st.none(), st.booleans()),
    min_reward=st.one_of(st.none(), st.sampled_from([0.0, 0.25, 0.3, 1.0])),
    max_reward=st.one_of(st.none(), st.sampled_from([0.0, 0.3, 0.5])),
    agent_version=st.one_of(st.none(), st.sampled_from(["v1", "v2", ""])),
    scenario=st.one_of(st.none(), st.sampled_from(["travel", "refund"])),
    since=st.one_of(st.none(), st.just(datetime(2026, 1, 1, 0, 5, tzinfo=UTC))),
    until=st.one_of(st.none(), st.just(datetime(2026, 1, 1, 0, 5, 1, tzinfo=UTC))),
    labeled=st.one_of(st.none(), st.booleans()),
    min_labels=st.one_of(st.none(), st.integers(0, 3)),
)


def table_of(records: list[dict[str, Any]]) -> pa.Table:
    """Records through a sidecar, as a reader gets them back."""
    lines = [dumps_line(r) for r in records]
    data = b"".join(lines)
    sha = hashlib.sha256(data).hexdigest()
    sidecar = build_sidecar([index_row(orjson.loads(x)) for x in lines],
                            [len(x) for x in lines], sha)  # fmt: skip
    return read_sidecar(sidecar, make_ref("s.index.parquet", sidecar, len(lines)),
                        shard_sha256=sha, records=len(lines), shard_bytes=len(data))  # fmt: skip


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(records=st.lists(well_typed, min_size=1, max_size=12), filters=sidecar_filters)
def test_a_sidecar_turns_down_exactly_the_rows_the_filters_turn_down(
    records: list[dict[str, Any]], filters: Filters
) -> None:
    part = sidecar_part(filters)
    if part is None:
        assert filters.is_empty()
        return
    bits = may_match(part, table_of(records))
    got = [bool(bits >> n & 1) for n in range(len(records))]
    assert got == [filters.matches(r) for r in records]


def test_only_the_filters_a_sidecar_holds_are_asked_of_it() -> None:
    assert sidecar_part(Filters()) is None
    assert sidecar_part(Filters(pass_dimension=("goal_met",), max_severity=1, limit=3)) is None
    both = Filters(passed=True, max_severity=2, max_spread=0.5, limit=9)
    assert sidecar_part(both) == Filters(passed=True)
    assert set(SIDECAR_FILTERS) <= set(Filters.model_fields)


@pytest.mark.parametrize(
    "record",
    [
        {"passed": 1, "reward": True, "labels_count": True},  # types a sidecar may coerce
        {"passed": True, "reward": 1, "labels_count": 2.0},
    ],
)
def test_a_record_of_loose_types_is_never_turned_down_when_it_matches(
    record: dict[str, Any],
) -> None:
    record = {"trace_id": "t", "revision": 1, **record}
    try:
        table = table_of([record])
    except (ValueError, TypeError, pa.ArrowException):
        return  # no sidecar is written for it: the record is read
    for filters in (Filters(passed=True), Filters(min_reward=0.5), Filters(labeled=True),
                    Filters(min_labels=1)):  # fmt: skip
        part = sidecar_part(filters)
        assert part is not None
        if filters.matches(record):
            assert may_match(part, table) & 1


# --- whole exports, with sidecars and without ---------------------------------------------


@pytest.fixture(scope="module")
async def story() -> MemoryStore:
    store = MemoryStore()
    await build_story(store)
    return store


def without_sidecars(store: MemoryStore) -> MemoryStore:
    """The corpora as written before sidecars: commits and compaction parts name none."""
    out = MemoryStore()
    for key, data in store.objects.items():
        if key.endswith(".index.parquet"):
            continue
        if "/_manifest/" in key or key.endswith("_compaction.json"):
            value = loads(data)
            value.pop("index", None)
            for part in value.get("parts", []):
                part.pop("index", None)
            out.objects[key] = dumps(value)
        else:
            out.objects[key] = data
    return out


def refused_sidecars(store: MemoryStore) -> MemoryStore:
    """Every sidecar changed after its commit was written: each is refused."""
    out = MemoryStore()
    out.objects = {
        key: data + b"x" if key.endswith(".index.parquet") else data
        for key, data in store.objects.items()
    }
    return out


async def test_the_story_is_read_through_its_sidecars(story: MemoryStore) -> None:
    ref = CorpusRef(ORG, PROJECT, "evaluator")
    view = await LatestView(story, ref).open()
    assert view.sidecars_read == len(view.tail) + len(view.compaction_parts) > 0
    assert view.sidecars_refused == 0
    refused = await LatestView(refused_sidecars(story), ref).open()
    assert refused.sidecars_read == 0
    assert refused.sidecars_refused == view.sidecars_read
    bare = await LatestView(without_sidecars(story), ref).open()
    assert bare.sidecars_read == bare.sidecars_refused == 0


SIDECAR_CASES = [
    *CASES,
    *(("trajectory", {"filters": f, "redact": "none"}) for f in FILTERS[1:]),
    ("csv", {"columns": "trace_id,reward", "filters": Filters(passed=True, min_reward=0.5)}),
]


@pytest.mark.parametrize(("fmt", "options"), SIDECAR_CASES)
@pytest.mark.parametrize("source", ["evaluator", "human", "traces"])
async def test_every_export_is_the_same_bytes_with_sidecars_or_without(
    story: MemoryStore, fmt: str, options: dict[str, Any], source: str
) -> None:
    ref = CorpusRef(ORG, PROJECT, source)
    results = []
    for store in (story, without_sidecars(story), refused_sidecars(story)):
        out = io.BytesIO()
        summary = await write_export(store, ref, format=fmt, out=out, **options)
        results.append((_entries(out.getvalue()) if fmt == "zip" else out.getvalue(), summary))
    assert results[1] == results[0]
    assert results[2] == results[0]


def _entries(data: bytes) -> dict[str, bytes]:
    """A zip's entries (not its timestamps)."""
    import zipfile

    with zipfile.ZipFile(io.BytesIO(data)) as archive:
        return {n: archive.read(n) for n in archive.namelist()}


async def test_a_filtered_export_counts_the_lines_its_sidecars_turned_down(
    story: MemoryStore,
) -> None:
    ref = CorpusRef(ORG, PROJECT, "evaluator")
    total = (await LatestView(story, ref).open()).total
    summary = await write_export(story, ref, format="messages", out=io.BytesIO(),
                                 filters=Filters(passed=True))  # fmt: skip
    assert summary.scanned == total > summary.matched > 0


async def test_a_shard_changed_under_its_sidecar_fails_the_export(story: MemoryStore) -> None:
    ref = CorpusRef(ORG, PROJECT, "evaluator")
    store = MemoryStore()
    store.objects = dict(story.objects)
    after = f"{ref.root}/data/replay-after"
    shard = next(k for k in store.objects if k.startswith(after) and k.endswith(".jsonl"))
    store.objects[shard] = store.objects[shard].replace(b'"reward"', b'"rewarD"', 1)
    with pytest.raises(ChainError, match="sha256"):
        await write_export(store, ref, format="trajectory", out=io.BytesIO())
    with pytest.raises(ChainError, match="sha256"):
        await write_export(store, ref, format="messages", out=io.BytesIO(),
                           filters=Filters(passed=True))  # fmt: skip


@pytest.mark.parametrize("batch", [1, 500, 1 << 22])
async def test_kept_lines_fetched_by_range_in_batches_of_any_size_are_the_same_export(
    story: MemoryStore, batch: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    ref = CorpusRef(ORG, PROJECT, "evaluator")
    filters = Filters(passed=True, min_reward=0.2)
    bare = io.BytesIO()
    await write_export(without_sidecars(story), ref, format="messages", out=bare, filters=filters)
    monkeypatch.setattr(kept, "RANGE_BATCH", batch)
    ranged = io.BytesIO()
    await write_export(story, ref, format="messages", out=ranged, filters=filters)
    assert ranged.getvalue() == bare.getvalue() != b""
