"""Comparisons in the join (DESIGN.md sections 2, 3 and 12; stream/comparisons.py): each
trace's join sees a comparison once, whatever the order events and mirrors arrive in, either
trace arriving later, a batch processed again after its transaction failed; deleting either
trace removes the pair.

The property test runs the real :class:`JoinProcessor` as a small network: every message,
and every mirror or notice the join forwards, waits in a pool and is taken in a random
order, in random batches; some batches lose what they sent (a failed transaction) and are
processed again. What the traces' last snapshots and the pairs' last snapshots say is
compared with a reference computed from the events alone (the latest vote per pair and
labeler; nothing of a pair with a deleted trace).
"""

from __future__ import annotations

import itertools
import random
from dataclasses import dataclass, field
from typing import Any

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rl_export.model.events import RejectReason
from rl_export.model.pairs import outcome, pair_id
from rl_export.model.records import ERASED_REVISION
from rl_export.model.snapshots import decode_snapshot
from rl_export.stream.processor import InMessage
from rl_export.stream.state import dump_state, load_state
from tests.factories import event
from tests.unit.stream.test_processor import NOW, Harness, partition_of, trace, trace_ids_on

# Four traces on three partitions, named so that their order is known.
IDS = sorted([*trace_ids_on(0, 2, "tq"), *trace_ids_on(1, 1, "tr"), *trace_ids_on(3, 1, "ts")])
PAIRS = list(itertools.combinations(IDS, 2))


def at(second: int) -> str:
    return f"2026-01-01T00:00:{second:02d}Z"


def compared(event_id: str, a: str, b: str, labeler: str, choice: str, second: int,  # noqa: PLR0917
             **more: Any) -> dict[str, Any]:  # fmt: skip
    return event("label.compared", event_id, at(second), trace_id=a, trace_a=a, trace_b=b,
                 labeler=labeler, choice=choice, **more)  # fmt: skip


def uncompared(event_id: str, a: str, b: str, labeler: str, second: int) -> dict[str, Any]:
    return event("label.uncompared", event_id, at(second), trace_id=a, trace_a=a, trace_b=b,
                 labeler=labeler)  # fmt: skip


@dataclass
class Network:
    """The join over a pool of messages, the forwarded ones put back into it."""

    harness: Harness = field(default_factory=Harness)
    pool: list[InMessage] = field(default_factory=list)
    snapshots: dict[str, dict[str, Any]] = field(default_factory=dict)
    pairs: dict[str, dict[str, Any]] = field(default_factory=dict)
    offsets: itertools.count[int] = field(default_factory=lambda: itertools.count(1000))

    def add(self, *events: dict[str, Any]) -> None:
        self.pool += [self.harness.message(e) for e in events]

    async def step(self, batch: list[InMessage], *, fail: bool = False) -> None:
        emitter = self.harness.emitter
        await self.harness.processor.process(batch, now=NOW)
        forwards, emitter.forwards = emitter.forwards, []
        snaps, emitter.snapshots = emitter.snapshots, []
        pairs, emitter.pair_snapshots = emitter.pair_snapshots, []
        if fail:  # the transaction failed: nothing it sent is seen, the batch comes again
            await self.step(batch)
            return
        for message, key, partition in forwards:
            self.pool.append(InMessage(message.topic, partition, next(self.offsets), key,
                                       message.value))  # fmt: skip
        for key, value, _ in snaps:
            self.snapshots[key.decode()] = decode_snapshot(value)
        for key, value, _ in pairs:
            self.pairs[key.decode()] = orjson.loads(value)

    async def drain(self, rng: random.Random, fail_rate: float = 0.0) -> None:
        while self.pool:
            rng.shuffle(self.pool)
            size = rng.randint(1, 4)
            batch, self.pool = self.pool[:size], self.pool[size:]
            await self.step(batch, fail=rng.random() < fail_rate)


def reference(events: list[dict[str, Any]]) -> tuple[dict[str, Any], dict[str, Any]]:
    """(trace -> its record's comparisons, pair -> its live votes) from the events alone."""
    deleted = {e["trace_id"] for e in events if e["event_type"] == "trace.deleted"}
    latest: dict[tuple[str, str, str], dict[str, Any]] = {}
    for e in events:
        if e["event_type"] in ("label.compared", "label.uncompared"):
            key = (e["trace_a"], e["trace_b"], e["labeler"])
            if key not in latest or (e["occurred_at"], e["event_id"]) > (
                latest[key]["occurred_at"],
                latest[key]["event_id"],
            ):
                latest[key] = e
    records: dict[str, Any] = {t: [] for t in IDS if t not in deleted}
    pairs: dict[str, Any] = {}
    for (a, b, labeler), e in sorted(latest.items()):
        if a in deleted or b in deleted or e["event_type"] != "label.compared":
            continue
        pid = pair_id(a, b)
        pairs.setdefault(pid, {})[labeler] = e["choice"]
        for me, other in ((a, b), (b, a)):
            records[me].append({
                "pair_id": pid, "other": other, "outcome": outcome(e["choice"], me == a),
                "labeler": labeler, "strength": e.get("strength"),
                "occurred_at": e["occurred_at"],
            })  # fmt: skip
    for entries in records.values():
        entries.sort(key=lambda x: (x["pair_id"], x["labeler"]))
    return records, pairs


def check(net: Network, events: list[dict[str, Any]], *, revisions: bool) -> None:
    records, pairs = reference(events)
    for trace_id, expected in records.items():
        snapshot = net.snapshots[trace_id]
        assert snapshot.get("comparisons") == (expected or None), trace_id
        if revisions:  # its own events, and the comparisons of its pairs
            own = {e["event_id"] for e in events if trace_id in (e["trace_id"], e.get("trace_b"))}
            assert snapshot["revision"] == len(own), trace_id
    for a, b in PAIRS:
        pid = pair_id(a, b)
        found = net.pairs.get(pid)
        if pid in pairs:
            assert found is not None, pid
            assert not found["deleted"], pid
            assert {v["labeler"]: v["choice"] for v in found["votes"]} == pairs[pid]
            if revisions:
                pair_events = {e["event_id"] for e in events
                               if (e.get("trace_a"), e.get("trace_b")) == (a, b)}  # fmt: skip
                assert found["revision"] == len(pair_events)
        elif found is not None:  # a pair whose votes were all retracted, or void
            assert found["deleted"] or found["votes"] == [], pid
            if found["deleted"]:
                assert found["revision"] == ERASED_REVISION


_comparisons = st.lists(
    st.tuples(st.sampled_from(PAIRS), st.sampled_from(["ana", "bo"]),
              st.sampled_from(["a", "b", "tie", "both_bad", None]), st.integers(1, 40)),
    min_size=1, max_size=8,
)  # fmt: skip


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    votes=_comparisons,
    deletions=st.sets(st.sampled_from(IDS), max_size=2),
    seed=st.integers(0, 2**32),
    fail_rate=st.sampled_from([0.0, 0.0, 0.3]),
    repeats=st.integers(0, 3),
)
async def test_every_trace_sees_each_comparison_once_in_any_order(
    votes: list[tuple[tuple[str, str], str, str | None, int]], deletions: set[str], seed: int,
    fail_rate: float, repeats: int,
) -> None:  # fmt: skip
    events = [trace(f"t-{t}", trace_id=t) for t in IDS]
    for n, ((a, b), labeler, choice, second) in enumerate(votes):
        if choice is None:
            events.append(uncompared(f"c-{n}", a, b, labeler, second))
        else:
            events.append(compared(f"c-{n}", a, b, labeler, choice, second, strength=1 + n % 3))
    events += [event("trace.deleted", f"d-{t}", at(50), trace_id=t) for t in sorted(deletions)]
    rng = random.Random(seed)
    net = Network()
    net.add(*events, *rng.sample(events, min(repeats, len(events))))  # some delivered twice
    await net.drain(rng, fail_rate)
    # A failed batch may lose a vote that a later one of its labeler replaced in the same
    # batch: the other trace's record is the same, its revision one lower (comparisons.py).
    check(net, events, revisions=not deletions and fail_rate == 0)


async def test_the_mirror_carries_the_comparison_to_the_other_partition_once() -> None:
    a, b = IDS[0], IDS[2]
    assert partition_of(a) != partition_of(b)
    net = Network()
    net.add(compared("c-1", a, b, "ana", "b", 1, strength=3, comment="clearer"))
    first, net.pool = net.pool, []
    await net.step(first)
    assert net.pool == []  # a is not there yet: the comparison waits, nothing is mirrored
    net.add(trace("t-a", trace_id=a), trace("t-b", trace_id=b))
    await net.drain(random.Random(1))
    assert net.snapshots[a]["comparisons"][0]["outcome"] == "loss"
    assert net.snapshots[b]["comparisons"][0]["outcome"] == "win"
    assert net.snapshots[a]["revision"] == net.snapshots[b]["revision"] == 2
    assert net.harness.metric("rl_export_join_pair_sends_total", kind="mirror") == 1
    assert net.harness.metric("rl_export_join_pair_sends_total", kind="pair.void") is None
    record = net.pairs[pair_id(a, b)]
    assert record["votes"] == [{"labeler": "ana", "choice": "b", "strength": 3, "answers": None,
                                "rubric_version": None, "comment": "clearer",
                                "occurred_at": at(1)}]  # fmt: skip
    assert (record["wins_a"], record["wins_b"], record["trace_id"]) == (0, 1, pair_id(a, b))
    # b keeps no comment (its record shows none): only the owner's pair record does.
    assert net.harness.state(b).pairs[a].votes["ana"].comment is None  # type: ignore[index]


async def test_deleting_the_other_trace_removes_the_pair_from_both() -> None:
    a, b = IDS[0], IDS[2]
    net = Network()
    net.add(trace("t-a", trace_id=a), trace("t-b", trace_id=b),
            compared("c-1", a, b, "ana", "a", 1))  # fmt: skip
    await net.drain(random.Random(2))
    assert net.snapshots[b]["comparisons"]
    net.add(event("trace.deleted", "d-b", at(9), trace_id=b))
    await net.drain(random.Random(3))
    assert net.snapshots[b]["deleted"] is True
    assert "comparisons" not in net.snapshots[a]
    assert net.snapshots[a]["revision"] == 3  # its trace, the comparison, b's notice
    assert net.pairs[pair_id(a, b)]["deleted"] is True
    assert net.harness.metric("rl_export_join_pair_sends_total", kind="pair.void") == 1
    # A later comparison of the pair counts in a's revision and changes nothing.
    net.add(compared("c-2", a, b, "bo", "b", 20))
    await net.drain(random.Random(4))
    assert "comparisons" not in net.snapshots[a]
    assert net.snapshots[a]["revision"] == 4


async def test_a_mirror_to_a_trace_of_another_project_is_dead_lettered_and_voids_the_pair() -> None:
    a, b = IDS[0], IDS[2]
    net = Network()
    net.add(trace("t-a", trace_id=a), trace("t-b", trace_id=b, project="other"),
            compared("c-1", a, b, "ana", "a", 1))  # fmt: skip
    await net.drain(random.Random(5))
    (letter,) = net.harness.emitter.dead_letters
    assert letter[1].reason is RejectReason.ORG_MISMATCH
    assert orjson.loads(letter[0].value)["mirror"] is True
    assert "comparisons" not in net.snapshots[a]
    assert "comparisons" not in net.snapshots[b]
    assert net.pairs[pair_id(a, b)]["deleted"] is True


@pytest.mark.parametrize("bad", [
    {"trace_id": "tr-2"},  # trace_id is trace_a
    {"trace_a": "tr-2", "trace_b": "tr-1"},  # not in order
    {"trace_b": "tr-1"},  # the same trace
    {"choice": "c"},
    {"strength": 4},
])  # fmt: skip
async def test_a_comparison_that_breaks_the_rules_is_dead_lettered(bad: dict[str, Any]) -> None:
    h = Harness()
    await h.run(event("label.compared", "c-1", **bad))
    ((_, rejection),) = h.emitter.dead_letters
    assert rejection.reason is RejectReason.INVALID


def test_a_state_with_pairs_reads_back_and_one_without_keeps_its_bytes() -> None:
    async def run() -> tuple[bytes, bytes]:
        net = Network()
        net.add(trace("t-a", trace_id=IDS[0]), trace("t-b", trace_id=IDS[1]),
                compared("c-1", IDS[0], IDS[1], "ana", "tie", 3, comment="same"))  # fmt: skip
        await net.drain(random.Random(6))
        return net.harness.table.data[IDS[0].encode()], net.harness.table.data[IDS[1].encode()]

    import asyncio

    head_a, head_b = asyncio.run(run())
    for head in (head_a, head_b):
        state = load_state(head)
        assert state.pairs
        assert dump_state(state).startswith(head)
    plain = Harness()
    asyncio.run(plain.run(trace("t-x", trace_id="tr-x")))
    stored = plain.table.data[b"tr-x"]
    assert load_state(stored).pairs is None
    assert len(orjson.loads(stored[5 : 5 + int.from_bytes(stored[1:5], "little")])) == 14
