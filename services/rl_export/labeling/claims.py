"""Claims: leases on a trace's places, held across web instances with create-only writes.

A trace whose target is k labels (k + 1 once adjudication asked for one more) has k places,
its *slots* 0..k-1. Each slot is a chain of create-only objects in the store, the way a
corpus's commits are (docs/concepts/corpora.md):

    _claims/<org>/<project>/<sha256 of trace_id, 32 hex>/<slot:02d>/<generation:08d>.json

and its latest generation says what the slot holds:

* ``claimed`` by C until ``expires_at``: C's lease (once expired, the slot is free again);
* ``labeled`` by C: C's label fills the place, for as long as C's label is current (the
  index or the overlay says so) and, before they can tell, for ``label_grace_s``;
* ``free``: released by its holder, ended by the holder's skip, or by a retraction.

Taking a slot writes its next generation with ``put_if_absent``: of any number of instances
writing the same generation at once exactly one wins, and a loser reads the winner's entry
and chooses again. So a slot never has two holders, and the places held (claims and labels
through the API) never outnumber the slots. Every entry written is also broadcast on the
claims topic (:mod:`rl_export.web.claimsbus`), so each instance's :class:`ClaimBook` knows
the others' claims within milliseconds: its queue leaves out traces whose places are all
held, and it rarely loses a race. The book is knowledge, never the arbiter: a stale book
only costs a lost race and a read.

The one exception (docs/guides/labeling.md): C's claim expired, D took the place, then C's
label arrives. The label is accepted (a person did the work), takes another free place if
there is one, and is otherwise over the target: :meth:`Claims.label` says so and the caller
counts it (``rl_export_labels_over_target_total``). Labels published to Kafka by other
systems hold no slot; they count through the trace's current labelers (``others``).
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Awaitable, Callable, Collection, Iterator
from dataclasses import asdict, dataclass, replace
from typing import Any, Literal

from rl_export.corpora.store import ObjectStore
from rl_export.model.codec import dumps, loads
from rl_export.model.errors import ObjectExistsError, ObjectNotFoundError

PREFIX = "_claims/"
SlotState = Literal["claimed", "labeled", "free"]
LabelPlace = Literal["claim", "free", "held", "over"]
"""Where a label went: the labeler's own claim, a free place, the place their earlier label
already held, or none (over the target)."""

MAX_ROUNDS = 16  # lost races per request before giving up on a trace (each one is a read)


@dataclass(frozen=True, slots=True)
class SlotEntry:
    """One generation of a slot's chain: what the slot holds from ``at`` on."""

    org: str
    project: str
    trace_id: str
    slot: int
    generation: int
    state: SlotState
    holder: str | None
    at: float  # epoch seconds (the writer's clock)
    expires_at: float | None = None  # a claim's end, epoch seconds

    @property
    def key(self) -> str:
        return slot_key(self.org, self.project, self.trace_id, self.slot, self.generation)

    def encode(self) -> bytes:
        return dumps(asdict(self))

    @classmethod
    def decode(cls, data: bytes) -> SlotEntry:
        """An entry from its JSON; ValueError when it is not one."""
        value = loads(data)
        if not isinstance(value, dict):
            raise ValueError("a slot entry is a JSON object")
        try:
            entry = cls(**value)
        except TypeError as exc:
            raise ValueError(f"not a slot entry: {exc}") from None
        if entry.state not in ("claimed", "labeled", "free") or entry.generation < 0:
            raise ValueError(f"not a slot entry: state {entry.state!r}")
        return entry

    def live_claim(self, now: float) -> bool:
        return self.state == "claimed" and self.expires_at is not None and self.expires_at > now


def trace_digest(trace_id: str) -> str:
    """A trace id as one safe key segment (ids may hold ``/`` or ``..``)."""
    return hashlib.sha256(trace_id.encode()).hexdigest()[:32]


def slot_key(org: str, project: str, trace_id: str, slot: int, generation: int) -> str:
    return f"{slot_prefix(org, project, trace_id, slot)}{generation:08d}.json"


def slot_prefix(org: str, project: str, trace_id: str, slot: int) -> str:
    """The folder of a slot's chain (its keys sort by generation)."""
    return f"{PREFIX}{org}/{project}/{trace_digest(trace_id)}/{slot:02d}/"


def generation_of(key: str) -> int:
    """The generation a slot key names."""
    return int(key.rsplit("/", 1)[1].removesuffix(".json"))


def occupant(
    entry: SlotEntry, now: float, labelers: Collection[str], label_grace_s: float
) -> str | None:
    """Who holds the slot at ``now`` (None: it is free).

    ``labelers`` are the trace's current labelers as far as this instance knows (the index
    and the overlay); a ``labeled`` entry younger than ``label_grace_s`` counts even before
    they show its label.
    """
    if entry.live_claim(now):
        return entry.holder
    if entry.state == "labeled" and (entry.holder in labelers or now - entry.at < label_grace_s):
        return entry.holder
    return None


class ClaimBook:
    """What this instance knows of every slot: the latest generation it has seen of each.

    Fed by this instance's own writes, by the claims topic (every instance's writes) and by
    the chains it reads after a lost race. Pure: the clock is passed in.
    """

    def __init__(self, label_grace_s: float) -> None:
        self.label_grace_s = label_grace_s
        self._slots: dict[tuple[str, str, str], dict[int, SlotEntry]] = {}

    def learn(self, entry: SlotEntry) -> bool:
        """Keep ``entry`` if it is newer than what is known of its slot; True if it was."""
        slots = self._slots.setdefault((entry.org, entry.project, entry.trace_id), {})
        known = slots.get(entry.slot)
        if known is not None and known.generation >= entry.generation:
            return False
        slots[entry.slot] = entry
        return True

    def slots(self, org: str, project: str, trace_id: str) -> dict[int, SlotEntry]:
        return dict(self._slots.get((org, project, trace_id), {}))

    def holders(
        self, org: str, project: str, trace_id: str, now: float, labelers: Collection[str]
    ) -> set[str]:
        """Who holds a place of the trace at ``now`` (claims, and labels through slots)."""
        found = set()
        for entry in self._slots.get((org, project, trace_id), {}).values():
            who = occupant(entry, now, labelers, self.label_grace_s)
            if who is not None:
                found.add(who)
        return found

    def traces(self, org: str, project: str) -> Iterator[str]:
        """The traces of a project with any known slot (for the queue's corrections)."""
        for key_org, key_project, trace_id in self._slots:
            if (key_org, key_project) == (org, project):
                yield trace_id

    def claims_of(self, org: str, project: str, labeler: str, now: float) -> list[SlotEntry]:
        """The labeler's unexpired claims in a project, oldest first."""
        found = [
            entry
            for (key_org, key_project, _), slots in self._slots.items()
            if (key_org, key_project) == (org, project)
            for entry in slots.values()
            if entry.holder == labeler and entry.live_claim(now)
        ]
        return sorted(found, key=lambda e: (e.at, e.trace_id))

    def forget(self, now: float, keep_s: float) -> int:
        """Drop traces none of whose slots has mattered for ``keep_s``; return how many."""
        stale = [
            key
            for key, slots in self._slots.items()
            if all(_quiet_since(e) + keep_s < now for e in slots.values())
        ]
        for key in stale:
            del self._slots[key]
        return len(stale)


def _quiet_since(entry: SlotEntry) -> float:
    return max(entry.at, entry.expires_at or 0.0)


Broadcast = Callable[[SlotEntry], Awaitable[None]]


@dataclass(frozen=True)
class Taken:
    """A place a request got: the entry written, or the one the labeler already held."""

    entry: SlotEntry
    fresh: bool  # written by this request (False: the labeler held it already)


class Claims:
    """Takes, renews and ends places in the slot chains (see the module)."""

    def __init__(
        self, store: ObjectStore, book: ClaimBook, broadcast: Broadcast, *,
        clock: Callable[[], float] = time.time,
    ) -> None:  # fmt: skip
        self.store = store
        self.book = book
        self.broadcast = broadcast
        self.clock = clock
        # Places this instance is writing right now: its other requests leave them alone
        # rather than race themselves for them (the store would refuse all but one anyway).
        self._writing: set[tuple[str, str, str, int]] = set()

    async def claim(
        self, org: str, project: str, trace_id: str, labeler: str, *, target: int,
        lease_s: float, labelers: Collection[str],
    ) -> Taken | None:  # fmt: skip
        """Lease a place of the trace to ``labeler`` for ``lease_s``; renew theirs if they
        hold one. None when every place is held (or ``labeler`` labeled it already)."""
        if labeler in labelers:
            return None
        taken = await self._take(org, project, trace_id, labeler, "claimed", target=target,
                                 lease_s=lease_s, labelers=labelers, renew=True)  # fmt: skip
        # A place their label holds (not yet among ``labelers``) is no claim: nothing to do.
        return taken if taken is not None and taken.entry.state == "claimed" else None

    async def label(
        self, org: str, project: str, trace_id: str, labeler: str, *, target: int,
        labelers: Collection[str],
    ) -> LabelPlace:  # fmt: skip
        """Record that ``labeler`` labeled the trace: their claim becomes their label's
        place; without one (or after it expired and was taken), a free place; else the label
        is over the target. ``labelers`` are the trace's current labelers."""
        # A claim this instance has not heard of yet (taken through another instance a
        # moment ago) is read from the store before the label looks for another place.
        if await self._end(org, project, trace_id, labeler, "labeled", held=("claimed",),
                           slots=target):  # fmt: skip
            return "claim"
        # The labeler's label is current from now on: a place it held is still theirs.
        current = {*labelers, labeler}
        taken = await self._take(org, project, trace_id, labeler, "labeled", target=target,
                                 lease_s=0.0, labelers=current, renew=False)  # fmt: skip
        if taken is None:
            return "over"
        return "free" if taken.fresh else "held"

    async def release(
        self, org: str, project: str, trace_id: str, labeler: str, *, slots: int = 0
    ) -> bool:
        """End the labeler's unexpired claim (a release or a skip); False if they had none.
        ``slots``: how many of the trace's slots to read from the store when the book knows
        no claim of theirs (it may be news to this instance)."""
        return await self._end(
            org, project, trace_id, labeler, "free", held=("claimed",), live=True, slots=slots
        )

    async def retract(
        self, org: str, project: str, trace_id: str, labeler: str, *, slots: int = 0
    ) -> bool:
        """Free the place the labeler's label held (their label was retracted)."""
        return await self._end(
            org, project, trace_id, labeler, "free", held=("labeled",), slots=slots
        )

    async def _take(
        self, org: str, project: str, trace_id: str, labeler: str, state: SlotState, *,
        target: int, lease_s: float, labelers: Collection[str], renew: bool,
    ) -> Taken | None:  # fmt: skip
        grace = self.book.label_grace_s
        for _ in range(MAX_ROUNDS):
            now = self.clock()
            slots = self.book.slots(org, project, trace_id)
            held = {n: occupant(e, now, labelers, grace) for n, e in slots.items()}
            own = [n for n, who in held.items() if who == labeler]
            if own:
                mine = slots[own[0]]
                if not (renew and mine.state == "claimed"):
                    return Taken(mine, fresh=False)
                entry = replace(mine, generation=mine.generation + 1, at=now,
                                expires_at=now + lease_s)  # fmt: skip
            else:
                holders = {who for who in held.values() if who is not None}
                taken = (holders | set(labelers)) - {labeler}
                free = [n for n in range(target) if held.get(n) is None]
                busy = [n for n in free if (org, project, trace_id, n) in self._writing]
                if len(taken) + len(busy) >= target or len(free) == len(busy):
                    return None
                free = [n for n in free if n not in busy]
                known = slots.get(free[0])
                entry = SlotEntry(
                    org, project, trace_id, free[0], 0 if known is None else known.generation + 1,
                    state, labeler, now, now + lease_s if state == "claimed" else None,
                )  # fmt: skip
            if await self._write(entry):
                return Taken(entry, fresh=True)
        return None

    async def _end(
        self, org: str, project: str, trace_id: str, labeler: str, state: SlotState, *,
        held: tuple[SlotState, ...], live: bool = False, slots: int = 0,
    ) -> bool:  # fmt: skip
        """Write ``state`` over the labeler's latest entry in ``held`` states (a claim: even
        an expired one, unless ``live``); False if someone else's entry came after it.
        When the book shows no such entry, the trace's first ``slots`` slots (and those it
        knows) are read from the store once before giving up."""
        refreshed = slots <= 0
        for _ in range(MAX_ROUNDS):
            now = self.clock()
            mine = [
                e
                for e in self.book.slots(org, project, trace_id).values()
                if e.holder == labeler and e.state in held and (not live or e.live_claim(now))
            ]
            if not mine and not refreshed:
                await self.refresh(org, project, trace_id, slots)
                refreshed = True
                continue
            if not mine:
                return False
            last = max(mine, key=lambda e: (e.at, e.slot))
            entry = replace(last, generation=last.generation + 1, state=state, at=now,
                            expires_at=None)  # fmt: skip
            if await self._write(entry):
                return True
        return False

    async def _write(self, entry: SlotEntry) -> bool:
        """Create the entry's generation; on a lost race, learn the chain up to its head."""
        place = (entry.org, entry.project, entry.trace_id, entry.slot)
        self._writing.add(place)
        try:
            await self.store.put_if_absent(entry.key, entry.encode())
        except ObjectExistsError:
            await self.read_chain(entry.org, entry.project, entry.trace_id, entry.slot,
                                  entry.generation)  # fmt: skip
            return False
        finally:
            self._writing.discard(place)
        self.book.learn(entry)
        await self.broadcast(entry)
        return True

    async def refresh(self, org: str, project: str, trace_id: str, slots: int) -> None:
        """Read what the store holds beyond the book for the trace's first ``slots`` slots
        (and any other slot the book knows): the authority, where the book is only news."""
        known = self.book.slots(org, project, trace_id)
        for slot in sorted(set(range(slots)) | set(known)):
            entry = known.get(slot)
            await self.read_chain(org, project, trace_id, slot,
                                  0 if entry is None else entry.generation + 1)  # fmt: skip

    async def read_chain(
        self, org: str, project: str, trace_id: str, slot: int, generation: int
    ) -> SlotEntry | None:
        """Read a slot's generations from ``generation`` on into the book; the head.

        Read one by one, a chain costs a read per generation, and a trace claimed and let go
        many times has many: so a slot the book knew nothing of (``generation`` 0: a new
        instance, or a trace it never touched) whose first generation exists is listed once,
        and only its last generation read (then on from it, for what came since the listing).
        A chain of one generation costs a listing more than before; one of a thousand, a
        listing and three reads instead of a thousand. A slot the book follows (the claims
        topic tells it every write) is read on from what it knows, as before."""
        head = None
        listed = generation > 0
        while True:
            try:
                data = await self.store.get(slot_key(org, project, trace_id, slot, generation))
            except ObjectNotFoundError:
                return head
            head = SlotEntry.decode(data)
            self.book.learn(head)
            generation += 1
            if not listed:
                listed = True
                after = slot_key(org, project, trace_id, slot, generation - 1)
                later = await self.store.list(slot_prefix(org, project, trace_id, slot), after)
                if later:
                    generation = max(generation, generation_of(later[-1]))


def entry_from_wire(value: bytes) -> SlotEntry | None:
    """An entry broadcast on the claims topic (None for anything else on it)."""
    try:
        return SlotEntry.decode(value)
    except ValueError:
        return None


def as_json(entry: SlotEntry) -> dict[str, Any]:
    return asdict(entry)
