"""The pair book over the query index gives the pairs, voters and ratings input the records
themselves give, and reads again only the traces whose revision moved."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

from rl_export.formats.filters import parse_filters
from rl_export.index.pairbook import PairBook
from rl_export.index.queryindex import CorpusKey, QueryIndex
from rl_export.labeling.pairs import PairTrace, pairs_of, prompt_key, voters_of
from rl_export.labeling.ratings import RatingsBuilder, ratings_report
from rl_export.labeling.settings import LabelingSettings
from rl_export.model.codec import dumps_line
from rl_export.model.pairs import pair_id
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
            # The orders list the pairs short of their target, the only ones a queue holds.
            k = settings.comparisons_per_pair
            open_ = {p for p in found.pairs if len(found.voters.get(p, ())) < k}
            for order in ("oldest", "newest", "uncertain", "random"):
                listed = found.in_order(order, "ana")  # type: ignore[arg-type]
                assert [p.pair_id for p in listed if p.pair_id in open_] == [
                    p.pair_id for p in listed]  # fmt: skip
                assert {p.pair_id for p in listed} == open_
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


def _same(found: Any, expected: Any) -> None:
    assert found.pairs == expected.pairs
    assert found.voters == expected.voters
    assert found.ordered == expected.ordered
    assert found.short == expected.short
    assert {k: v for k, v in found.voted_short.items() if v} == {
        k: v for k, v in expected.voted_short.items() if v}  # fmt: skip


def test_kept_up_to_date_it_is_what_a_fresh_book_builds(tmp_path: Path) -> None:
    """After each round of random changes (new traces, new revisions with other votes, other
    prompts or versions, deletions), the book that followed them gives the same pairs,
    voters, orders and counts as a new book reading the index from scratch."""
    rng = random.Random(11)
    values = {r["trace_id"]: r for r in records(rng, 60)}
    index = QueryIndex(tmp_path / "index", threads=1)
    settings = [LabelingSettings(comparisons_per_pair=2),
                LabelingSettings(pair_on="scenario", pair_versions="any")]  # fmt: skip
    try:
        cid = index.corpus_id(CorpusKey("acme", "bot", "traces"))
        index.ingest(cid, b"".join(dumps_line(r) for r in values.values()), {"t-0": 1})
        book = PairBook(index, partners=2)
        for each in settings:
            book.pairs(cid, each)
        for round_ in range(25):
            lines = []
            for _ in range(rng.randint(1, 6)):
                trace = rng.choice(sorted(values))
                value = values[trace]
                what = rng.random()
                if what < 0.15:
                    lines.append(dumps_line({"trace_id": trace, "revision": value["revision"] + 1,
                                             "deleted": True}))  # fmt: skip
                    del values[trace]
                    continue
                changed = {**value, "revision": value["revision"] + 1}
                if what < 0.5:  # a vote on a pair offered (or on any pair now and then)
                    now = PairBook(index, partners=2).pairs(cid, settings[0])
                    offered = sorted(now.pairs.values(), key=lambda p: p.pair_id)
                    if offered and rng.random() < 0.8:
                        pair = rng.choice(offered)
                        trace, other = pair.trace_a, pair.trace_b
                    else:
                        other = rng.choice(sorted(values))
                    if trace not in values or other not in values:
                        continue  # deleted in this round
                    value = values[trace]
                    changed = {**value, "revision": value["revision"] + 1}
                    if trace < other:
                        vote = {
                            "pair_id": pair_id(trace, other),
                            "other": other,
                            "outcome": "win",
                            "labeler": rng.choice(["ana", "bo", "dee"]),
                        }
                        changed["comparisons"] = [*value["comparisons"], vote]
                elif what < 0.7:
                    changed["comparisons"] = []
                elif what < 0.85:
                    changed["messages"] = [rng.choice(PROMPTS)[0]]
                    changed["agent_version"] = rng.choice(["v1", "v2"])
                else:
                    changed["scenario"] = rng.choice(["refund", "trip", "other"])
                values[trace] = changed
                lines.append(dumps_line(changed))
            if rng.random() < 0.3:  # a new trace
                fresh = records(random.Random(round_), 2)[0]
                fresh["trace_id"] = f"n{round_:03d}"
                fresh["comparisons"] = []  # its votes named other ids
                values[fresh["trace_id"]] = fresh
                lines.append(dumps_line(fresh))
            cut = rng.randint(0, len(lines))  # one change of the index, or two before a look
            for n, part in enumerate((lines[:cut], lines[cut:])):
                if part:
                    index.ingest(cid, b"".join(part), {"t-0": 100 * round_ + n})
            for each in settings:
                _same(book.pairs(cid, each), PairBook(index, partners=2).pairs(cid, each))
            assert book.voters(cid) == PairBook(index, partners=2).voters(cid)
    finally:
        index.close()


def test_two_changes_of_one_pairs_votes_between_two_looks(tmp_path: Path) -> None:
    """The book counts a pair's comparisons from what it counted last, whatever happened in
    between: two votes on one pair in two changes of the index, then one look."""
    a = record("a", messages=[*PROMPTS[0], {"role": "assistant", "content": "1"}],
               agent_version="v1")  # fmt: skip
    b = record("b", messages=[*PROMPTS[0], {"role": "assistant", "content": "2"}],
               agent_version="v2")  # fmt: skip
    index = QueryIndex(tmp_path / "index", threads=1)
    two = LabelingSettings(comparisons_per_pair=2)
    try:
        cid = index.corpus_id(CorpusKey("acme", "bot", "traces"))
        index.ingest(cid, dumps_line({**a, "comparisons": []}) + dumps_line(b), {"t-0": 1})
        book = PairBook(index, partners=2)
        assert (book.pairs(cid, two).short, book.pairs(cid, two).voted_short) == (1, {})
        vote = {"pair_id": pair_id("a", "b"), "other": "b", "outcome": "win"}
        one = [{**vote, "labeler": "ana"}]
        index.ingest(cid, dumps_line({**a, "revision": 4, "comparisons": one}), {"t-0": 2})
        assert book.voters(cid) == {pair_id("a", "b"): frozenset({"ana"})}  # a look of another
        # kind in between: the pairing's view then catches up with two changes at once
        both = [*one, {**vote, "labeler": "bo"}]
        index.ingest(cid, dumps_line({**a, "revision": 5, "comparisons": both}), {"t-0": 3})
        found = book.pairs(cid, two)
        assert found.voters == {pair_id("a", "b"): frozenset({"ana", "bo"})}
        assert found.short == 0
        assert {k: v for k, v in found.voted_short.items() if v} == {}
    finally:
        index.close()
