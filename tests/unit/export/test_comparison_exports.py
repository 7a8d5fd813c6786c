"""Exports of source ``comparisons`` (DESIGN.md section 12; export/comparisons.py): the pair
corpus written the real way (replay: the join, its mirrors and notices, the sink) from
comparisons in any order, and its ``preference``, ``reward_pairs`` and ``kto`` rows, checked
against a reference computed from the events alone."""

from __future__ import annotations

import io
import random
from typing import Any

import jsonschema
import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rl_export.corpora.compaction import compact
from rl_export.corpora.layout import CorpusRef
from rl_export.corpora.store import MemoryStore
from rl_export.corpora.verify import verify
from rl_export.export import parse_split, preview, write_export
from rl_export.formats.schemas import build_schemas
from rl_export.model.errors import ExportError, NoDataError
from tests.comparisondata import (
    PAIRS,
    TRACES,
    at,
    expected_rows,
    reference,
    trace,
    trace_entries,
    vote,
)
from tests.exportdata import ORG, PROJECT, replay_events
from tests.factories import event

COMPARISONS = CorpusRef(ORG, PROJECT, "comparisons")


async def export(store: MemoryStore, fmt: str, **kw: Any) -> list[dict[str, Any]]:
    """The export's rows; none when no pair record was ever written (no corpus)."""
    out = io.BytesIO()
    try:
        await write_export(store, COMPARISONS, format=fmt, out=out, **kw)
    except NoDataError:
        return []
    return [orjson.loads(line) for line in out.getvalue().splitlines()]


_votes = st.lists(
    st.tuples(st.sampled_from(PAIRS), st.sampled_from(["ana", "bo", "cy"]),
              st.sampled_from(["a", "b", "b", "tie", "both_bad", None]), st.integers(0, 300),
              st.sampled_from([None, 1, 2, 3])),
    min_size=1, max_size=14,
)  # fmt: skip


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(votes=_votes, deletions=st.sets(st.sampled_from(TRACES), max_size=1),
       seed=st.integers(0, 2**32))  # fmt: skip
async def test_the_pair_corpus_and_its_exports_follow_the_votes_in_any_order(
    votes: list[tuple[tuple[str, str], str, str | None, int, int | None]],
    deletions: set[str], seed: int,
) -> None:  # fmt: skip
    events = [trace(t) for t in TRACES]
    events += [vote(n, a, b, who, choice, second, strength)
               for n, ((a, b), who, choice, second, strength) in enumerate(votes)]  # fmt: skip
    events += [event("trace.deleted", f"d-{t}", at(400), trace_id=t) for t in deletions]
    random.Random(seed).shuffle(events)
    store = MemoryStore()
    await replay_events(store, events, "one")

    pairs = reference(events)
    records = {r["pair_id"]: r for r in await export(store, "trajectory")}
    live = {pid: p for pid, p in pairs.items() if p["votes"]}
    assert set(records) == set(live)
    for pid, record in records.items():
        assert (record["trace_a"], record["trace_b"]) == (live[pid]["a"], live[pid]["b"])
        assert {v["labeler"]: (v["choice"], v["strength"]) for v in record["votes"]} == (
            live[pid]["votes"])  # fmt: skip
        choices = [c for c, _ in live[pid]["votes"].values()]
        assert [record[k] for k in ("wins_a", "wins_b", "ties", "both_bad")] == [
            choices.count(c) for c in ("a", "b", "tie", "both_bad")]  # fmt: skip
    out = io.BytesIO()
    await write_export(store, CorpusRef(ORG, PROJECT, "traces"), format="trajectory", out=out)
    traces = [orjson.loads(line) for line in out.getvalue().splitlines()]
    assert {t["trace_id"] for t in traces} == set(TRACES) - deletions
    entries = trace_entries(live)
    for record in traces:  # each trace's record: its current comparisons
        said = [{k: v for k, v in e.items() if k != "occurred_at"}
                for e in record.get("comparisons") or []]  # fmt: skip
        assert said == entries.get(record["trace_id"], []), record["trace_id"]
    wanted = expected_rows(pairs)
    for fmt, rows in wanted.items():
        assert await export(store, fmt) == rows, fmt
    if records:  # compacted, the pair corpus reads the same
        await compact(store, COMPARISONS, writer="test")
        assert {r["pair_id"]: r for r in await export(store, "trajectory")} == records
        assert await export(store, "preference") == wanted["preference"]
    report = await verify(store)  # no (trace_id, revision) twice, chains whole (shards verify)
    assert report.ok, report.problems


async def test_a_pair_never_straddles_splits_and_ties_are_left_out() -> None:
    events = [trace(t) for t in TRACES]
    n = 0
    for a, b in PAIRS:
        events.append(vote(n := n + 1, a, b, "ana", "a", 1, 2))
    events.append(vote(n + 1, "t0", "t1", "bo", "b", 2, None))  # now one each way: a tie
    store = MemoryStore()
    await replay_events(store, events, "one")
    every = await export(store, "kto")
    assert len(every) == 2 * (len(PAIRS) - 1 - 5)  # t0-t1 tied; t5's prompt is another
    parts = []
    for name in ("train", "test"):
        split = parse_split(name, "train=0.5,test=0.5")
        parts.append(await export(store, "kto", split=split))
    # Split by the shared prompt: all of q0's pairs in one split, both rows of each pair.
    assert sorted(map(len, parts)) == [0, len(every)]


async def test_reward_pairs_is_of_source_comparisons_only_and_formats_are_checked() -> None:
    store = MemoryStore()
    await replay_events(store, [trace("t0"), trace("t1"), vote(1, "t0", "t1", "ana", "a", 1, 3)],
                        "one")  # fmt: skip
    with pytest.raises(ExportError, match="--source comparisons"):
        await write_export(store, CorpusRef(ORG, PROJECT, "traces"), format="reward_pairs",
                           out=io.BytesIO())  # fmt: skip
    with pytest.raises(ExportError, match="margin: does not apply to --source comparisons"):
        await write_export(store, COMPARISONS, format="preference", margin=0.2, out=io.BytesIO())
    with pytest.raises(ExportError, match="source comparisons exports"):
        await write_export(store, COMPARISONS, format="messages", out=io.BytesIO())
    schemas = build_schemas()
    for record in await export(store, "trajectory"):
        jsonschema.validate(record, schemas["record.pair"])
    for fmt in ("preference", "reward_pairs", "kto"):
        rows = await export(store, fmt)
        assert rows, fmt
        for row in rows:
            jsonschema.validate(row, schemas[f"format.{fmt}"])
    previewed = await preview(store, COMPARISONS, format="reward_pairs", limit=5)  # GET records
    assert previewed == await export(store, "reward_pairs")
    assert await export(store, "reward_pairs") == [{
        "prompt": [{"role": "user", "content": "q0"}],
        "chosen": [{"role": "assistant", "content": "answer of t0"}],
        "rejected": [{"role": "assistant", "content": "answer of t1"}], "margin": 3.0,
    }]  # fmt: skip
