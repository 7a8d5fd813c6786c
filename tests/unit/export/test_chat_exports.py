"""Chat styles, preference completions and the empty export's reason (issue 42), through
the export's own checks and the export of corpora written the real way."""

from __future__ import annotations

import io
from typing import Any

import pytest

from rl_export.corpora.layout import CorpusRef
from rl_export.corpora.store import MemoryStore
from rl_export.export import (
    ExportSummary,
    check_export,
    parse_chat_style,
    parse_completion,
    write_export,
)
from rl_export.formats.chat import HF, Chat
from rl_export.formats.filters import parse_filters
from rl_export.model.codec import iter_lines
from rl_export.model.errors import ExportError
from tests.exportdata import ORG, PROJECT, build_story

EVALUATOR = CorpusRef(ORG, PROJECT, "evaluator")


@pytest.fixture(scope="module")
async def story() -> MemoryStore:
    store = MemoryStore()
    await build_story(store)
    return store


async def export(store: Any, fmt: str, **kw: Any) -> tuple[list[dict[str, Any]], ExportSummary]:
    out = io.BytesIO()
    summary = await write_export(store, EVALUATOR, format=fmt, out=out, **kw)
    return list(iter_lines(out.getvalue())), summary


def test_chat_style_and_completion_flags_are_checked() -> None:
    assert parse_chat_style("messages", None, None) == HF
    assert parse_chat_style("kto", "openai", "merge") == Chat("openai", "merge")
    assert parse_chat_style("trajectory", None, None) == HF  # the default fits every format
    with pytest.raises(ExportError, match=r"chat-style: unknown chat style 'chatml'"):
        parse_chat_style("messages", "chatml")
    with pytest.raises(ExportError, match=r"system: unknown system mode 'drop'"):
        parse_chat_style("messages", "hf", "drop")
    with pytest.raises(ExportError, match="chat-style: only applies to --format messages"):
        parse_chat_style("executions", "raw")
    with pytest.raises(ExportError, match="system: only applies to --format messages"):
        parse_chat_style("csv", None, "merge")
    with pytest.raises(ExportError, match="chat-style: only applies"):
        check_export("trajectory", chat=Chat("raw"))
    assert parse_completion("preference", None) == "turn"
    assert parse_completion("preference", "rest") == "rest"
    with pytest.raises(ExportError, match="completion: 'all' is not turn or rest"):
        parse_completion("preference", "all")
    with pytest.raises(ExportError, match="completion: only applies to --format preference"):
        parse_completion("messages", "rest")


@pytest.mark.parametrize("fmt", ["messages", "prompt_completion", "kto", "preference"])
async def test_every_chat_format_exports_hf_by_default(story: MemoryStore, fmt: str) -> None:
    rows, summary = await export(story, fmt)
    assert rows, summary.why_empty()
    for row in rows:
        for key in ("messages", "prompt", "completion", "chosen", "rejected"):
            for message in row.get(key, []):
                assert isinstance(message["content"], str)
                for call in message.get("tool_calls", []):
                    assert not isinstance(call["function"]["arguments"], str)


async def test_openai_and_raw_styles(story: MemoryStore) -> None:
    raw, _ = await export(story, "messages", chat=Chat("raw"))
    openai, _ = await export(story, "messages", chat=Chat("openai"))
    hf, _ = await export(story, "messages")
    assert any(m["content"] is None for row in raw for m in row["messages"])
    calls = [c for row in openai for m in row["messages"] for c in m.get("tool_calls") or []]
    assert calls
    assert all(isinstance(c["function"]["arguments"], str) for c in calls)
    assert len(raw) == len(openai) == len(hf)


async def test_an_export_without_rows_says_why(story: MemoryStore) -> None:
    rows, summary = await export(
        story, "preference", filters=parse_filters({"scenario": "no-such-scenario"})
    )
    assert rows == []
    assert summary.why_empty() == (
        f"none of the {summary.scanned} latest records matches the filters"
    )
    rows, summary = await export(story, "preference", pair_by=("trace_id",))
    assert rows == []
    why = summary.why_empty()
    assert why is not None
    assert why.startswith("no two of the")
    assert "share a prompt" in why
    assert "--pair-by" in why
    rows, summary = await export(story, "preference")
    assert rows
    assert summary.why_empty() is None
