"""Records read only as far as an export needs them give the same bytes as records parsed in
full: the decoder against orjson, the filters' and formats' fields against the whole record,
and every export of the story both ways."""

from __future__ import annotations

import io
from datetime import UTC, datetime
from typing import Any

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rl_export.corpora.layout import CorpusRef
from rl_export.corpora.store import MemoryStore
from rl_export.export import exports, write_export
from rl_export.export.columns import RECORD_FIELDS
from rl_export.export.lazy import DecodeError, FieldDecoder, export_fields
from rl_export.formats.chat import Chat
from rl_export.formats.filters import Filters
from rl_export.formats.render import JSONL_FORMATS, TABULAR_FORMATS, render_row, row_fields
from rl_export.model.codec import RawJson, dumps, dumps_line
from tests.exportdata import ORG, PROJECT, build_story

json_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**63), 2**64 - 1),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(),
    st.sampled_from(["\u2028", "\u2029", 'q"uote', "back\\slash", "\x00\x1f", "\U0001f600"]),
)
json_values = st.recursive(
    json_scalars,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=5), inner, max_size=4)
    ),
    max_leaves=12,
)
records = st.dictionaries(
    st.sampled_from([*RECORD_FIELDS[:12], "messages", "deleted", "x-other", "\u2028k"]),
    json_values,
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(rows=st.lists(records, min_size=1, max_size=5), fields=st.sets(
    st.sampled_from(["trace_id", "reward", "passed", "evaluation", "x-other", "\u2028k"])),
    raw=st.sets(st.sampled_from(["messages", "rubric"])))  # fmt: skip
def test_the_decoder_reads_what_orjson_reads(
    rows: list[dict[str, Any]], fields: set[str], raw: set[str]
) -> None:
    data = b"".join(dumps_line(r) for r in rows)
    decoded = FieldDecoder(fields, raw).decode(memoryview(data))
    assert len(decoded) == len(rows)
    for got, line in zip(decoded, data.splitlines(), strict=True):
        full = orjson.loads(line)
        assert set(got) == set(full) & (fields | raw)
        for name, value in got.items():
            if name in raw:
                assert isinstance(value, RawJson)
                assert value.data == dumps(full[name])  # the bytes as stored
            else:
                assert value == full[name]
                assert dumps(value) == dumps(full[name])  # same type, same float


def test_a_line_that_is_not_an_object_is_a_decode_error() -> None:
    with pytest.raises(DecodeError):
        FieldDecoder({"trace_id"}).decode(b'{"trace_id":"a"}\n[1]\n')
    with pytest.raises(DecodeError):
        FieldDecoder({"trace_id"}).decode(b'{"trace_id":"a"\n')


FILTERS = [
    Filters(),
    Filters(passed=True),
    Filters(passed=False, min_reward=0.3),
    Filters(max_reward=0.5),
    Filters(agent_version="v2"),
    Filters(scenario="travel"),
    Filters(labeled=True),
    Filters(since=datetime(2026, 1, 1, 0, 5, tzinfo=UTC)),
    Filters(until=datetime(2026, 1, 1, 0, 5, tzinfo=UTC)),
    Filters(pass_dimension=("goal_met",)),
    Filters(max_severity=1),
    Filters(passed=True, scenario="refund", labeled=False, max_severity=4),
]


@pytest.mark.parametrize("filters", FILTERS, ids=str)
async def test_a_record_of_the_filters_fields_matches_as_the_whole_record(
    story: MemoryStore, filters: Filters
) -> None:
    for record in await trajectories(story):
        part = {k: v for k, v in record.items() if k in filters.fields()}
        assert filters.matches(part) == filters.matches(record)


@pytest.fixture(scope="module")
async def story() -> MemoryStore:
    store = MemoryStore()
    await build_story(store)
    return store


async def trajectories(store: MemoryStore) -> list[dict[str, Any]]:
    out = io.BytesIO()
    await write_export(store, CorpusRef(ORG, PROJECT, "evaluator"), format="trajectory",
                       out=out)  # fmt: skip
    return [orjson.loads(line) for line in out.getvalue().splitlines()]


@pytest.mark.parametrize("fmt", [f for f in JSONL_FORMATS if f not in ("trajectory",
                                                                        "preference")])  # fmt: skip
async def test_a_record_of_the_formats_fields_renders_as_the_whole_record(
    story: MemoryStore, fmt: str
) -> None:
    found = row_fields(fmt)
    assert found is not None
    parsed, raw = found
    for record in await trajectories(story):
        part = {k: v for k, v in record.items() if k in parsed}
        part |= {k: RawJson(dumps(v)) for k, v in record.items() if k in raw}
        whole = render_row(fmt, record)
        lazy = render_row(fmt, part)
        assert (whole is None) == (lazy is None)
        if whole is not None:
            assert dumps_line(lazy) == dumps_line(whole)


CASES: list[tuple[str, dict[str, Any]]] = [
    *((fmt, {}) for fmt in JSONL_FORMATS),
    *(("trajectory", {"filters": f}) for f in FILTERS[1:]),
    *(("messages", {"filters": f}) for f in FILTERS[1:]),
    ("executions", {"filters": Filters(pass_dimension=("goal_met",))}),
    ("kto", {"filters": Filters(min_reward=0.2, limit=2)}),
    ("preference", {"pair_by": ("scenario",)}),
    ("csv", {"columns": "trace_id,reward,passed:ok,rubric.safety,evaluator_scores.tone,"
                        "evaluation.report,messages.1.content,updated_at"}),
    ("csv", {}),
    ("json", {"columns": "trace_id,scenario,labels_count,evaluation.results",
              "filters": Filters(passed=True)}),
    ("parquet", {"columns": "trace_id,reward,passed,revision,rubric.safety"}),
    ("zip", {"columns": "trace_id,attachments"}),
]  # fmt: skip


@pytest.mark.parametrize(("fmt", "options"), CASES)
@pytest.mark.parametrize("source", ["evaluator", "human", "traces"])
async def test_every_export_is_the_same_bytes_parsed_in_full_or_in_part(
    story: MemoryStore,
    fmt: str,
    options: dict[str, Any],
    source: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    ref = CorpusRef(ORG, PROJECT, source)
    lazy = io.BytesIO()
    lazy_summary = await write_export(story, ref, format=fmt, out=lazy, **options)
    with monkeypatch.context() as patch:
        patch.setattr(exports, "export_fields", lambda *a, **k: None)
        whole = io.BytesIO()
        whole_summary = await write_export(story, ref, format=fmt, out=whole, **options)
    if fmt == "zip":  # the archive's entries, not its timestamps
        import zipfile

        def entries(data: bytes) -> dict[str, bytes]:
            with zipfile.ZipFile(io.BytesIO(data)) as archive:
                return {n: archive.read(n) for n in archive.namelist()}

        assert entries(lazy.getvalue()) == entries(whole.getvalue())
    else:
        assert lazy.getvalue() == whole.getvalue()
    assert lazy_summary == whole_summary


def test_which_fields_each_export_reads() -> None:
    assert export_fields("messages", Filters(passed=True), chat=Chat("raw")) == (
        frozenset({"deleted", "passed"}), frozenset({"messages"}))  # fmt: skip
    assert export_fields("messages", Filters(passed=True)) == (  # hf: parsed to restyle
        frozenset({"deleted", "passed", "messages"}), frozenset())  # fmt: skip
    assert export_fields("trajectory", Filters(min_reward=0.5)) == (
        frozenset({"deleted", "reward"}), frozenset())  # fmt: skip
    from rl_export.export.columns import parse_columns

    columns = parse_columns("rubric.safety,messages.0.content:first")
    assert export_fields("csv", Filters(), columns) == (
        frozenset({"deleted", "rubric", "messages"}), frozenset())  # fmt: skip
    assert export_fields("zip", Filters(), columns) is None
    wanted = frozenset({"deleted", "messages", "reward", "trace_id", "scenario"})
    assert export_fields("preference", Filters(), pair_by=("scenario",)) == (wanted, frozenset())
    assert set(TABULAR_FORMATS) == {"csv", "json", "parquet", "zip"}
