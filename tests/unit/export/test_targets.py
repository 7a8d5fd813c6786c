"""No file is written over that the export did not make (DESIGN.md section 10): an export to a
path refuses its output, its manifest and its card when they exist and are not its own,
told by their content; the same export again over its own files works, and a refused one
changes nothing."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rl_export.corpora.layout import CorpusRef
from rl_export.corpora.store import MemoryStore
from rl_export.export import write_export
from rl_export.export.card import card_describes
from rl_export.model.errors import ExportError
from tests.exportdata import ORG, PROJECT, build_story

EVALUATOR = CorpusRef(ORG, PROJECT, "evaluator")
FORMATS = ["trajectory", "messages", "csv", "json", "parquet", "zip"]


@pytest.fixture(scope="module")
async def story() -> MemoryStore:
    store = MemoryStore()
    await build_story(store)
    return store


def snapshot(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())}


def name_for(fmt: str) -> str:
    return {"csv": "out.csv", "json": "out.json", "parquet": "out.parquet",
            "zip": "out.zip"}.get(fmt, "out.jsonl")  # fmt: skip


@pytest.mark.parametrize("fmt", FORMATS)
async def test_the_same_export_again_writes_over_its_own_files(
    story: MemoryStore, tmp_path: Path, fmt: str
) -> None:
    out = tmp_path / name_for(fmt)
    card = fmt in ("trajectory", "messages", "parquet")  # a card beside the file
    first = await write_export(story, EVALUATOR, format=fmt, out=out, card=card)
    again = await write_export(story, EVALUATOR, format=fmt, out=out, card=card)
    assert again.sha256 == first.sha256 == hashlib.sha256(out.read_bytes()).hexdigest()
    # Without the card the next time, and with it again: the files are still its own.
    await write_export(story, EVALUATOR, format=fmt, out=out)
    await write_export(story, EVALUATOR, format=fmt, out=out, card=card)
    names = sorted(snapshot(tmp_path))
    assert names == sorted([out.name, out.name + ".manifest.json", *(["README.md"] * card)])


@pytest.mark.parametrize(
    ("name", "content"),
    [
        ("README.md", b"# My project\n\nHand-written, precious.\n"),
        ("out.jsonl", b'{"mine": true}\n'),
        ("out.jsonl.manifest.json", b'{"not": "a manifest"}\n'),
    ],
)
async def test_a_file_that_is_not_the_exports_own_is_refused_and_left_as_it_was(
    story: MemoryStore, tmp_path: Path, name: str, content: bytes
) -> None:
    (tmp_path / name).write_bytes(content)
    before = snapshot(tmp_path)
    with pytest.raises(ExportError) as refused:
        await write_export(story, EVALUATOR, format="messages", out=tmp_path / "out.jsonl",
                           card=True)  # fmt: skip
    assert refused.value.setting == "output"
    assert str(tmp_path / name) in refused.value.detail
    assert "\n" not in str(refused.value)
    assert snapshot(tmp_path) == before  # nothing written, nothing left behind


async def test_another_exports_card_and_an_edited_output_are_not_this_exports(
    story: MemoryStore, tmp_path: Path
) -> None:
    await write_export(story, EVALUATOR, format="messages", out=tmp_path / "train.jsonl",
                       card=True)  # fmt: skip
    # A second export beside it, with a card: README.md is train.jsonl's card.
    with pytest.raises(ExportError, match=r"is not the dataset card of an export to eval\.jsonl"):
        await write_export(story, EVALUATOR, format="messages", out=tmp_path / "eval.jsonl",
                           card=True)  # fmt: skip
    assert card_describes((tmp_path / "README.md").read_text()) == "train.jsonl"
    await write_export(story, EVALUATOR, format="messages", out=tmp_path / "eval.jsonl")
    # A user edits the export: its manifest no longer describes it.
    with (tmp_path / "train.jsonl").open("ab") as fh:
        fh.write(b'{"messages": []}\n')
    before = snapshot(tmp_path)
    with pytest.raises(ExportError, match=r"train\.jsonl exists and was not written by an export"):
        await write_export(story, EVALUATOR, format="messages", out=tmp_path / "train.jsonl")
    assert snapshot(tmp_path) == before
    # The manifest of another output, renamed to this one's: not this export's either.
    (tmp_path / "eval.jsonl.manifest.json").rename(tmp_path / "x.jsonl.manifest.json")
    with pytest.raises(ExportError, match=r"is not the manifest of an export to x\.jsonl"):
        await write_export(story, EVALUATOR, format="messages", out=tmp_path / "x.jsonl")


@given(text=st.text(max_size=300))
@settings(max_examples=200, suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_no_text_but_a_card_of_ours_names_a_file(text: str) -> None:
    """Whatever a user's README.md holds (front matter of its own included), it is not one
    of our cards unless it has ours."""
    for candidate in (text, f"---\n{text}\n---\n", f"---\nconfigs: {text}\n---\n"):
        assert card_describes(candidate) is None or "rl_export" in candidate
