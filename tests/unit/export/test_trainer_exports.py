"""Exports for trainers (issue 32): turn masks with the count of outcomes outside their
conversation, ``rl_prompts`` as JSON Lines and as the Parquet verl reads, and dataset cards,
from corpora written the real way (replay + compaction + a tail)."""

from __future__ import annotations

import io
import json
import zipfile
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
import yaml

from rl_export.corpora.layout import SCHEMA_VERSION, CorpusRef
from rl_export.corpora.store import MemoryStore
from rl_export.export import check_export, file_for, parse_mask, write_export
from rl_export.formats.chat import Chat
from rl_export.formats.filters import parse_filters
from rl_export.formats.render import trace_index
from rl_export.formats.turns import TurnMask
from rl_export.model.codec import iter_lines
from rl_export.model.errors import ExportError
from tests.exportdata import ORG, PROJECT, build_story, replay_events
from tests.records import trace_events

EVALUATOR = CorpusRef(ORG, PROJECT, "evaluator")
VERL_COLUMNS = ["data_source", "prompt", "ability", "reward_model", "extra_info"]


def failing(turn: int, kind: str = "goal_met") -> dict[str, Any]:
    return {"type": kind, "turn": turn, "decision": False}


@pytest.fixture(scope="module")
async def story() -> MemoryStore:
    """The export story plus three traces whose reports fail turns: turn 2 (their
    conversations have two user turns), turn 1 of another type, and turns 3 and 0 (outside)."""
    store = MemoryStore()
    await build_story(store)
    events = trace_events(20, score=0.4, passed=False, minute=30, outcomes=[failing(2)])
    events += trace_events(
        21,
        score=0.5,
        passed=False,
        minute=31,
        outcomes=[failing(1, "tone"), {**failing(2), "decision": True}],
    )
    events += trace_events(22, score=0.6, passed=False, minute=32,
                           outcomes=[failing(3), failing(0)])  # fmt: skip
    await replay_events(store, events, "masks")
    return store


async def export(store: Any, fmt: str, **kw: Any) -> tuple[list[dict[str, Any]], Any]:
    out = io.BytesIO()
    summary = await write_export(store, EVALUATOR, format=fmt, out=out, **kw)
    return list(iter_lines(out.getvalue())), summary


def by_trace(rows: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    """``messages`` rows by the tool call id their conversation carries (one per trace; the
    story's trace 6 has none)."""
    return {r["messages"][2]["tool_calls"][0]["id"]: r["messages"] for r in rows
            if len(r["messages"]) > 2}  # fmt: skip


def weights(messages: list[dict[str, Any]]) -> list[int | None]:
    return [m.get("weight") for m in messages]


async def test_masked_messages_weigh_the_failed_turns_and_count_the_outside(
    story: MemoryStore,
) -> None:
    plain, _ = await export(story, "messages")
    rows, summary = await export(story, "messages", mask=TurnMask())
    assert len(rows) == len(plain) == summary.records
    got = by_trace(rows)
    #                     sys   u1    call tool a1  u2    a2
    assert weights(got["call_20"]) == [None, None, 1, None, 1, None, 0]
    assert weights(got["call_21"]) == [None, None, 0, None, 0, None, 1]
    assert weights(got["call_22"]) == [None, None, 1, None, 1, None, 1]
    assert summary.turns_outside == 2  # trace 22's turns 3 and 0
    for row in rows:  # OpenAI's rules on every row
        for message in row["messages"]:
            if message["role"] == "assistant":
                assert message["weight"] in (0, 1)
            else:
                assert "weight" not in message
    # Nothing but the weights differs from the unmasked export.
    for masked, original in zip(rows, plain, strict=True):
        stripped = [{k: v for k, v in m.items() if k != "weight"} for m in masked["messages"]]
        assert stripped == original["messages"]
    only_tone, summary = await export(story, "messages", mask=TurnMask(frozenset({"tone"})))
    assert weights(by_trace(only_tone)["call_20"]) == [None, None, 1, None, 1, None, 1]
    assert weights(by_trace(only_tone)["call_21"]) == [None, None, 0, None, 0, None, 1]
    assert summary.turns_outside == 0  # trace 22's outcomes are not of type tone


async def test_masked_prompt_completion_and_the_limit(story: MemoryStore) -> None:
    rows, summary = await export(story, "prompt_completion", mask=TurnMask())
    twenty = next(r for r in rows if r["trace_id"] == "tr-020")
    assert weights(twenty["prompt"]) == [None, None, 1, None, 1, None]
    assert weights(twenty["completion"]) == [0]
    assert summary.turns_outside == 2
    limited, summary = await export(story, "prompt_completion", mask=TurnMask(),
                                    filters=parse_filters({"limit": "1"}))  # fmt: skip
    assert len(limited) == summary.records == 1
    assert summary.turns_outside == (2 if limited[0]["trace_id"] == "tr-022" else 0)


def test_bad_mask_file_and_card_requests_name_their_flag() -> None:
    for fmt in ("kto", "trajectory", "rl_prompts", "csv"):
        with pytest.raises(ExportError, match="mask-failed-turns: only applies to --format"):
            parse_mask(fmt, True)
        with pytest.raises(ExportError, match="mask-failed-turns"):
            check_export(fmt, mask=TurnMask())
    with pytest.raises(ExportError, match="mask-types: only applies with --mask-failed-turns"):
        parse_mask("messages", False, "tone")
    with pytest.raises(ExportError, match=r"mask-types: .* empty outcome type"):
        parse_mask("messages", True, "tone,")
    assert parse_mask("messages", False) is None
    assert parse_mask("messages", True, "a,b") == TurnMask(frozenset({"a", "b"}))
    with pytest.raises(ExportError, match="file: parquet files are for rl_prompts and messages"):
        check_export("kto", file="parquet")
    with pytest.raises(ExportError, match="mask-failed-turns: verl's Parquet messages have no"):
        check_export("messages", file="parquet", mask=TurnMask(None))
    with pytest.raises(ExportError, match="file: 'xml' is not jsonl or parquet"):
        check_export("rl_prompts", file="xml")
    for fmt in ("csv", "json"):
        with pytest.raises(ExportError, match="card: a dataset card goes with"):
            check_export(fmt, card=True)
    assert file_for("rl_prompts", "prompts.parquet") == "parquet"
    assert file_for("rl_prompts", "prompts.jsonl") == "jsonl"
    assert file_for("messages", "rows.parquet") == "parquet"  # verl's multi-turn SFT
    assert file_for("kto", "rows.parquet") == "jsonl"
    assert file_for("rl_prompts", None) == "jsonl"


# --- rl_prompts ------------------------------------------------------------------------------


async def test_rl_prompts_json_lines_rows(story: MemoryStore) -> None:
    rows, summary = await export(story, "rl_prompts", filters=parse_filters({"passed": "false"}))
    assert summary.records == len(rows) > 0
    assert all(list(r) == VERL_COLUMNS for r in rows)
    # extra_info.index: from the trace id, so unique and the same in every file
    assert [r["extra_info"]["index"] for r in rows] == [
        trace_index(r["extra_info"]["trace_id"]) for r in rows
    ]
    assert len({r["extra_info"]["index"] for r in rows}) == len(rows)
    assert all(0 <= r["extra_info"]["index"] < 2**63 for r in rows)
    everything, _ = await export(story, "rl_prompts")  # another file: other places
    places = {r["extra_info"]["trace_id"]: n for n, r in enumerate(everything)}
    assert any(places[r["extra_info"]["trace_id"]] != n for n, r in enumerate(rows))
    index = {r["extra_info"]["trace_id"]: r["extra_info"]["index"] for r in everything}
    assert all(index[r["extra_info"]["trace_id"]] == r["extra_info"]["index"] for r in rows)
    assert all(r["extra_info"]["passed"] is False for r in rows)
    assert all(r["prompt"][-1]["role"] == "user" for r in rows)
    assert all([m["role"] for m in r["prompt"]].count("user") == 1 for r in rows)


async def test_rl_prompts_parquet_loads_with_pyarrow_and_datasets(
    story: MemoryStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    import datasets

    datasets.disable_progress_bars()
    path = tmp_path / "prompts.parquet"
    summary = await write_export(story, EVALUATOR, format="rl_prompts", out=path,
                                 file="parquet")  # fmt: skip
    jsonl, _ = await export(story, "rl_prompts")
    table = pq.read_table(path)
    assert table.column_names == VERL_COLUMNS
    assert table.num_rows == summary.records == len(jsonl)
    rows = table.to_pylist()
    for row, expected in zip(rows, jsonl, strict=True):
        assert row["data_source"] == expected["data_source"]
        assert row["extra_info"] == expected["extra_info"]
        assert row["reward_model"] == {"style": "model", "ground_truth": None}
        assert [m["role"] for m in row["prompt"]] == [m["role"] for m in expected["prompt"]]
    assert rows[0]["prompt"][1]["content"] == jsonl[0]["prompt"][1]["content"]
    loaded = datasets.load_dataset("parquet", data_files=str(path), split="train",
                                   cache_dir=str(tmp_path / "hf"))  # fmt: skip
    assert loaded.column_names == VERL_COLUMNS
    assert len(loaded) == summary.records
    assert loaded[0]["prompt"][0] == {"role": "system", "content": rows[0]["prompt"][0]["content"]}
    assert loaded.features["extra_info"]["index"].dtype == "int64"


async def test_rl_prompts_parquet_content_of_every_shape(tmp_path: Path) -> None:
    store = MemoryStore()
    parts = [{"type": "text", "text": "Book "}, {"type": "text", "text": "a flight"}]
    odd = [{"type": "image_url", "image_url": {"url": "https://x/y.png"}}]
    for n, content in enumerate([parts, odd, None, "plain"], start=1):
        await replay_events(store, trace_events(n, score=0.5, passed=True, minute=n, messages=[
            {"role": "system", "content": None}, {"role": "user", "content": content},
            {"role": "assistant", "content": "ok"}]), f"r{n}")  # fmt: skip
    path = tmp_path / "p.parquet"
    await write_export(store, EVALUATOR, format="rl_prompts", out=path, file="parquet")
    contents = {r["extra_info"]["trace_id"]: r["prompt"][1]["content"]
                for r in pq.read_table(path).to_pylist()}  # fmt: skip
    assert contents == {
        "tr-001": "Book a flight",  # text parts: their texts, as a chat template renders them
        "tr-002": json.dumps(odd, separators=(",", ":")),  # anything else: its JSON
        "tr-003": None,
        "tr-004": "plain",
    }


# --- dataset cards ---------------------------------------------------------------------------


def names(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir())


def header(card: str) -> dict[str, Any]:
    assert card.startswith("---\n")
    found: dict[str, Any] = yaml.safe_load(card.split("---\n")[1])
    return found


async def test_a_card_beside_a_json_lines_export(story: MemoryStore, tmp_path: Path) -> None:
    path = tmp_path / "sft.jsonl"
    summary = await write_export(
        story, EVALUATOR, format="messages", out=path, mask=TurnMask(frozenset({"tone"})),
        filters=parse_filters({"passed": "true", "min-reward": "0.5"}), card=True,
    )  # fmt: skip
    assert names(tmp_path) == ["README.md", "sft.jsonl", "sft.jsonl.manifest.json"]
    card = (tmp_path / "README.md").read_text()
    meta = header(card)
    assert meta["configs"] == [
        {"config_name": "default", "data_files": [{"split": "train", "path": "sft.jsonl"}]}
    ]
    assert meta["dataset_info"] == {"splits": [{"name": "train", "num_examples": summary.records}]}
    ours = meta["rl_export"]
    assert ours["format"] == "messages"
    assert ours["file"] == "jsonl"
    assert ours["records"] == summary.records == len(path.read_bytes().splitlines())
    assert (ours["source"], ours["reward_source"]) == ("evaluator", "evaluator")
    assert ours["filters"] == {"passed": "true", "min-reward": "0.5"}
    assert ours["masks"] == {"mask_failed_turns": True, "mask_types": ["tone"],
                             "turns_outside": summary.turns_outside}  # fmt: skip
    assert ours["chat_style"] == {"style": "hf", "system": "keep"}
    assert ours["counts"] == {"scanned": summary.scanned, "matched": summary.matched,
                              "skipped": summary.skipped}  # fmt: skip
    assert summary.matched < summary.scanned  # the filters left some out: the card says so
    assert f"{summary.matched} of the {summary.scanned} latest records" in card
    assert "- Chat style: `hf`." in card
    assert ours["features"] == [{"name": "messages", "type": "array of object"}]
    assert ours["rules_versions"] == [1]
    assert ours["schema_version"] == SCHEMA_VERSION  # the corpus layout version
    assert ours["row_schema"] == "format.messages.schema.json"
    # the default redaction, secrets, ran: the card says so (never "none applied")
    assert ours["redaction"] == {"kinds": ["secrets"], "replaced": summary.redactions}
    assert "- Redaction: secrets replaced with `[REDACTED:KIND]`" in card
    assert "none applied" not in card
    assert (Path(__file__).parents[3] / "schemas" / ours["row_schema"]).is_file()
    from huggingface_hub import DatasetCard  # how the Hub reads a card

    loaded = DatasetCard.load(tmp_path / "README.md")
    assert loaded.data.to_dict()["configs"] == meta["configs"]
    # The same export gives the same card, byte for byte.
    again = tmp_path / "again"
    again.mkdir()
    await write_export(
        story, EVALUATOR, format="messages", out=again / "sft.jsonl",
        mask=TurnMask(frozenset({"tone"})), card=True,
        filters=parse_filters({"passed": "true", "min-reward": "0.5"}),
    )  # fmt: skip
    assert (again / "README.md").read_text() == card


async def test_a_parquet_cards_features_are_what_datasets_loads(
    story: MemoryStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    import datasets

    datasets.disable_progress_bars()
    for fmt, kw in (("rl_prompts", {"file": "parquet"}), ("parquet", {"columns": "trace_id,"
                    "reward,passed,revision,rubric.safety,messages"})):  # fmt: skip
        folder = tmp_path / fmt
        folder.mkdir()
        path = folder / "data.parquet"
        summary = await write_export(story, EVALUATOR, format=fmt, out=path, card=True, **kw)
        meta = header((folder / "README.md").read_text())
        assert meta["rl_export"]["file"] == "parquet"
        assert meta["rl_export"]["records"] == summary.records
        loaded = datasets.load_dataset("parquet", data_files=str(path), split="train",
                                       cache_dir=str(tmp_path / "hf"))  # fmt: skip
        features = datasets.Features._from_yaml_list(meta["dataset_info"]["features"])
        assert features == loaded.features, fmt
        names = [f["name"] for f in meta["rl_export"]["features"]]
        assert names == loaded.column_names, fmt


async def test_a_zip_export_carries_its_card(story: MemoryStore, tmp_path: Path) -> None:
    path = tmp_path / "out.zip"
    summary = await write_export(story, EVALUATOR, format="zip", out=path,
                                 columns="trace_id,reward:score")  # fmt: skip
    with zipfile.ZipFile(path) as archive:
        assert "README.md" in archive.namelist()
        meta = header(archive.read("README.md").decode())
    assert names(tmp_path) == ["out.zip", "out.zip.manifest.json"]  # no card beside it
    assert meta["configs"][0]["data_files"] == [{"split": "train", "path": "data.csv"}]
    assert meta["rl_export"]["format"] == "zip"
    assert meta["rl_export"]["file"] == "csv"
    assert meta["rl_export"]["records"] == summary.records
    assert meta["rl_export"]["features"] == [
        {"name": "trace_id", "type": "string"},
        {"name": "score", "type": "number"},
    ]


async def test_no_card_for_a_stream(story: MemoryStore) -> None:
    with pytest.raises(ExportError, match="card: a dataset card goes beside a file"):
        await write_export(story, EVALUATOR, format="messages", out=io.BytesIO(), card=True)


async def test_a_card_tells_the_redaction_and_chat_style_asked(
    story: MemoryStore, tmp_path: Path
) -> None:
    summary = await write_export(
        story, EVALUATOR, format="prompt_completion", out=tmp_path / "pc.jsonl", card=True,
        redact="secrets,email", chat=Chat("openai", "merge"),
    )  # fmt: skip
    card = (tmp_path / "README.md").read_text()
    ours = header(card)["rl_export"]
    assert ours["redaction"]["kinds"] == ["secrets", "email"]
    assert ours["redaction"]["replaced"] == summary.redactions
    assert set(summary.redactions) == {"secrets", "email"}
    assert ours["chat_style"] == {"style": "openai", "system": "merge"}
    assert "system messages folded into the first user message" in card
    other = tmp_path / "other"  # a folder of its own: README.md above is pc.jsonl's card
    other.mkdir()
    await write_export(story, EVALUATOR, format="trajectory", out=other / "t.jsonl",
                       card=True, redact="none")  # fmt: skip
    card = (other / "README.md").read_text()
    ours = header(card)["rl_export"]
    assert ours["redaction"] == {"kinds": [], "replaced": {}}
    assert ours["chat_style"] is None
    assert "- Redaction: none (`--redact none`)" in card
