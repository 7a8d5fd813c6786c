"""Exports of a corpus written the real way (replay + compaction + a tail): every format,
filter and tabular option, and what trainers and analysts load them with."""

from __future__ import annotations

import csv
import io
import json
import time
import zipfile
from pathlib import Path
from typing import Any

import pytest

from rl_export.corpora.layout import CorpusRef
from rl_export.corpora.store import LocalStore, MemoryStore
from rl_export.export import (
    ExportSummary,
    content_type,
    file_name,
    iter_export,
    latest_records,
    reward_histogram,
    source_ref,
    stats,
    write_export,
)
from rl_export.formats.chat import Chat
from rl_export.formats.filters import Filters, parse_filters
from rl_export.formats.render import FORMAT_COLUMNS, JSONL_FORMATS
from rl_export.model.codec import dumps_line, iter_lines
from rl_export.model.errors import ExportError, NoDataError
from tests.exportdata import ORG, PROJECT, build_story, replay_events, story_before

EVALUATOR = CorpusRef(ORG, PROJECT, "evaluator")
HUMAN = CorpusRef(ORG, PROJECT, "human")
TRACES = CorpusRef(ORG, PROJECT, "traces")


@pytest.fixture(scope="module")
async def story() -> MemoryStore:
    store = MemoryStore()
    await build_story(store)
    return store


async def export(store: Any, ref: CorpusRef, fmt: str, **kw: Any) -> tuple[bytes, ExportSummary]:
    out = io.BytesIO()
    summary = await write_export(store, ref, format=fmt, out=out, **kw)
    return out.getvalue(), summary


def check_jsonl(data: bytes) -> list[dict[str, Any]]:
    """Strict JSON Lines: UTF-8, one object per \\n-terminated line, no raw U+2028/2029."""
    data.decode("utf-8")
    assert data == b"" or data.endswith(b"\n")
    assert "\u2028".encode() not in data
    assert "\u2029".encode() not in data
    assert b"\r" not in data
    rows = list(iter_lines(data))
    assert all(isinstance(r, dict) for r in rows)
    assert len(rows) == data.count(b"\n")
    return rows


async def test_trajectory_is_the_latest_view_without_tombstones(story: MemoryStore) -> None:
    data, summary = await export(story, EVALUATOR, "trajectory")
    rows = check_jsonl(data)
    ids = sorted(r["trace_id"] for r in rows)
    assert ids == ["tr-001", "tr-002", "tr-005", "tr-006", "tr-007", "tr-008"]
    by_id = {r["trace_id"]: r for r in rows}
    assert by_id["tr-001"]["reward"] == 0.85  # the revision after the compaction won
    assert summary.records == summary.scanned == 6
    assert "\\u2028" in data.decode()  # escaped, not dropped
    assert all(r["updated_at"].endswith("Z") for r in rows)


@pytest.mark.parametrize("fmt", [f for f in JSONL_FORMATS if f != "trajectory"])
async def test_each_format_has_its_documented_columns(story: MemoryStore, fmt: str) -> None:
    data, summary = await export(story, EVALUATOR, fmt)
    rows = check_jsonl(data)
    assert rows, fmt
    assert summary.records == len(rows)
    for row in rows:
        assert list(row) == list(FORMAT_COLUMNS[fmt])


async def test_messages_pass_through_with_tool_calls_and_null_content(story: MemoryStore) -> None:
    data, _ = await export(story, EVALUATOR, "messages", chat=Chat("raw"))
    trajectory, _ = await export(story, EVALUATOR, "trajectory")
    originals = [r["messages"] for r in check_jsonl(trajectory)]
    rows = check_jsonl(data)
    assert [r["messages"] for r in rows] == originals
    first = rows[0]["messages"]
    assert first[2]["content"] is None
    assert first[2]["tool_calls"][0]["function"]["name"] == "lookup_order"
    assert isinstance(first[4]["content"], list)
    assert "x_latency_ms" in first[4]


async def test_a_record_without_a_completion_is_skipped_and_counted(story: MemoryStore) -> None:
    data, summary = await export(story, EVALUATOR, "prompt_completion")
    ids = [r["trace_id"] for r in check_jsonl(data)]
    assert "tr-006" not in ids  # its conversation ends with a user turn with null content
    assert summary.skipped == 1
    assert summary.records == 5


async def test_filters_select_and_limit_counts_rows(story: MemoryStore) -> None:
    cases = {
        "passed=true": (Filters(passed=True), ["tr-001", "tr-005", "tr-007"]),
        "min-reward": (Filters(min_reward=0.5), ["tr-001", "tr-005", "tr-007"]),
        "max-reward": (Filters(max_reward=0.25), ["tr-002", "tr-006"]),
        "scenario": (Filters(scenario="travel"), ["tr-008"]),
        "labeled": (Filters(labeled=True), ["tr-001", "tr-002", "tr-005"]),
        "since": (
            parse_filters({"since": "2026-01-01T00:05:00Z"}),
            ["tr-001", "tr-007", "tr-008"],
        ),
        "until": (
            parse_filters({"until": "2026-01-01T00:05:00Z"}),
            ["tr-002", "tr-005", "tr-006"],
        ),
        "none": (Filters(agent_version="v9"), []),
    }
    for name, (filters, expected) in cases.items():
        data, summary = await export(story, EVALUATOR, "trajectory", filters=filters)
        got = sorted(r["trace_id"] for r in check_jsonl(data))
        assert got == expected, name
        assert summary.matched == len(expected)
    data, summary = await export(story, EVALUATOR, "kto", filters=Filters(limit=2))
    assert len(check_jsonl(data)) == summary.records == 2


async def test_pass_dimension_and_severity(story: MemoryStore) -> None:
    store = MemoryStore()  # the story before tr-003 is deleted
    await replay_events(store, story_before(), "before")
    data, _ = await export(store, EVALUATOR, "executions",
                           filters=Filters(pass_dimension=("goal_met",)))  # fmt: skip
    assert [r["id"] for r in check_jsonl(data)] == ["tr-003"]
    data, _ = await export(store, EVALUATOR, "executions", filters=Filters(max_severity=2))
    assert "tr-003" not in [r["id"] for r in check_jsonl(data)]  # severity 3


async def test_preference_pairs_from_the_corpus(story: MemoryStore) -> None:
    data, _ = await export(story, EVALUATOR, "preference")
    rows = check_jsonl(data)
    assert rows
    for row in rows:
        assert row["score_chosen"] > row["score_rejected"]
        assert row["prompt"][-1]["role"] == "user"
    again, _ = await export(story, EVALUATOR, "preference")
    assert again == data  # deterministic
    narrow, _ = await export(story, EVALUATOR, "preference", margin=0.9)
    assert check_jsonl(narrow) == []
    chosen = [r["trace_chosen"] for r in rows] + [r["trace_rejected"] for r in rows]
    assert len(chosen) == len(set(chosen))  # each trajectory in one pair at most


async def test_an_empty_export_is_a_valid_file(story: MemoryStore) -> None:
    none = Filters(scenario="nope")
    assert (await export(story, EVALUATOR, "messages", filters=none))[0] == b""
    assert json.loads((await export(story, EVALUATOR, "json", filters=none))[0]) == []
    head = (await export(story, EVALUATOR, "csv", filters=none))[0].decode()
    assert head.startswith("trace_id,org,project,revision,")
    assert head.count("\n") == 1


# --- tabular --------------------------------------------------------------------------------


async def test_csv_default_columns_nested_cells_and_unicode(story: MemoryStore) -> None:
    data, _ = await export(story, EVALUATOR, "csv")
    rows = list(csv.reader(io.StringIO(data.decode("utf-8"), newline="")))
    header, body = rows[0], rows[1:]
    assert header[:4] == ["trace_id", "org", "project", "revision"]
    assert "messages" in header
    assert "rules_version" in header
    assert len(body) == 6
    messages = json.loads(body[0][header.index("messages")])
    assert messages[1]["content"].startswith("My order #12 never arrived \u2028")
    assert body[0][header.index("passed")] in ("true", "false")


async def test_columns_pick_nested_keys_rename_and_order(story: MemoryStore) -> None:
    columns = "rubric.safety:Safety,trace_id,evaluator_scores.judge:judge,evaluation.report"
    data, _ = await export(story, HUMAN, "csv", columns=columns)
    rows = list(csv.DictReader(io.StringIO(data.decode(), newline="")))
    assert list(rows[0]) == ["Safety", "trace_id", "judge", "evaluation.report"]
    by_id = {r["trace_id"]: r for r in rows}
    assert by_id["tr-001"]["Safety"] == "5.0"
    assert json.loads(by_id["tr-001"]["evaluation.report"])["classifications"][0]["type"] == (
        "policy"
    )
    data, _ = await export(story, HUMAN, "json", columns="trace_id:id,rubric")
    items = json.loads(data)
    assert list(items[0]) == ["id", "rubric"]
    assert isinstance(items[0]["rubric"], dict)  # nested stays nested in JSON


@pytest.mark.parametrize(
    ("columns", "message"),
    [
        ("nope", "no column 'nope'"),
        ("rubric.Kind-ness", "no column 'rubric.Kind-ness'"),  # a rubric's keys: its questions
        ("answers", "answers needs a question"),
        ("answers.tone.x", "no column 'answers.tone.x'"),
        ("reward.x", "reward has no nested keys"),
        ("messages.first", "messages is a list"),
        ("trace_id,trace_id", "header 'trace_id' is given twice"),
        ("trace_id,,reward", "an empty item"),
    ],
)
async def test_a_bad_column_is_an_error_naming_it(
    story: MemoryStore, columns: str, message: str
) -> None:
    with pytest.raises(ExportError, match=message):
        await export(story, EVALUATOR, "csv", columns=columns)


async def test_parquet_reads_back_with_pyarrow_and_duckdb(
    story: MemoryStore, tmp_path: Path
) -> None:
    import duckdb
    import pyarrow.parquet as pq

    path = tmp_path / "out.parquet"
    columns = "trace_id,reward,passed,rubric.safety:safety,messages"
    summary = await write_export(story, EVALUATOR, format="parquet", out=path, columns=columns)
    table = pq.read_table(path)
    assert table.num_rows == summary.records == 6
    assert table.column_names == ["trace_id", "reward", "passed", "safety", "messages"]
    assert str(table.schema.field("reward").type) == "double"
    assert str(table.schema.field("passed").type) == "bool"
    ((count, passed),) = duckdb.sql(
        f"select count(*), count(*) filter (where passed) from read_parquet('{path}')"
    ).fetchall()
    assert (count, passed) == (6, 3)
    messages = json.loads(table.column("messages")[0].as_py())
    assert messages[0]["role"] == "system"


async def test_duckdb_reads_the_json_lines_and_the_json_array(
    story: MemoryStore, tmp_path: Path
) -> None:
    import duckdb

    for fmt in ("trajectory", "json"):
        path = tmp_path / f"out.{fmt}"
        await write_export(story, EVALUATOR, format=fmt, out=path)
        kind = "newline_delimited" if fmt == "trajectory" else "array"
        ((count,),) = duckdb.sql(
            f"select count(*) from read_json('{path}', format='{kind}')"
        ).fetchall()
        assert count == 6


async def test_zip_holds_the_data_file_and_a_manifest_of_refused_attachments(
    tmp_path: Path,
) -> None:
    store = LocalStore(tmp_path / "store")
    await build_story(store)
    attachment = tmp_path / "notes.txt"
    attachment.write_bytes(b"hello \xe2\x80\xa8 attachment")
    # Local files and other schemes are never fetched (the fetched path is in
    # test_abuse_attachments.py).
    from tests.exportdata import replay_events
    from tests.records import trace_events

    events = trace_events(9, score=0.99, passed=True, minute=20, attachments=[
        {"name": "notes.txt", "uri": attachment.as_uri(), "content_type": "text/plain",
         "size": 22},
        {"name": "../../evil.txt", "uri": "ftp://x/y", "content_type": "text/plain", "size": 1},
    ])  # fmt: skip
    await replay_events(store, events, "attach")
    path = tmp_path / "out.zip"
    summary = await write_export(store, EVALUATOR, format="zip", out=path,
                                 columns="trace_id,attachments")  # fmt: skip
    assert (summary.attachments, summary.attachment_errors) == (0, 3)
    with zipfile.ZipFile(path) as archive:
        names = archive.namelist()
        assert not any(n.startswith("files/tr-") for n in names)
        assert "files/errors.json" not in names
        rows = {r["trace_id"]: r for r in csv.DictReader(
            io.StringIO(archive.read("data.csv").decode(), newline=""))}  # fmt: skip
        assert json.loads(rows["tr-009"]["attachments"]) == []
        manifest = json.loads(archive.read("files/manifest.json"))
    assert {(e["trace_id"], e["name"], e["status"]) for e in manifest} == {
        ("tr-007", "log.txt", "not_allowed"),
        ("tr-009", "notes.txt", "not_allowed"),
        ("tr-009", "../../evil.txt", "not_allowed"),
    }
    assert all(e["error"] and "path" not in e for e in manifest)
    assert str(tmp_path) not in json.dumps(manifest)
    json_zip = tmp_path / "out-json.zip"
    await write_export(store, EVALUATOR, format="zip", out=json_zip, zip_data="json")
    with zipfile.ZipFile(json_zip) as archive:
        assert len(json.loads(archive.read("data.json"))) == 7


async def test_a_zip_is_the_same_bytes_whenever_it_is_made(
    story: MemoryStore, tmp_path: Path
) -> None:
    """The archive's entries carry a fixed time, not the clock's: an export made later (here
    the clock moved on by an hour) has the same sha256, like every other format's."""
    first = await write_export(story, EVALUATOR, format="zip", out=tmp_path / "a.zip")
    with zipfile.ZipFile(tmp_path / "a.zip") as archive:
        assert {i.date_time for i in archive.infolist()} == {(1980, 1, 1, 0, 0, 0)}
    real = time.time
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(time, "time", lambda: real() + 3600)
        later = await write_export(story, EVALUATOR, format="zip", out=tmp_path / "b.zip")
    assert later.sha256 == first.sha256
    assert (tmp_path / "a.zip").read_bytes() == (tmp_path / "b.zip").read_bytes()


# --- stats, names, errors -------------------------------------------------------------------


async def test_stats_and_histogram(story: MemoryStore) -> None:
    result = await stats(story, EVALUATOR, histogram_bins=10)
    rewards = [0.85, 0.2, 0.7, 0.1, 0.95, 0.3]
    assert result["records"] == 6
    assert result["avg_reward"] == pytest.approx(sum(rewards) / 6)
    assert result["pass_rate"] == pytest.approx(3 / 6)
    assert result["human_labeled"] == 3
    assert result["reward_histogram"] == reward_histogram(rewards, 10)
    assert sum(b["count"] for b in result["reward_histogram"]) == 6
    passed = await stats(story, EVALUATOR, filters=Filters(passed=True))
    assert (passed["records"], passed["pass_rate"]) == (3, 1.0)
    traces = await stats(story, TRACES)
    assert (traces["avg_reward"], traces["pass_rate"]) == (None, None)
    assert reward_histogram([0.0, 1.0, 0.5], 2) == [
        {"lo": 0.0, "hi": 0.5, "count": 1},
        {"lo": 0.5, "hi": 1.0, "count": 2},
    ]


async def collect(store: Any, ref: CorpusRef, **kw: Any) -> list[dict[str, Any]]:
    return [record async for batch in latest_records(store, ref, **kw) for record in batch]


async def test_latest_records_are_the_filtered_view_read_as_far_as_asked(
    story: MemoryStore,
) -> None:
    data, _ = await export(story, TRACES, "trajectory")
    view = check_jsonl(data)
    assert await collect(story, TRACES) == view
    labeled = await collect(story, TRACES, filters=Filters(labeled=True), fields={"skipped_by"})
    assert [r["labels_count"] for r in labeled] == [
        r["labels_count"] for r in view if r["labels_count"]
    ]
    assert all(set(r) <= {"skipped_by", "labels_count", "deleted"} for r in labeled)
    assert len(await collect(story, TRACES, filters=Filters(limit=2), fields=())) == 2
    with pytest.raises(NoDataError):
        await collect(story, CorpusRef(ORG, "other", "traces"))


async def test_bad_requests_raise_before_any_byte(story: MemoryStore) -> None:
    with pytest.raises(ExportError, match="unknown format 'xml'"):
        await export(story, EVALUATOR, "xml")
    with pytest.raises(ExportError, match="source 'nope'"):
        source_ref(ORG, PROJECT, "nope")
    with pytest.raises(ExportError, match="pair-by: only applies"):
        await export(story, EVALUATOR, "messages", pair_by=("scenario",))
    with pytest.raises(ExportError, match="columns: only applies"):
        await export(story, EVALUATOR, "messages", columns="trace_id")
    with pytest.raises(ExportError, match="no record field 'colour'"):
        await export(story, EVALUATOR, "preference", pair_by=("colour",))
    with pytest.raises(NoDataError, match="no data for acme/other/evaluator"):
        await export(story, CorpusRef(ORG, "other", "evaluator"), "trajectory")


async def test_a_failed_export_leaves_no_file(story: MemoryStore, tmp_path: Path) -> None:
    target = tmp_path / "out.jsonl"
    with pytest.raises(NoDataError):
        await write_export(story, CorpusRef(ORG, "other", "human"), format="messages", out=target)
    broken = MemoryStore()
    broken.objects = dict(story.objects)
    shard = next(k for k in broken.objects if k.startswith(f"{EVALUATOR.root}/data/replay-after"))
    broken.objects[shard] = broken.objects[shard][:-5] + b"xx}\n"
    with pytest.raises(Exception, match="sha256"):
        await write_export(broken, EVALUATOR, format="messages", out=target)
    assert not any(tmp_path.iterdir())  # noqa: ASYNC240 - a test's check, nothing to wait for


async def test_iter_export_streams_chunks_and_names(story: MemoryStore) -> None:
    summary = ExportSummary()
    chunks = [c async for c in iter_export(story, EVALUATOR, format="parquet", summary=summary)]
    assert b"".join(chunks)[:4] == b"PAR1"
    assert summary.records == 6
    assert summary.bytes == sum(len(c) for c in chunks)
    assert content_type("messages") == "application/x-ndjson"
    assert content_type("parquet") == "application/vnd.apache.parquet"
    assert file_name(EVALUATOR, "csv") == "acme-bot-evaluator-csv.csv"


async def test_progress_reaches_the_total(story: MemoryStore) -> None:
    seen: list[tuple[int, int | None]] = []
    await export(story, EVALUATOR, "messages", progress=lambda d, t: seen.append((d, t)))
    assert seen[0] == (0, 6)
    assert seen[-1] == (6, 6)


# --- what trainers load ---------------------------------------------------------------------

TRL_COLUMNS = {
    "prompt_completion": {"prompt", "completion"},
    "messages": {"messages"},
    "preference": {"prompt", "chosen", "rejected"},
    "kto": {"prompt", "completion", "label"},
}


async def test_hugging_face_datasets_loads_every_json_lines_format(
    story: MemoryStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "hf"))
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    import datasets

    datasets.disable_progress_bars()
    for fmt in JSONL_FORMATS:
        path = tmp_path / f"{fmt}.jsonl"
        summary = await write_export(story, EVALUATOR, format=fmt, out=path)
        assert summary.records > 0, fmt
        loaded = datasets.load_dataset(
            "json", data_files=str(path), split="train", cache_dir=str(tmp_path / "hf")
        )
        assert len(loaded) == summary.records, fmt
        assert TRL_COLUMNS.get(fmt, set()) <= set(loaded.column_names), fmt
        if fmt in ("messages", "prompt_completion", "kto", "preference"):
            first = loaded[0]
            conversational = first.get("messages") or first["prompt"]
            assert {"role", "content"} <= set(conversational[0]), fmt
        if fmt == "kto":
            assert loaded.features["label"].dtype == "bool"


async def test_preview_gives_the_first_rows_as_dicts(story: MemoryStore) -> None:
    from rl_export.export import preview

    rows = await preview(story, EVALUATOR, format="kto", limit=2)
    assert len(rows) == 2
    assert all(set(r) == {"prompt", "completion", "label"} for r in rows)
    everything, _ = await export(story, EVALUATOR, "kto")
    assert rows == check_jsonl(everything)[:2]
    with pytest.raises(ExportError, match="not a JSON Lines format"):
        await preview(story, EVALUATOR, format="csv")


@pytest.mark.parametrize("run", [1, 2, 200_000])
async def test_preference_in_bounded_memory_is_the_in_memory_pairing(
    run: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    from rl_export.export import pairs
    from rl_export.formats.render import preference_pairs
    from tests.records import conversation, trace_events

    monkeypatch.setattr(pairs, "PREFERENCE_RUN", run)
    store = MemoryStore()
    await build_story(store)
    events: list[dict[str, Any]] = []
    for n in range(10, 30):  # two prompts, many rewards, some equal
        messages = conversation(n)
        if n % 3 == 0:
            messages[1] = {"role": "user", "content": "Another question"}
        events += trace_events(n, score=round((n * 37 % 11) / 10, 1), passed=n % 2 == 0,
                               messages=messages, minute=30 + n)  # fmt: skip
    from tests.exportdata import replay_events

    await replay_events(store, events, "more")
    trajectory, _ = await export(store, EVALUATOR, "trajectory")
    in_memory = list(preference_pairs(check_jsonl(trajectory), max_pairs=2, margin=0.1))
    data, summary = await export(store, EVALUATOR, "preference", max_pairs=2, margin=0.1)
    assert data == b"".join(dumps_line(r) for r in in_memory)
    assert summary.records == len(in_memory) > 5


def test_answers_columns_list_each_labels_answer_to_a_question() -> None:
    """``answers.<question>``: the current labels' answers (a version-0 label answers its four
    ratings), an adjudication left out; the defaults gain one per question of a rubric."""
    from rl_export.export.columns import default_columns, parse_columns, question_columns

    record = {"human_labels": [
        {"labeler": "ana", "rubric": {"correctness": 4, "helpfulness": 3, "efficiency": 5,
                                      "safety": 4}, "comment": None, "occurred_at": "x"},
        {"labeler": "bo", "rubric": {"tone": 1.0}, "comment": None, "occurred_at": "x",
         "rubric_version": 2, "kind": "label", "answers": {"tone": "warm", "notes": "ok"}},
        {"labeler": "rev", "rubric": {"tone": 0.0}, "comment": None, "occurred_at": "x",
         "rubric_version": 2, "kind": "adjudication", "answers": {"tone": "rude"}},
    ]}  # fmt: skip
    tone, safety, notes = parse_columns("answers.tone,answers.safety:s,answers.notes")
    assert tone.value(record) == ["warm"]
    assert (safety.header, safety.value(record)) == ("s", [4])
    assert notes.value(record) == ["ok"]
    assert tone.value({"trace_id": "t"}) is None  # written before human_labels: unknown
    assert question_columns([]) is None
    spec = question_columns(["tone", "notes"])
    assert spec is not None
    assert spec.endswith(",answers.tone,answers.notes")
    assert [c.header for c in parse_columns(spec)] == [
        c.header for c in default_columns(["tone", "notes"])
    ]
