"""The pair book over the query index gives the pairs, voters and ratings input the records
themselves give, and reads again only the traces whose revision moved."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

from rl_export.formats.filters import parse_filters
from rl_export.index.pairbook import PairBook
from rl_export.index.queryindex import CorpusKey, QueryIndex
from rl_export.labeling.pairs import PairTrace, pair_id, pairs_of, prompt_key, voters_of
from rl_export.labeling.ratings import RatingsBuilder, ratings_report
from rl_export.labeling.settings import LabelingSettings
from rl_export.model.codec import dumps_line
from tests.records import record

PROMPTS = [[{"role": "user", "content": f"question {n}"}] for n in range(3)]
OUTCOME = {"a": ("win", "loss"), "b": ("loss", "win"), "tie": ("tie", "tie"),
           "both_bad": ("both_bad", "both_bad")}  # fmt: skip


def records(rng: random.Random, count: int) -> list[dict[str, Any]]:
    out = []
    for n in range(count):
        prompt = rng.choice(PROMPTS)
        value = record(f"t{n:03d}", messages=[*prompt, {"role": "assistant", "content": str(n)}],
                       agent_version=rng.choice(["v1", "v2", "v3"]),
                       scenario=rng.choice(["refund", "trip"]))  # fmt: skip
        value["comparisons"] = []
        value["revision"] = 1
        out.append(value)
    # votes on random pairs of one prompt, mirrored on both records as the join writes them
    for _ in range(count):
        x, y = rng.sample(out, 2)
        a, b = sorted((x, y), key=lambda r: r["trace_id"])
        pid = pair_id(a["trace_id"], b["trace_id"])
        for labeler in rng.sample(["ana", "bo", "cy"], rng.randint(1, 3)):
            if any(e["pair_id"] == pid and e["labeler"] == labeler for e in a["comparisons"]):
                continue
            mine, theirs = OUTCOME[rng.choice(["a", "b", "tie", "both_bad"])]
            for holder, other, outcome in ((a, b, mine), (b, a, theirs)):
                holder["comparisons"].append({
                    "pair_id": pid, "other": other["trace_id"], "outcome": outcome,
                    "labeler": labeler, "strength": None, "occurred_at": "2026-01-02T00:00:00Z",
                })  # fmt: skip
    return out


def test_the_book_gives_what_the_records_give(tmp_path: Path) -> None:
    rng = random.Random(5)
    values = records(rng, 120)
    index = QueryIndex(tmp_path / "index", threads=1)
    try:
        cid = index.corpus_id(CorpusKey("acme", "bot", "traces"))
        index.ingest(cid, b"".join(dumps_line(r) for r in values), {"t-0": 1})
        book = PairBook(index, partners=3)
        for settings in (LabelingSettings(), LabelingSettings(pair_on="scenario",
                                                                pair_versions="any")):  # fmt: skip
            found = book.pairs(cid, settings)
            key = (lambda r: prompt_key(r["messages"])) if settings.pair_on == "prompt" else (
                lambda r: r["scenario"])  # fmt: skip
            traces = [PairTrace(r["trace_id"], key(r), r["agent_version"], None, 0)
                      for r in values]  # fmt: skip
            expected = {p.pair_id for p in pairs_of(traces, settings, 3)}
            assert set(found.pairs) == expected
        voters: dict[str, set[str]] = {}
        for value in values:
            for pid, who in voters_of(value).items():
                voters.setdefault(pid, set()).update(who)
        assert {p: set(w) for p, w in book.voters(cid).items()} == voters
        for filters in (parse_filters({}), parse_filters({"scenario": "trip"})):
            builder = RatingsBuilder()
            for value in values:
                if filters.matches(value):
                    builder.add(value)
            assert ratings_report(book.ratings_input(cid, filters)) == ratings_report(
                builder.build()
            )
        # A new revision of one trace: only it is read again.
        before = book.facts(cid)
        changed = {**values[7], "revision": 2, "comparisons": []}
        index.ingest(cid, dumps_line(changed), {"t-0": 2})
        after = book.facts(cid)
        assert after["t007"].comparisons == ()
        assert all(after[t] is before[t] for t in before if t != "t007")
    finally:
        index.close()
