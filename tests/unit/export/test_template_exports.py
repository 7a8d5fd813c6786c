"""Exports made for a chat template (issue 55, DESIGN.md section 4 "Chat template"), on a
corpus written the real way: agent conversations with tool calls, some traces with tools in
their metadata. Every row written renders with the template, as the trainer reads it, with
every message's text; rows left out are counted by reason; the process pool writes the same
bytes; verl's Parquet renders as verl renders it; --on-unrenderable fail stops the export."""

from __future__ import annotations

import io
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pyarrow.parquet as pq
import pytest

from rl_export.corpora.layout import CorpusRef
from rl_export.corpora.store import MemoryStore
from rl_export.export import ExportSummary, check_export, templated, write_export
from rl_export.export.dedup import parse_dedup
from rl_export.export.requests import parse_on_unrenderable
from rl_export.export.slots import Slots
from rl_export.export.splits import parse_split
from rl_export.export.templated import TemplateChoice
from rl_export.formats.adapt import Reading
from rl_export.formats.chat import Chat
from rl_export.formats.filters import Filters
from rl_export.formats.fit import DROPS_CALLS, TemplateFit, missing
from rl_export.formats.masks import mark
from rl_export.formats.render import CHAT_FORMATS
from rl_export.formats.templates import load_template
from rl_export.formats.turns import TurnMask
from rl_export.model.codec import iter_lines
from rl_export.model.errors import ExportError
from tests.chattemplates import CONVERSATIONS, TEMPLATES, TOOLS, template_paths
from tests.exportdata import ORG, PROJECT, replay_events
from tests.records import trace_events

EVALUATOR = CorpusRef(ORG, PROJECT, "evaluator")


def events() -> list[dict[str, Any]]:
    """Each conversation twice with the same prompt (another last reply, a lower score),
    with and without tools in the trace's metadata."""
    out: list[dict[str, Any]] = []
    n = 0
    for tools in (False, True):
        for messages in CONVERSATIONS.values():
            for k, score in enumerate((0.9, 0.3)):
                shaped = [dict(m) for m in messages]
                if k:
                    shaped[-1] = {"role": "assistant", "content": f"Another reply {n}."}
                out += trace_events(n, score=score, passed=score > 0.5, minute=n,
                                    messages=shaped,
                                    metadata={"tools": TOOLS} if tools else None)  # fmt: skip
                n += 1
    return out


@pytest.fixture(scope="module")
async def store() -> MemoryStore:
    made = MemoryStore()
    await replay_events(made, events(), "templates")
    return made


def choice(name: str, **kw: Any) -> TemplateChoice:
    return TemplateChoice(load_template(str(template_paths()[name])), **kw)


def chosen(name: str, **kw: Any) -> TemplateChoice:
    """A template of the tests by name, or a file."""
    return (
        choice(name, **kw)
        if name in template_paths()
        else TemplateChoice(load_template(name), **kw)
    )


async def export(store: Any, fmt: str, **kw: Any) -> tuple[bytes, ExportSummary]:
    out = io.BytesIO()
    summary = await write_export(store, EVALUATOR, format=fmt, out=out, **kw)
    return out.getvalue(), summary


def conversations(fmt: str, row: dict[str, Any]) -> Iterator[tuple[list[Any], list[Any]]]:
    if fmt == "messages":
        yield row["messages"], []
    elif fmt == "preference":
        yield row["prompt"], row["chosen"]
        yield row["prompt"], row["rejected"]
    else:
        yield row["prompt"], row["completion"]


@pytest.mark.parametrize("name", ["mistral_v03_tools", "qwq_32b", "olmo3_tools", "granite_3_3",
                                  "phi4_mini_tools", "hermes_3_tool_use"])  # fmt: skip
@pytest.mark.parametrize("fmt", CHAT_FORMATS)
async def test_every_row_written_renders_with_every_text(
    store: MemoryStore, name: str, fmt: str
) -> None:
    chosen = choice(name)
    data, summary = await export(store, fmt, template=chosen)
    rows = list(iter_lines(data))
    template = chosen.loaded.template
    for row in rows:
        tools = orjson.loads(row["tools"]) if "tools" in row else None
        for prompt, reply in conversations(fmt, row):
            rendered = template.render([*prompt, *reply], tools)
            assert missing([*prompt, *reply], rendered) is None
    left = sum(summary.unrenderable.values())
    matched_rows = summary.records + left
    assert matched_rows > 0
    assert summary.records == len(rows)
    assert summary.template is not None
    assert summary.template["sha256"] == template.sha256
    if name == "granite_3_3":  # it never shows tool calls: every row with one is left out
        assert set(summary.unrenderable) == {DROPS_CALLS}
    if name == "hermes_3_tool_use":  # it needs a tools list: the traces with tools render
        assert rows
        assert all("tools" in row for row in rows)


async def test_the_process_pool_writes_the_same_bytes(store: MemoryStore) -> None:
    inline, counted = await export(store, "messages", template=choice("mistral_v03_tools"))
    pooled, again = await export(store, "messages",
                                 template=choice("mistral_v03_tools", processes=2))  # fmt: skip
    assert pooled == inline
    assert again.unrenderable == counted.unrenderable
    assert again.records == counted.records > 0


POOLED_CASES: dict[str, dict[str, Any]] = {
    "plain": {},
    "filtered": {"filters": Filters(passed=True)},
    "limited": {"filters": Filters(limit=5)},
    "redacted": {"redact": "all"},
    "masked": {"mask": TurnMask()},
    "split": {"split": parse_split("train", "train=0.5,eval=0.5")},
    "dedup": {"dedup": parse_dedup("exact", on="prompt")},
}


POOLED = [("llama3_1_json_tools", case) for case in POOLED_CASES] + [
    (name, "plain") for name in ("hermes_3_tool_use", "qwq_32b", "granite_3_3", "marked")
] + [("marked", "masked")]  # fmt: skip


@pytest.mark.parametrize(("name", "case"), POOLED)
async def test_rows_made_in_the_pool_from_lines_are_the_same_bytes(
    store: MemoryStore, name: str, case: str, tmp_path: Path
) -> None:
    """The pool's processes make the rows from the corpus's lines (read whole when nothing
    is left out, else the lines of the records that passed): the same bytes and counts as
    rows made here, with filters, a limit, redaction, masks, a split, a dedup; with
    templates that show tool calls, need tools, have {% generation %} blocks or leave rows
    out."""
    kw = POOLED_CASES[case]
    if name == "marked":  # ChatML with {% generation %} blocks (rl-export template mark)
        path = tmp_path / "chatml_marked.jinja"
        path.write_text(mark(load_template("chatml").template).text)
        name = str(path)
    inline, counted = await export(store, "messages", template=chosen(name), **kw)
    pooled, again = await export(store, "messages", template=chosen(name, processes=2), **kw)
    assert pooled == inline
    both = again.as_dict(), counted.as_dict()
    if case == "limited":  # how far the view was read before the limit: as far as a chunk
        for summary in both:
            del summary["scanned"], summary["matched"]
    assert both[0] == both[1]


async def test_on_unrenderable_fail_in_the_pool_names_the_first_row(store: MemoryStore) -> None:
    refusing = choice("granite_3_3", on_unrenderable="fail", processes=2)
    with pytest.raises(ExportError, match=r"on-unrenderable: a messages row \(trace tr-\d+\) "
                       "cannot be rendered with chat template .*granite_3_3.*: drops tool "
                       "calls"):  # fmt: skip
        await export(store, "messages", template=refusing)


async def test_verl_parquet_renders_as_verl_reads_it(store: MemoryStore, tmp_path: Path) -> None:
    """Every key of a message present (null where it had none), arguments as JSON text: the
    rows kept render that way, and one at a time as verl renders them (ChatML's: it shows no
    tool call, so the rows with calls are left out, said so). Qwen 2.5's template renders a
    message alone with the empty reasoning it gives the generation prompt: verl would cut
    the first tokens of every reply, and every row is left out."""
    out = tmp_path / "sft.parquet"
    _, qwen_summary = await export(store, "messages", template=choice("qwq_32b"), file="parquet")
    chosen = choice("chatml")
    summary = await write_export(store, EVALUATOR, format="messages", out=out, file="parquet",
                                 template=chosen)  # fmt: skip
    table = pq.read_table(out).to_pylist()
    assert len(table) == summary.records > 0
    fit = TemplateFit.probed(chosen.loaded.template, Reading("verl_parquet"))
    for row in table:
        assert set(row) == {"messages", "tools"}
        for message in row["messages"]:
            assert set(message) == {"role", "content", "tool_calls", "tool_call_id", "name"}
            for call in message["tool_calls"] or []:
                assert isinstance(call["function"]["arguments"], str)
        rendered = chosen.loaded.template.render(row["messages"], row["tools"])
        assert missing(row["messages"], rendered) is None
        assert fit._verl(row["messages"], row["tools"], rendered) is None
    assert summary.unrenderable == {"drops tool calls": 16}  # the rows with tool calls
    assert qwen_summary.records == 0
    left = {"garbles arguments", "renders differently one message at a time"}
    assert set(qwen_summary.unrenderable) == left
    plain = tmp_path / "plain.parquet"
    await write_export(store, EVALUATOR, format="messages", out=plain, file="parquet")
    assert pq.read_table(plain).num_rows > 0  # without a template too


async def test_on_unrenderable_fail_stops_at_the_first_row(store: MemoryStore) -> None:
    with pytest.raises(ExportError, match=r"on-unrenderable: a messages row \(trace tr-\d+\) "
                       "cannot be rendered with chat template .*granite_3_3.*: drops tool "
                       "calls"):  # fmt: skip
        await export(store, "messages", template=choice("granite_3_3", on_unrenderable="fail"))


def test_template_options_are_checked() -> None:
    with pytest.raises(ExportError, match="chat-template: only applies to --format messages"):
        check_export("trajectory", template=True)
    with pytest.raises(ExportError, match=r"chat-template: makes the messages .* --chat-style"):
        check_export("messages", chat=Chat("openai"), template=True)
    with pytest.raises(ExportError, match="on-unrenderable: only applies with --chat-template"):
        parse_on_unrenderable("fail", False)
    with pytest.raises(ExportError, match="on-unrenderable: 'stop' is not skip or fail"):
        parse_on_unrenderable("stop", True)
    with pytest.raises(ExportError, match="chat-template: no chat template 'nope'"):
        load_template("nope")
    with pytest.raises(ExportError, match=r"chat-template: .*is not a template name"):
        load_template("../etc/passwd", files=False)
    assert len(TEMPLATES) == 23


class CountedSlots(Slots):
    """Slots that count the chunks whose rows came back in them (``taken``) and those whose
    rows came through the pipe (``freed``)."""

    def __init__(self, count: int, size: int) -> None:
        super().__init__(count, size)
        self.taken = self.freed = 0

    def take(self, slot: int, size: int) -> bytes:
        self.taken += 1
        return super().take(slot, size)

    def free(self, slot: int) -> None:
        self.freed += 1
        super().free(slot)


@pytest.mark.parametrize("room", ["none", "small", "ample"])
async def test_rows_made_in_the_pool_without_room_in_the_slots_are_the_same_bytes(
    store: MemoryStore, room: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Chunks and rows go through shared slots where they fit, else through the pool's
    pipes: with no shared memory (``none``), with rooms no chunk fits (``small``) and where
    all do (``ample``), the export is the same bytes and counts (rows that do not fit:
    ``test_templated_pool``)."""
    inline, counted = await export(store, "messages", template=choice("llama3_1_json_tools"))
    monkeypatch.setattr(templated, "CHUNK_BYTES", 3000)
    rooms = {"small": 100, "ample": 1 << 20}
    made: list[CountedSlots] = []

    def slots(count: int) -> Slots | None:
        if room == "none":
            return None
        made.append(CountedSlots(count, rooms[room]))
        return made[-1]

    monkeypatch.setattr(templated, "make_slots", slots)
    pooled, again = await export(store, "messages",
                                 template=choice("llama3_1_json_tools", processes=2))  # fmt: skip
    assert pooled == inline
    assert again.as_dict() == counted.as_dict()
    ways = {(s.taken > 0, s.freed > 0) for s in made}
    assert ways == {"none": set(), "small": {(False, False)}, "ample": {(True, False)}}[room]
