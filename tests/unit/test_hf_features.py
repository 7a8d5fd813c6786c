"""``rl_export.hf.corpus_dataset`` declares its ``features`` (issue 42): for every format it
yields, on a corpus of hostile conversations (parts, nulls, several tool calls, tool results
as parts, unknown message keys, metadata, floats that only an exact codec keeps), the rows
match the declared features, keep them through ``select_columns`` / ``filter`` / ``map`` and
materialise with them; and ``split=`` gives the export's ``--split`` rows."""

from __future__ import annotations

import asyncio
import io
import json
import math
from pathlib import Path
from typing import Any

import datasets
import orjson
import pytest

from rl_export.corpora.layout import CorpusRef
from rl_export.corpora.reader import CorpusReader
from rl_export.corpora.replay import replay
from rl_export.corpora.store import LocalStore
from rl_export.export import parse_split, write_export
from rl_export.formats.chat import parse_chat
from rl_export.formats.render import render_row
from rl_export.hf import ROW_FORMATS, corpus_dataset, row_features
from rl_export.model.codec import dumps
from rl_export.runtime.settings import load_settings
from tests.exportdata import ORG, PROJECT
from tests.records import trace_events
from tests.unit.export.test_render_matrix import CONVERSATIONS

EVALUATOR = CorpusRef(ORG, PROJECT, "evaluator")
PRECISE = 0.12345678901234568  # datasets' own Json codec keeps ten digits of it


def events() -> list[dict[str, Any]]:
    """Every render-matrix conversation as a trace (passed and failed ones, labelled ones),
    with metadata and attachments holding free-form values."""
    out: list[dict[str, Any]] = []
    for n, (name, given) in enumerate(sorted(CONVERSATIONS.items()), start=1):
        messages = orjson.loads(orjson.dumps(given))
        messages[-1]["x_score"] = PRECISE  # an unknown message key with a float
        trace = trace_events(
            n, score=0.7 if n % 2 else 0.3, passed=bool(n % 2), minute=n,
            labels=({"correctness": 4, "helpfulness": 3, "efficiency": 5, "safety": 4},)
            if n % 3 == 0 else (),
            messages=messages, scenario=f"s{n % 3}",
            attachments=[{"name": f"{name}.txt", "uri": f"s3://b/{name}.txt",
                          "content_type": "text/plain",
                          "size": n, "x_extra": {"pages": [n, None]}}],
        )  # fmt: skip
        trace[0]["metadata"] = {"case": name, "weight": PRECISE, "tags": ["a", None, 3]}
        out += trace
    return out


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("hf-features")
    settings = load_settings(partitions=4, shard_max_records=3)
    lines = [(f"e:{n}", dumps(e)) for n, e in enumerate(events())]
    report = asyncio.run(replay(settings, LocalStore(root), lines))
    assert not report.invalid, report.examples
    return root


def records(root: Path) -> list[dict[str, Any]]:
    """The corpus's live records as the reader gives them, ``comparisons`` null where a
    trace has none (a declared column: the row of such a record has it null)."""

    async def read() -> list[dict[str, Any]]:
        reader = CorpusReader(LocalStore(root), EVALUATOR)
        live = [r async for r in reader.records(latest_only=True) if not r.get("deleted")]
        return [{**r, "comparisons": r.get("comparisons")} for r in live]

    return asyncio.run(read())


def canonical(rows: list[dict[str, Any]]) -> list[bytes]:
    return sorted(orjson.dumps(r, option=orjson.OPT_SORT_KEYS) for r in rows)


def close(a: Any, b: Any) -> bool:
    """Equal, floats up to datasets' Json precision (materialised copies only)."""
    if isinstance(a, float) or isinstance(b, float):
        return isinstance(a, int | float) and isinstance(b, int | float) and math.isclose(
            a, b, rel_tol=1e-9)  # fmt: skip
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(close(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(close(x, y) for x, y in zip(a, b, strict=True))
    return bool(a == b)


CASES = [(f, None) for f in ROW_FORMATS] + [
    ("messages", "raw"), ("messages", "openai"), ("prompt_completion", "raw"), ("kto", "raw"),
]  # fmt: skip


@pytest.mark.parametrize(("fmt", "style"), CASES)
def test_every_format_declares_features_its_rows_match(
    store: Path, fmt: str, style: str | None
) -> None:
    ds = corpus_dataset(str(store), ORG, PROJECT, "evaluator", format=fmt, chat_style=style)
    features = ds.features
    assert features is not None
    assert features == row_features(fmt)
    rows = list(ds)
    chat = parse_chat(style)
    expected = [render_row(fmt, r, chat=chat) for r in records(store)]
    assert len(rows) == len([e for e in expected if e is not None]) > 0
    # Exactly the rendered rows (floats included: no lossy codec on the way), every column.
    assert all(list(r) and r.keys() == features.keys() for r in rows)
    assert canonical(rows) == canonical([e for e in expected if e is not None])
    for row in rows:
        features.encode_example(row)  # raises for a value that does not fit
    first = next(iter(features))
    assert ds.select_columns([first]).features == datasets.Features({first: features[first]})
    assert ds.filter(lambda r: True).features == features
    mapped = ds.map(lambda r: r, features=features)
    assert mapped.features == features
    assert canonical(list(mapped)) == canonical(rows)
    # Materialised (what to_parquet writes), read back with the same types.
    table = datasets.Dataset.from_generator(lambda: iter(ds), features=features)
    assert table.features == features
    assert len(table) == len(rows)
    ordered = sorted(rows, key=lambda r: orjson.dumps(r, option=orjson.OPT_SORT_KEYS))
    got = sorted(table, key=lambda r: orjson.dumps(r, option=orjson.OPT_SORT_KEYS))
    assert all(close(a, b) for a, b in zip(got, ordered, strict=True))


def test_chat_columns_are_lists_of_the_messages_as_rendered(store: Path) -> None:
    ds = corpus_dataset(str(store), ORG, PROJECT, "evaluator", format="messages")
    assert ds.features == datasets.Features({"messages": datasets.List(datasets.Json())})
    rows = list(ds)
    calls = [c for r in rows for m in r["messages"] for c in m.get("tool_calls", [])]
    assert calls
    assert all(isinstance(c["function"]["arguments"], dict) for c in calls)
    # No key added to a message (a struct would give every message a null tool_calls).
    assert any("tool_calls" not in m for r in rows for m in r["messages"])
    assert all(v is not None for r in rows for m in r["messages"] for v in m.values())
    assert PRECISE in [m.get("x_score") for r in rows for m in r["messages"]]


def test_trajectory_records_keep_their_free_form_values(store: Path) -> None:
    ds = corpus_dataset(str(store), ORG, PROJECT, "evaluator")
    assert ds.features == row_features("trajectory")
    assert ds.features["metadata"] == datasets.Json()
    rows = list(ds)
    assert canonical(rows) == canonical(records(store))
    assert {r["metadata"]["weight"] for r in rows} == {PRECISE}
    assert any(r["human_labels"] for r in rows)
    for row in rows:
        ds.features.encode_example(row)
    path = store.parent / "trajectory.parquet"
    datasets.Dataset.from_generator(lambda: iter(ds), features=ds.features).to_parquet(path)
    loaded = datasets.Dataset.from_parquet(str(path))
    assert loaded.features == ds.features
    assert sorted(r["trace_id"] for r in loaded) == sorted(r["trace_id"] for r in rows)


def test_stored_rows_of_a_format_have_their_identity_first() -> None:
    assert row_features("messages", corpus_row=True).keys() == {
        "trace_id", "revision", "messages"}  # fmt: skip
    with pytest.raises(ValueError, match="unknown format 'preference'"):
        row_features("preference")


SPLITS = "train=0.5,eval=0.3,test=0.2"


@pytest.mark.parametrize("by", ["trace_id", "scenario", "metadata.case"])
def test_splits_are_disjoint_complete_and_the_exports(store: Path, by: str) -> None:
    everything = list(
        corpus_dataset(str(store), ORG, PROJECT, "evaluator", format="prompt_completion")
    )
    seen: list[str] = []
    for name in ("train", "eval", "test"):
        ds = corpus_dataset(
            str(store), ORG, PROJECT, "evaluator", format="prompt_completion", split=name,
            splits=SPLITS, split_by=by, split_salt="s1",
        )  # fmt: skip
        rows = list(ds)
        out = io.BytesIO()
        asyncio.run(write_export(LocalStore(store), EVALUATOR, format="prompt_completion",
                                 out=out, split=parse_split(name, SPLITS, by, "s1")))  # fmt: skip
        exported = [json.loads(line) for line in out.getvalue().splitlines()]
        assert canonical(rows) == canonical(exported)
        seen += [r["trace_id"] for r in rows]
    assert sorted(seen) == sorted(r["trace_id"] for r in everything)  # disjoint, complete
    assert len(set(seen)) == len(seen)


def test_a_mapping_of_splits_is_the_same_split(store: Path) -> None:
    text = corpus_dataset(str(store), ORG, PROJECT, "evaluator", split="eval", splits=SPLITS)
    mapping = corpus_dataset(str(store), ORG, PROJECT, "evaluator", split="eval",
                             splits={"train": 0.5, "eval": 0.3, "test": 0.2})  # fmt: skip
    assert canonical(list(text)) == canonical(list(mapping))


@pytest.mark.parametrize(
    ("kw", "message"),
    [
        ({"split": "train"}, "splits: split= needs splits="),
        ({"splits": SPLITS}, "splits: only applies with split= NAME"),
        ({"split": "dev", "splits": SPLITS}, "split: 'dev' is not one of splits="),
        ({"split": "train", "splits": "train=0.5"}, "splits: the fractions sum to 0.5"),
        ({"split": "train", "splits": SPLITS, "split_by": "nope"}, "split_by: no record field"),
    ],
)
def test_bad_split_options_say_what_is_wrong(store: Path, kw: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message.replace("(", r"\(")):
        corpus_dataset(str(store), ORG, PROJECT, "evaluator", **kw)


def test_a_chat_template_makes_the_rows_the_export_makes(store: Path, tmp_path: Path) -> None:
    """``chat_template=`` (issue 55): each row made for the template, the rows it cannot
    render left out, exactly the rows of the export with ``--chat-template``."""
    ds = corpus_dataset(str(store), ORG, PROJECT, "evaluator", format="messages",
                        chat_template="mistral_v03_tools")  # fmt: skip
    assert ds.features == row_features("messages", tools=True)
    rows = list(ds)
    assert rows
    ids = [c["id"] for r in rows for m in r["messages"] for c in m.get("tool_calls", [])]
    assert ids
    assert all(len(i) == 9 for i in ids)
    assert not any(m["role"] == "system" for r in rows for m in r["messages"])
    out = tmp_path / "rows.jsonl"
    from rl_export.export.templated import TemplateChoice
    from rl_export.formats.templates import load_template

    asyncio.run(write_export(LocalStore(store), EVALUATOR, format="messages", out=out,
                             redact="none", template=TemplateChoice(
                                 load_template("mistral_v03_tools"))))  # fmt: skip
    exported = [json.loads(line) for line in out.read_text().splitlines()]

    def key(row: dict[str, Any]) -> bytes:  # a declared column a row lacks is null here
        return orjson.dumps({k: v for k, v in row.items() if v is not None},
                            option=orjson.OPT_SORT_KEYS)  # fmt: skip

    assert sorted(map(key, rows)) == sorted(map(key, exported))
    with pytest.raises(ValueError, match="chat_template: only applies to --format messages"):
        corpus_dataset(str(store), ORG, PROJECT, "evaluator", chat_template="chatml")
    with pytest.raises(ValueError, match="chat_template: no chat template 'nope'"):
        corpus_dataset(str(store), ORG, PROJECT, "evaluator", format="kto", chat_template="nope")


def test_records_with_comparisons_load_with_their_declared_features(tmp_path: Path) -> None:
    """A trace's ``comparisons`` (DESIGN.md section 12) is a declared column: records with
    and without it load, those without it as null."""
    from tests.comparisondata import TRACES, trace, vote

    events = [trace(t) for t in TRACES] + [vote(1, "t0", "t1", "ana", "b", 5, 2)]
    lines = [(f"e:{n}", dumps(e)) for n, e in enumerate(events)]
    asyncio.run(replay(load_settings(partitions=4), LocalStore(tmp_path), lines))
    rows = list(corpus_dataset(str(tmp_path), ORG, PROJECT, "traces"))
    compared = {r["trace_id"]: r["comparisons"] for r in rows}
    assert [e["outcome"] for e in compared.pop("t0")] == ["loss"]
    assert [(e["other"], e["strength"]) for e in compared.pop("t1")] == [("t0", 2)]
    assert set(compared.values()) == {None}
