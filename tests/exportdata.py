"""Corpora for the export tests, written the real way: events through ``replay`` (the join and
the sink), then a compaction, then more events (a tail after it).

``STORY`` is a dozen traces: passed and failed, several scenarios, human labels (one
retracted), a deleted trace, unicode with U+2028 in messages and ids, list and null content,
tool calls, attachments.
"""

from __future__ import annotations

from typing import Any

from rl_export.corpora.compaction import compact
from rl_export.corpora.layout import CorpusRef
from rl_export.corpora.replay import replay
from rl_export.corpora.store import MemoryStore, ObjectStore
from rl_export.model.codec import dumps
from rl_export.runtime.settings import load_settings
from tests.records import SYSTEM, trace_events

ORG, PROJECT = "acme", "bot"
GOOD = {"correctness": 5, "helpfulness": 5, "efficiency": 4, "safety": 5}
POOR = {"correctness": 2, "helpfulness": 1, "efficiency": 2, "safety": 3}


def _trace1() -> list[dict[str, Any]]:
    return trace_events(1, score=0.9, passed=True, labels=(GOOD,))


def _trace3() -> list[dict[str, Any]]:
    return trace_events(
        3, score=0.6, passed=True, scenario="travel",
        outcomes=[{"type": "goal_met", "turn": 1, "decision": True, "severity": 3}],
    )  # fmt: skip


def story_before() -> list[dict[str, Any]]:
    """Events replayed before the compaction."""
    events: list[dict[str, Any]] = []
    events += _trace1()
    events += trace_events(2, score=0.2, passed=False, labels=(POOR,))
    events += _trace3()
    events += trace_events(4, score=0.4, passed=False, deleted=True)  # gone
    events += trace_events(5, score=0.7, passed=True, labels=(GOOD, POOR), retract=True)
    events += trace_events(
        6, score=0.1, passed=False, messages=[SYSTEM, {"role": "user", "content": None}]
    )
    return events


def story_after() -> list[dict[str, Any]]:
    """Events replayed after the compaction: new traces, and new revisions of old ones (a
    replay's join starts empty, so the old traces' events come again; the sink drops the
    revisions the compaction holds)."""
    attachment = {"name": "log.txt", "uri": "file:///nonexistent/log.txt",
                  "content_type": "text/plain", "size": 3}  # fmt: skip
    events: list[dict[str, Any]] = []
    events += trace_events(7, score=0.95, passed=True, minute=5, attachments=[attachment])
    events += trace_events(8, score=0.3, passed=False, minute=6, scenario="travel")
    again = trace_events(1, score=0.85, passed=True, minute=7)[1]  # a newer evaluation
    again["event_id"] = "tr-001-e2"
    events += [*_trace1(), again]
    deleted = trace_events(3, score=0.0, passed=False, minute=8, deleted=True)[-1]
    events += [*_trace3(), deleted]
    return events


async def replay_events(store: ObjectStore, events: list[dict[str, Any]], run_id: str) -> None:
    settings = load_settings(partitions=4, shard_max_records=3)
    lines = [(f"events:{n}", dumps(e)) for n, e in enumerate(events, start=1)]
    await replay(settings, store, lines, run_id=run_id)


async def build_story(store: ObjectStore, *, compact_between: bool = True) -> None:
    """The story's corpora: replay, compaction of every source corpus, replay again."""
    await replay_events(store, story_before(), "before")
    if compact_between:
        for source in ("human", "evaluator", "traces"):
            await compact(store, CorpusRef(ORG, PROJECT, source), writer="test")
    await replay_events(store, story_after(), "after")


class FirstCommitLate(MemoryStore):
    """A store whose first listing of commits shows none, as if a corpus's first commit
    landed just after the view looked for its chains."""

    def __init__(self) -> None:
        super().__init__()
        self.looked = False

    async def list(self, prefix: str = "", start_after: str = "") -> list[str]:
        if "/_manifest/" in prefix and not self.looked:
            self.looked = True
            return []
        return await super().list(prefix, start_after)
