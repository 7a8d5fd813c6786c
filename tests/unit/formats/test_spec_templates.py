"""A corpus spec with a ``chat_template`` (issue 55): its rows made for the template when the
settings load (probed once), the rows it cannot render not in the corpus, told to the sink
with their reason; a template that cannot be loaded is an error naming RL_EXPORT_CORPORA."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from rl_export.formats.fit import DROPS_CALLS
from rl_export.model.codec import RawJson, dumps
from rl_export.model.errors import ConfigError
from rl_export.model.snapshots import SnapshotLines
from rl_export.runtime.settings import load_settings
from tests.chattemplates import CONVERSATIONS, TEST_DIR, TOOLS


def snapshot(messages: list[dict[str, Any]], tools: Any = None) -> dict[str, Any]:
    """A join snapshot ready for the evaluator corpus (the sink's input)."""
    return {
        "trace_id": "t-1", "org": "acme", "project": "bot", "revision": 2, "deleted": False,
        "human": None, "evaluator": {"reward": 0.9, "passed": True}, "rubric": None,
        "labels_count": 0, "labelers": [], "skipped_by": [], "human_labels": [],
        "evaluator_scores": {"judge": 0.9}, "evaluation": None,
        "messages": RawJson(dumps(messages)), "agent_version": "v1", "scenario": "s",
        "attachments": [], "completed_at": "2026-01-01T00:00:00Z",
        "updated_at": "2026-01-01T00:00:05Z", "pass_threshold": 0.7, "rules_version": 1,
        "metadata": {"tools": tools} if tools else {},
    }  # fmt: skip


def spec(**kw: object) -> list[dict[str, object]]:
    return [{"name": "sft", "source": "evaluator", "format": "messages", **kw}]


def test_a_corpus_makes_its_rows_for_its_template() -> None:
    settings = load_settings(corpora=spec(chat_template="mistral_v03_tools"))
    (made,) = [s for s in settings.corpora if s.name == "sft"]
    assert made.fit is not None
    called = snapshot(CONVERSATIONS["openai_call"], tools=TOOLS)
    row = made.record_for(called)
    assert row is not None
    assert row["trace_id"] == "t-1"
    assert orjson.loads(row["tools"]) == TOOLS
    (call,) = [c for m in row["messages"] for c in m.get("tool_calls", [])]
    assert len(call["id"]) == 9


def test_a_row_the_template_cannot_render_is_not_in_the_corpus() -> None:
    settings = load_settings(corpora=spec(chat_template=str(TEST_DIR / "granite_3_3.jinja")))
    (made,) = [s for s in settings.corpora if s.name == "sft"]
    told: list[str] = []
    lines = SnapshotLines(snapshot(CONVERSATIONS["openai_call"]))
    assert made.held_line(lines, told.append) is None
    assert told == [DROPS_CALLS]
    assert made.held_line(SnapshotLines(snapshot(CONVERSATIONS["plain"])), told.append)


def test_a_template_that_cannot_be_loaded_names_the_setting() -> None:
    with pytest.raises(
        ConfigError, match=r"RL_EXPORT_CORPORA: .*corpus sft: chat-template: no chat"
    ):
        load_settings(corpora=spec(chat_template="nope"))
    with pytest.raises(ConfigError, match=r"RL_EXPORT_CORPORA.*chat_template applies to"):
        load_settings(corpora=spec(format="trajectory", chat_template="chatml"))
