"""A corpus added later starts with its history (seeded from ``traces``), exactly once."""

from __future__ import annotations

from typing import Any

import pytest

from rl_export.corpora.compaction import compact
from rl_export.corpora.layout import CorpusRef
from rl_export.corpora.reader import CorpusReader
from rl_export.corpora.store import MemoryStore
from rl_export.formats.specs import DEFAULT_CORPORA, CorpusSpec
from rl_export.model.codec import dumps, dumps_line, loads
from rl_export.model.errors import ObjectExistsError
from rl_export.model.partitioning import partition_for
from rl_export.model.records import render
from rl_export.stream.join import snapshot_from_record
from tests.unit.corpora.test_sink import (
    ORG,
    PARTITION,
    PROJECT,
    STREAM,
    Trace,
    chain,
    feed,
    make_sink,
    sample,
    verified,
)

SFT = CorpusSpec(name="sft", source="evaluator", format="messages", filter={"passed": True})
HUMAN_PC = CorpusSpec(name="human-pc", source="human", format="prompt_completion")
GOOD = CorpusSpec(name="good", source="human", filter={"min-reward": 0.6})
NEW = (SFT, HUMAN_PC, GOOD)


def _ids() -> list[str]:
    """Six trace ids that live on the test's partition (a compaction holds every partition's
    traces; a chain only its own)."""
    found = []
    n = 0
    while len(found) < 6:
        trace_id = f"tr-{n}"
        if partition_for(trace_id.encode(), 8, "murmur2") == PARTITION:
            found.append(trace_id)
        n += 1
    return found


IDS = _ids()


def history() -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Snapshots of six traces through many states: before and after the corpora are added."""
    a, b, c, d, e, f = (Trace(t, minute=n) for n, t in enumerate(IDS))
    before = [
        a.completed(), a.evaluated(passed=True), a.labelled("ana"), a.labelled("bo"),
        b.completed(), b.evaluated(passed=False),
        c.completed(), c.evaluated(passed=True), c.deleted(),
        d.completed(), d.labelled("ana"), d.labelled("bo"), d.labelled("chen"),
        d.retracted("bo"),
        e.completed(), e.evaluated(passed=True), e.evaluated(passed=False),
    ]  # fmt: skip
    after = [
        f.completed(), f.evaluated(passed=True),
        b.evaluated(passed=True),  # now passes: a new revision
        a.evaluated(passed=False),  # stops passing: a tombstone in sft
        e.labelled("ana"),
    ]  # fmt: skip
    return before, after


def latest(rows: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for row in rows:
        current = out.get(row["trace_id"])
        if current is None or row["revision"] >= current["revision"]:
            out[row["trace_id"]] = row
    return {t: r for t, r in out.items() if not r.get("deleted")}


async def read_latest(store: MemoryStore, name: str) -> dict[str, dict[str, Any]]:
    reader = CorpusReader(store, CorpusRef(ORG, PROJECT, name))
    return {r["trace_id"]: r async for r in reader.records(latest_only=True)}


def test_a_traces_record_gives_back_the_snapshot_it_came_from() -> None:
    before, after = history()
    compared = 0
    for snapshot in before + after:
        if snapshot["deleted"]:
            continue
        traces = loads(dumps_line(render(snapshot, None)))
        rebuilt = snapshot_from_record(traces)
        for source in ("human", "evaluator"):
            expected = render(snapshot, source)
            got = render(rebuilt, source)
            assert (got is None) == (expected is None), (snapshot["trace_id"], source)
            if expected is not None:
                assert dumps(got) == dumps(expected)
                compared += 1
    assert compared > 15


def test_a_record_written_before_labels_existed_backfills_without_them() -> None:
    """Schema version 1 records lack ``labels``: a corpus seeded from them says nothing of the
    labels (unknown), rather than claiming there were none."""
    a = Trace(IDS[0])
    for snapshot in (a.completed(), a.labelled("ana"), a.evaluated(passed=True)):
        old = {k: v for k, v in loads(dumps_line(render(snapshot, None))).items()
               if k != "labels"}  # fmt: skip
        rebuilt = snapshot_from_record(old)
        for source in ("human", "evaluator", None):
            record = render(rebuilt, source)
            if record is not None:
                assert "labels" not in record
                assert list(record) == [k for k in render(snapshot, source) or {} if k != "labels"]


@pytest.mark.parametrize("compacted", [False, True])
async def test_a_corpus_added_later_holds_what_it_would_have_held(compacted: bool) -> None:
    before, after = history()
    items_before = list(enumerate(before))
    items_after = [(len(before) + n, s) for n, s in enumerate(after)]

    control = MemoryStore()  # the new corpora existed from the start
    sink, _ = make_sink(control, specs=(*DEFAULT_CORPORA, *NEW), max_records=4)
    await feed(sink, items_before + items_after)
    await sink.flush()

    store = MemoryStore()
    sink, _ = make_sink(store, max_records=4)
    await feed(sink, items_before)
    await sink.flush()
    if compacted:
        await compact(store, CorpusRef(ORG, PROJECT, "traces"), writer="test")
    restarted, registry = make_sink(store, specs=(*DEFAULT_CORPORA, *NEW), max_records=4)
    await feed(restarted, items_after)
    await restarted.flush()

    for spec in NEW:
        assert await read_latest(store, spec.name) == await read_latest(control, spec.name)
        links = await chain(store, CorpusRef(ORG, PROJECT, spec.name))
        first, rows = links[0]
        assert (first.from_offset, first.last_offset) == (0, len(before) - 1)
        extra = first.model_extra or {}
        assert extra["backfill"] == {"from": "traces", "records": len(rows)}
        assert sample(registry, "rl_export_sink_backfilled_records_total", corpus=spec.name) == (
            len(rows)
        )
    sft = await read_latest(store, "sft")
    assert sorted(sft) == sorted([IDS[1], IDS[5]])  # b passes now, f passes; a stopped, c deleted
    assert all(list(r) == ["trace_id", "revision", "messages"] for r in sft.values())
    human_pc = await read_latest(store, "human-pc")
    assert sorted(human_pc) == sorted([IDS[0], IDS[3], IDS[4]])
    await verified(store)  # no gap, no overlap, no (trace_id, revision) twice


async def test_a_chain_is_seeded_once_and_the_default_corpora_are_untouched() -> None:
    before, _ = history()
    store = MemoryStore()
    sink, _ = make_sink(store)
    await feed(sink, list(enumerate(before)))
    await sink.flush()
    human_keys = sorted(k for k in store.objects if k.startswith(f"{ORG}/{PROJECT}/human/"))

    for round_ in range(2):  # a second restart finds the chain started: no second seed
        restarted, registry = make_sink(store, specs=(*DEFAULT_CORPORA, SFT))
        await feed(restarted, [(len(before) + round_, before[0])])  # a repeat
        await restarted.flush()
        seeded = sample(registry, "rl_export_sink_backfilled_records_total", corpus="sft")
        assert seeded == (1.0 if round_ == 0 else 0.0)  # a passed; e failed at last
    assert sorted(k for k in store.objects if k.startswith(f"{ORG}/{PROJECT}/human/")) == (
        human_keys
    )
    assert len(await chain(store, CorpusRef(ORG, PROJECT, "sft"))) == 1
    await verified(store)


class LosingStore(MemoryStore):
    """Another writer creates the seed commit between our data upload and our commit."""

    def __init__(self, winner: MemoryStore) -> None:
        super().__init__()
        self.winner = winner
        self.armed = False

    async def put_if_absent(self, key: str, data: bytes) -> None:
        if self.armed and key.startswith(f"{ORG}/{PROJECT}/sft/_manifest/"):
            self.armed = False
            for k, v in self.winner.objects.items():
                if k.startswith(f"{ORG}/{PROJECT}/sft/"):
                    self.objects[k] = v
            raise ObjectExistsError(key)
        await super().put_if_absent(key, data)


async def test_a_writer_that_loses_the_seed_race_takes_the_winners_chain() -> None:
    before, after = history()
    items_before = list(enumerate(before))
    items_after = [(len(before) + n, s) for n, s in enumerate(after)]
    winner = MemoryStore()
    sink, _ = make_sink(winner)
    await feed(sink, items_before)
    await sink.flush()
    store = LosingStore(winner)
    store.objects = dict(winner.objects)
    seeded, _ = make_sink(winner, specs=(*DEFAULT_CORPORA, SFT), writer="winner")
    await feed(seeded, items_after[:1])
    await seeded.flush()

    store.armed = True
    loser, _ = make_sink(store, specs=(*DEFAULT_CORPORA, SFT), writer="loser")
    await feed(loser, items_after)
    await loser.flush()
    assert not store.armed
    links = await chain(store, CorpusRef(ORG, PROJECT, "sft"))
    assert links[0][0].writer == "winner"
    await verified(store)
    assert sorted(await read_latest(store, "sft")) == sorted([IDS[1], IDS[5]])


async def test_a_crash_before_the_seed_commit_seeds_again() -> None:
    before, after = history()
    store = MemoryStore()
    sink, _ = make_sink(store)
    await feed(sink, list(enumerate(before)))
    await sink.flush()

    class Crash(Exception):
        pass

    class CrashingStore(MemoryStore):
        async def put_if_absent(self, key: str, data: bytes) -> None:
            if "/sft/_manifest/" in key:
                raise Crash
            await super().put_if_absent(key, data)

    crashing = CrashingStore()
    crashing.objects = store.objects
    doomed, _ = make_sink(crashing, specs=(*DEFAULT_CORPORA, SFT))
    with pytest.raises(Crash):
        await feed(doomed, [(len(before), after[0])])
    assert any("/sft/data/" in k for k in store.objects)  # the orphan data object
    assert not any("/sft/_manifest/" in k for k in store.objects)

    restarted, _ = make_sink(store, specs=(*DEFAULT_CORPORA, SFT))
    await feed(restarted, [(len(before) + n, s) for n, s in enumerate(after)])
    await restarted.flush()
    await verified(store)
    assert sorted(await read_latest(store, "sft")) == sorted([IDS[1], IDS[5]])


async def test_no_history_no_seed() -> None:
    store = MemoryStore()
    sink, registry = make_sink(store, specs=(*DEFAULT_CORPORA, SFT))
    t = Trace("tr-9")
    await feed(sink, [(0, t.completed()), (1, t.evaluated())])
    await sink.flush()
    assert sample(registry, "rl_export_sink_backfilled_records_total", corpus="sft") == 0
    links = await chain(store, CorpusRef(ORG, PROJECT, "sft"))
    assert [c.model_extra for c, _ in links] == [{}]
    assert STREAM in links[0][0].shard
