"""Claims over slot chains: one holder per place, whatever the instances know of each other."""

from __future__ import annotations

import asyncio
import random

import pytest

from rl_export.corpora.store import MemoryStore
from rl_export.labeling.claims import (
    ClaimBook,
    Claims,
    SlotEntry,
    entry_from_wire,
    occupant,
    slot_key,
)
from rl_export.model.codec import loads
from tests.harness.stores import CountingStore

ORG, PROJECT = "acme", "bot"
GRACE = 900.0


class Clock:
    def __init__(self, now: float = 1_000_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def instance(store: MemoryStore, clock: Clock, heard: list[SlotEntry] | None = None) -> Claims:
    """One web instance: its own book; ``heard`` collects what it broadcasts."""

    async def broadcast(entry: SlotEntry) -> None:
        if heard is not None:
            heard.append(entry)

    return Claims(store, ClaimBook(GRACE), broadcast, clock=clock)


def chain_heads(store: MemoryStore, trace_id: str) -> dict[int, SlotEntry]:
    """The latest generation of each slot of a trace, read from the store itself."""
    heads: dict[int, SlotEntry] = {}
    for _key, value in sorted(store.objects.items()):
        entry = SlotEntry.decode(value)
        if entry.trace_id == trace_id:
            heads[entry.slot] = entry  # keys sort by slot, then generation
    return heads


def holders_in_store(store: MemoryStore, trace_id: str, now: float, labelers: set[str]) -> set[str]:
    found = set()
    for entry in chain_heads(store, trace_id).values():
        who = occupant(entry, now, labelers, GRACE)
        if who is not None:
            found.add(who)
    return found


async def test_two_instances_claiming_one_place_at_once_get_it_once() -> None:
    store, clock = MemoryStore(), Clock()
    a, b = instance(store, clock), instance(store, clock)
    got = await asyncio.gather(
        a.claim(ORG, PROJECT, "tr-1", "ana", target=1, lease_s=60, labelers=()),
        b.claim(ORG, PROJECT, "tr-1", "bo", target=1, lease_s=60, labelers=()),
    )
    winners = [t for t in got if t is not None]
    assert len(winners) == 1
    assert holders_in_store(store, "tr-1", clock.now, set()) == {winners[0].entry.holder}
    # The loser learnt the winner's entry from the chain: it does not try again blindly.
    loser = b if winners[0].entry.holder == "ana" else a
    assert loser.book.holders(ORG, PROJECT, "tr-1", clock.now, ()) == {winners[0].entry.holder}


async def test_a_target_of_three_gives_three_places_to_three_labelers() -> None:
    store, clock = MemoryStore(), Clock()
    instances = [instance(store, clock) for _ in range(3)]
    names = [f"l{n}" for n in range(6)]
    got = await asyncio.gather(
        *(
            instances[n % 3].claim(ORG, PROJECT, "tr-1", name, target=3, lease_s=60, labelers=())
            for n, name in enumerate(names)
        )
    )
    held = {t.entry.holder for t in got if t is not None}
    assert len(held) == 3
    assert holders_in_store(store, "tr-1", clock.now, set()) == held
    assert sorted(t.entry.slot for t in got if t is not None) == [0, 1, 2]


async def test_current_labels_without_a_place_count_toward_the_target() -> None:
    store, clock = MemoryStore(), Clock()
    a = instance(store, clock)
    # Two labels came from elsewhere (published to Kafka by another system): one place left.
    first = await a.claim(ORG, PROJECT, "tr-1", "cy", target=3, lease_s=60, labelers=("x", "y"))
    assert first is not None
    assert await a.claim(ORG, PROJECT, "tr-1", "dee", target=3, lease_s=60,
                         labelers=("x", "y")) is None  # fmt: skip
    # A labeler who labeled already has nothing to claim.
    assert await a.claim(ORG, PROJECT, "tr-2", "x", target=3, lease_s=60, labelers=("x",)) is None


async def test_an_expired_claim_frees_its_place_for_someone_else() -> None:
    store, clock = MemoryStore(), Clock()
    a, b = instance(store, clock), instance(store, clock)
    assert await a.claim(ORG, PROJECT, "tr-1", "ana", target=1, lease_s=60, labelers=())
    assert await b.claim(ORG, PROJECT, "tr-1", "bo", target=1, lease_s=60, labelers=()) is None
    clock.now += 61
    taken = await b.claim(ORG, PROJECT, "tr-1", "bo", target=1, lease_s=60, labelers=())
    assert taken is not None
    assert (taken.entry.slot, taken.entry.generation) == (0, 1)
    assert holders_in_store(store, "tr-1", clock.now, set()) == {"bo"}


async def test_asking_again_renews_the_callers_claim() -> None:
    store, clock = MemoryStore(), Clock()
    a = instance(store, clock)
    first = await a.claim(ORG, PROJECT, "tr-1", "ana", target=1, lease_s=60, labelers=())
    clock.now += 30
    again = await a.claim(ORG, PROJECT, "tr-1", "ana", target=1, lease_s=60, labelers=())
    assert first is not None
    assert again is not None
    assert again.entry.slot == first.entry.slot
    assert again.entry.expires_at == clock.now + 60
    assert a.book.claims_of(ORG, PROJECT, "ana", clock.now) == [again.entry]


async def test_a_label_turns_the_claim_into_the_labels_place() -> None:
    store, clock = MemoryStore(), Clock()
    a, b = instance(store, clock), instance(store, clock)
    await a.claim(ORG, PROJECT, "tr-1", "ana", target=1, lease_s=60, labelers=())
    assert await a.label(ORG, PROJECT, "tr-1", "ana", target=1, labelers=()) == "claim"
    head = chain_heads(store, "tr-1")[0]
    assert (head.state, head.holder) == ("labeled", "ana")
    clock.now += 3600  # long after the lease: the label still holds the place
    assert await b.claim(ORG, PROJECT, "tr-1", "bo", target=1, lease_s=60,
                         labelers=("ana",)) is None  # fmt: skip
    # Relabeling keeps the same place.
    assert await a.label(ORG, PROJECT, "tr-1", "ana", target=1, labelers=("ana",)) == "held"


async def test_a_retraction_frees_the_labels_place() -> None:
    store, clock = MemoryStore(), Clock()
    a, b = instance(store, clock), instance(store, clock)
    await a.claim(ORG, PROJECT, "tr-1", "ana", target=1, lease_s=60, labelers=())
    await a.label(ORG, PROJECT, "tr-1", "ana", target=1, labelers=())
    assert await a.retract(ORG, PROJECT, "tr-1", "ana")
    assert await b.claim(ORG, PROJECT, "tr-1", "bo", target=1, lease_s=60, labelers=())


async def test_a_labels_place_lapses_when_the_index_no_longer_shows_it_after_the_grace() -> None:
    """A label retracted by another system (not through the API) frees its place once the
    grace is over and the corpora no longer list the labeler."""
    store, clock = MemoryStore(), Clock()
    a = instance(store, clock)
    await a.label(ORG, PROJECT, "tr-1", "ana", target=1, labelers=())
    assert await a.claim(ORG, PROJECT, "tr-1", "bo", target=1, lease_s=60, labelers=()) is None
    clock.now += GRACE + 1
    assert await a.claim(ORG, PROJECT, "tr-1", "bo", target=1, lease_s=60,
                         labelers=("ana",)) is None  # fmt: skip
    assert await a.claim(ORG, PROJECT, "tr-1", "bo", target=1, lease_s=60, labelers=())


async def test_a_skip_or_release_ends_the_claim_and_frees_the_place() -> None:
    store, clock = MemoryStore(), Clock()
    a, b = instance(store, clock), instance(store, clock)
    await a.claim(ORG, PROJECT, "tr-1", "ana", target=1, lease_s=60, labelers=())
    assert await a.release(ORG, PROJECT, "tr-1", "ana")
    assert not await a.release(ORG, PROJECT, "tr-1", "ana")  # nothing left to release
    assert await b.claim(ORG, PROJECT, "tr-1", "bo", target=1, lease_s=60, labelers=())
    assert not await a.release(ORG, PROJECT, "tr-1", "ana")  # bo's claim is not ana's


async def test_a_label_after_its_claim_expired_and_was_taken_is_over_the_target() -> None:
    """DESIGN.md section 8's one exception: the label counts, over the target."""
    store, clock = MemoryStore(), Clock()
    a, b = instance(store, clock), instance(store, clock)
    await a.claim(ORG, PROJECT, "tr-1", "ana", target=1, lease_s=60, labelers=())
    clock.now += 61
    assert await b.claim(ORG, PROJECT, "tr-1", "bo", target=1, lease_s=60, labelers=())
    # ana's instance does not know bo took the place: it finds out from the chain.
    assert await a.label(ORG, PROJECT, "tr-1", "ana", target=1, labelers=()) == "over"
    assert holders_in_store(store, "tr-1", clock.now, {"ana"}) == {"bo"}


async def test_a_label_after_its_claim_expired_untaken_keeps_its_place() -> None:
    store, clock = MemoryStore(), Clock()
    a = instance(store, clock)
    await a.claim(ORG, PROJECT, "tr-1", "ana", target=2, lease_s=60, labelers=())
    clock.now += 600
    assert await a.label(ORG, PROJECT, "tr-1", "ana", target=2, labelers=()) == "claim"


async def test_a_label_without_a_claim_takes_a_free_place_or_is_over() -> None:
    store, clock = MemoryStore(), Clock()
    a = instance(store, clock)
    assert await a.label(ORG, PROJECT, "tr-1", "ana", target=2, labelers=()) == "free"
    await a.claim(ORG, PROJECT, "tr-1", "bo", target=2, lease_s=60, labelers=("ana",))
    assert await a.label(ORG, PROJECT, "tr-1", "cy", target=2, labelers=("ana",)) == "over"


async def test_an_instance_that_has_not_heard_of_a_claim_or_release_reads_the_store() -> None:
    # Nothing is broadcast between a and b: b knows only what it wrote and read itself.
    store, clock = MemoryStore(), Clock()
    a, b = instance(store, clock), instance(store, clock)
    assert await b.claim(ORG, PROJECT, "tr-1", "cy", target=2, lease_s=60, labelers=())
    assert await a.claim(ORG, PROJECT, "tr-1", "cy", target=2, lease_s=60, labelers=())
    assert await a.release(ORG, PROJECT, "tr-1", "cy")  # b still thinks cy holds a place
    assert await a.claim(ORG, PROJECT, "tr-1", "ana", target=2, lease_s=60, labelers=())
    assert await a.claim(ORG, PROJECT, "tr-1", "bo", target=2, lease_s=60, labelers=())
    # bo labels through b, whose book shows ana's claim and cy's stale one: both places held.
    # b reads the chains and finds bo's claim, which the label ends; nothing is over.
    assert await b.label(ORG, PROJECT, "tr-1", "bo", target=2, labelers=()) == "claim"
    # ana lets go through b, which never saw her claim.
    assert await b.release(ORG, PROJECT, "tr-1", "ana", slots=2)
    assert holders_in_store(store, "tr-1", clock.now, {"bo"}) == {"bo"}
    # Without a claim anywhere, a release through either instance finds none.
    assert not await b.release(ORG, PROJECT, "tr-1", "ana", slots=2)


async def test_a_new_instance_reads_a_long_chain_by_its_last_generation() -> None:
    store, clock = CountingStore(), Clock()
    a = instance(store, clock)
    for _ in range(200):  # the head of a queue, claimed and let go all day
        assert await a.claim(ORG, PROJECT, "tr-1", "ana", target=1, lease_s=60, labelers=())
        assert await a.release(ORG, PROJECT, "tr-1", "ana")
    assert await a.claim(ORG, PROJECT, "tr-1", "ana", target=1, lease_s=60, labelers=())
    b = instance(store, clock)  # a new instance: its book knows nothing of tr-1
    store.gets = store.lists = 0
    assert await b.claim(ORG, PROJECT, "tr-1", "bo", target=1, lease_s=60, labelers=()) is None
    # b lost the race for generation 0 and learnt ana's claim at generation 400: generation
    # 0, a listing, the last generation and a read past it, not 402 reads.
    assert b.book.holders(ORG, PROJECT, "tr-1", clock.now, ()) == {"ana"}
    assert (store.gets, store.lists) == (3, 1)
    # What it learnt is the head: once ana's lease ends, b writes the generation after it.
    clock.now += 61
    taken = await b.claim(ORG, PROJECT, "tr-1", "bo", target=1, lease_s=60, labelers=())
    assert taken is not None
    assert taken.entry.generation == 401
    assert holders_in_store(store, "tr-1", clock.now, set()) == {"bo"}


async def test_the_broadcast_carries_every_entry_and_teaches_other_books() -> None:
    store, clock = MemoryStore(), Clock()
    heard: list[SlotEntry] = []
    a, b = instance(store, clock, heard), instance(store, clock)
    await a.claim(ORG, PROJECT, "tr-1", "ana", target=1, lease_s=60, labelers=())
    await a.label(ORG, PROJECT, "tr-1", "ana", target=1, labelers=())
    assert [e.state for e in heard] == ["claimed", "labeled"]
    for entry in heard:
        wire = entry_from_wire(entry.encode())
        assert wire == entry
        b.book.learn(wire)
    assert b.book.holders(ORG, PROJECT, "tr-1", clock.now, ("ana",)) == {"ana"}
    assert not b.book.learn(heard[0])  # an older generation changes nothing
    assert entry_from_wire(b'{"not": "an entry"}') is None
    assert entry_from_wire(b"[1]") is None


def test_slot_keys_are_safe_for_any_trace_id() -> None:
    key = slot_key(ORG, PROJECT, "../../etc/passwd", 3, 12)
    assert key.startswith("_claims/acme/bot/")
    assert key.endswith("/03/00000012.json")
    assert ".." not in key


async def test_entries_are_stored_as_json_objects_naming_their_trace() -> None:
    store, clock = MemoryStore(), Clock()
    await instance(store, clock).claim(ORG, PROJECT, "tr/1", "ana", target=1, lease_s=60,
                                       labelers=())  # fmt: skip
    ((_key, value),) = store.objects.items()
    stored = loads(value)
    assert stored["trace_id"] == "tr/1"
    assert stored["holder"] == "ana"
    assert stored["expires_at"] == clock.now + 60


def test_the_book_forgets_traces_quiet_for_long_and_keeps_the_rest() -> None:
    book = ClaimBook(GRACE)
    book.learn(SlotEntry(ORG, PROJECT, "old", 0, 0, "claimed", "ana", 100.0, 160.0))
    book.learn(SlotEntry(ORG, PROJECT, "new", 0, 0, "claimed", "ana", 5000.0, 5060.0))
    assert book.forget(now=5100.0, keep_s=1800.0) == 1
    assert list(book.traces(ORG, PROJECT)) == ["new"]


@pytest.mark.parametrize("seed", range(12))
async def test_places_never_outnumber_the_target_under_random_interleavings(seed: int) -> None:
    """Several instances, each knowing only what it wrote or lost to, claim, label, skip and
    release at random while the clock runs past leases. At every moment, the current labels
    and the unexpired claims of a trace are at most its target, but for the labels the API
    said were over it (DESIGN.md section 8's exception); and no labeler holds two places."""
    rng = random.Random(seed)
    store, clock = MemoryStore(), Clock()
    instances = [instance(store, clock) for _ in range(3)]
    names = [f"l{n}" for n in range(7)]
    traces = ["tr-a", "tr-b"]
    target = rng.choice([1, 2, 3])
    labeled: dict[str, set[str]] = {t: set() for t in traces}  # the corpora's labelers
    over: dict[str, set[str]] = {t: set() for t in traces}  # their labels over the target
    outcomes: list[str] = []

    async def act(n: int) -> None:
        inst = instances[n % len(instances)]
        name, trace_id = rng.choice(names), rng.choice(traces)
        roll = rng.random()
        if roll < 0.5:
            if name not in labeled[trace_id]:
                await inst.claim(ORG, PROJECT, trace_id, name, target=target, lease_s=60,
                                 labelers=tuple(labeled[trace_id]))  # fmt: skip
        elif roll < 0.75:
            place = await inst.label(ORG, PROJECT, trace_id, name, target=target,
                                     labelers=tuple(labeled[trace_id]))  # fmt: skip
            outcomes.append(place)
            labeled[trace_id].add(name)
            if place == "over":
                over[trace_id].add(name)
            else:
                over[trace_id].discard(name)
        elif roll < 0.85:
            await inst.release(ORG, PROJECT, trace_id, name)
        elif roll < 0.95 and name in labeled[trace_id]:
            await inst.retract(ORG, PROJECT, trace_id, name)
            labeled[trace_id].discard(name)
            over[trace_id].discard(name)
        else:
            clock.now += rng.choice([1, 30, 61])

    for _ in range(40):
        await asyncio.gather(*(act(n) for n in range(rng.randint(1, 6))))
        for trace_id in traces:
            heads = chain_heads(store, trace_id).values()
            claims = {e.holder for e in heads if e.live_claim(clock.now)}
            places = [e.holder for e in heads
                      if occupant(e, clock.now, labeled[trace_id], GRACE) is not None]  # fmt: skip
            assert len(places) == len(set(places)), places  # one place per labeler
            counted = (labeled[trace_id] | claims) - over[trace_id]
            assert len(counted) <= target, (trace_id, counted, target)
    # The run did what it is meant to: places were taken, and labels arrived both ways.
    assert {"claim", "free"} & set(outcomes)
