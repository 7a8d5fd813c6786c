"""Synthetic traffic: valid events, reproducible by seed, in the shapes the bench measures."""

from __future__ import annotations

from collections import Counter

import orjson
import pytest

from rl_export.local.synthetic import SHAPES, generate
from rl_export.model.events import EVENT_ADAPTER


@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_every_event_is_valid_and_the_seed_decides_everything(shape: str) -> None:
    events = generate(300, seed=4, shape=SHAPES[shape])
    for event in events:
        EVENT_ADAPTER.validate_json(orjson.dumps(event))
    assert generate(300, seed=4, shape=SHAPES[shape]) == events
    assert generate(300, seed=5, shape=SHAPES[shape]) != events


def test_the_small_shape_is_small_label_heavy_and_spread_over_three_projects() -> None:
    standard = generate(2000, seed=1, shape=SHAPES["standard"])
    small = generate(2000, seed=1, shape=SHAPES["small"])

    def avg_bytes(events: list[dict[str, object]]) -> float:
        return sum(len(orjson.dumps(e)) for e in events) / len(events)

    def labels_per_trace(events: list[dict[str, object]]) -> float:
        kinds = Counter(str(e["event_type"]) for e in events)
        return sum(v for k, v in kinds.items() if k.startswith("label.")) / kinds["trace.completed"]

    assert 1200 < avg_bytes(standard) < 1450  # 1.3 KiB
    assert 650 < avg_bytes(small) < 800  # 0.7 KiB
    assert labels_per_trace(small) > 2 * labels_per_trace(standard)
    assert len({(e["org"], e["project"]) for e in small}) == 3
    assert len({(e["org"], e["project"]) for e in standard}) == 1


def _first_prompts(events: list[dict[str, object]]) -> Counter[str]:
    """How many traces share each first user message (duplicate events counted once)."""
    first: dict[object, str] = {}
    for e in events:
        if e["event_type"] == "trace.completed":
            messages = e["messages"]
            assert isinstance(messages, list)
            first[e["trace_id"]] = next(m["content"] for m in messages if m["role"] == "user")
    return Counter(first.values())


async def test_the_dev_shape_runs_each_prompt_several_times_so_preference_pairs() -> None:
    from rl_export.corpora.layout import CorpusRef
    from rl_export.corpora.store import MemoryStore
    from rl_export.export import ExportSummary, iter_export
    from tests.exportdata import replay_events

    standard = _first_prompts(generate(300, seed=3, shape=SHAPES["standard"]))
    assert len(standard) > 290  # the bench's shapes: (almost) every prompt its own
    events = generate(300, seed=3, shape=SHAPES["dev"])
    shared = _first_prompts(events)
    assert len(shared) <= 5 * SHAPES["dev"].prompts  # a few prompts per scenario
    store = MemoryStore()
    await replay_events(store, [e for e in events if e["org"] == "acme"], "dev")
    summary = ExportSummary()
    ref = CorpusRef("acme", "support-bot", "evaluator")
    data = b"".join([c async for c in iter_export(store, ref, format="preference",
                                                  summary=summary)])  # fmt: skip
    assert summary.records >= 20, summary.why_empty()
    assert data.count(b"\n") == summary.records
