"""Comparisons in the join (docs/concepts/join-rules.md, "Comparisons"): a pair event merged
into one of its traces' states, what that trace then owes the pair's other trace, the pair
snapshot, and the ``comparisons`` of the trace's record. Pure: no Kafka, no clock.

How a comparison reaches both traces, exactly once, whatever the order things arrive in (the
steps are :mod:`rl_export.stream.join`'s calls into this module):

1. A ``label.compared`` (or its retraction, ``label.uncompared``) is keyed by ``trace_a``, so
   it reaches the join of trace_a's partition, and waits there for trace_a like any event.
   Once trace_a's state accepts it (the trace exists, of the event's org/project, not
   deleted: :func:`apply`), the vote counts there, and its *mirror* (the same event with
   ``trace_id`` = ``trace_b`` and ``mirror: true``: :func:`mirror_of`) goes to trace_b's
   partition on the labels topic, in the transaction that commits trace_a's state. A
   comparison that a deleted trace_a receives counts in trace_a's revision and changes
   nothing (deletion is final): it has no mirror.
2. The mirror waits for trace_b like any event and counts there under the same event id
   (each trace's ``seen`` set counts it once). A mirror is never mirrored again.
3. trace_a *owns* the pair: every vote reaches it first, so it emits the pair's snapshot,
   the ``comparisons`` corpus's record, keyed by the pair's id (:func:`pair_snapshot`). Its
   ``revision`` counts the pair's distinct events accepted there, so it only grows.
4. A pair is *void* once either trace is deleted, or once trace_b turns out to be of
   another org/project than the comparison (its mirror is dead-lettered there). The trace
   that finds out sends the other a ``pair.void`` notice (event id
   ``<pair_id>/void/<sender>``, so it counts once however often it is sent: :func:`notice`).
   The owner's pair snapshot becomes the pair's erased tombstone, and both traces' records
   drop the pair. A notice counts in the receiver's ``revision`` (its record changes), not
   in its ``updated_at`` (it is no input event).
5. A redelivered event (a batch processed again after its transaction failed) sends again
   what it made its trace send: a comparison its mirror, a mirror its notice, the trace's
   arrival or deletion everything the trace owes (its current votes' mirrors, its voids'
   notices), and its pair snapshots (:func:`resend`); the receivers count each event id
   once. (A vote that waited for its trace and was superseded before the trace's arrival
   was redelivered is not sent again: the other trace's record is the same, its revision
   one lower.)

A trace whose state never saw a pair keeps its bytes: ``pairs`` is None, and its record has
no ``comparisons`` field.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

import orjson

from rl_export.model.codec import dumps
from rl_export.model.events import format_micros
from rl_export.model.eventview import EventView
from rl_export.model.pairs import COMPARISONS, outcome, pair_id
from rl_export.model.records import ERASED_REVISION

OrderKey = tuple[int, str]
VOID = "pair.void"


@dataclass(slots=True)
class Vote:
    """A labeler's latest comparison of a pair on this side: ``choice`` None is a
    retraction. The owner keeps the comment and answers too (its pair record shows them)."""

    key: OrderKey
    choice: str | None
    strength: int | None = None
    comment: str | None = None
    answers: dict[str, Any] | None = None
    version: int | None = None


@dataclass(slots=True)
class Pair:
    """One pair as one of its traces keeps it (keyed by the other trace)."""

    votes: dict[str, Vote] = field(default_factory=dict)
    events: int = 0  # the pair's distinct events accepted here (the owner's pair revision)
    updated: int = 0  # micros of the latest comparison (the pair record's updated_at)
    void: bool = False
    mine: bool = False  # void because of this trace: it owes the other a notice


@dataclass(slots=True)
class Effects:
    """What merging pair events asks of the batch: events for other traces (target trace id,
    value for the labels topic) and the owned pairs whose snapshot is due (by other trace)."""

    sends: list[tuple[str, bytes]] = field(default_factory=list)
    pairs: set[str] = field(default_factory=set)


class _State(Protocol):
    """What these rules read of a trace's state (:class:`~rl_export.stream.join.TraceState`)."""

    trace_id: str
    org: str | None
    project: str | None
    pairs: dict[str, Pair] | None
    deleted_at: float | None


def _other(trace_id: str, event: EventView) -> str:
    pair = event.pair
    assert pair is not None
    return pair.trace_b if trace_id == pair.trace_a else pair.trace_a


def _pairs(st: _State) -> dict[str, Pair]:
    if st.pairs is None:
        st.pairs = {}
    return st.pairs


def apply(st: _State, event: EventView, raw: bytes, effects: Effects) -> None:
    """Step 1 (trace_a's side) or 2 (trace_b's) or 4 (a notice), for a trace that exists and
    is not deleted; ``raw`` is the event's value (a mirror is made of it)."""
    view = event.pair
    assert view is not None
    other = _other(st.trace_id, event)
    pairs = _pairs(st)
    pair = pairs.get(other)
    if pair is None:
        pair = pairs[other] = Pair()
    owner = st.trace_id == view.trace_a
    if event.event_type == VOID:
        if not pair.void:
            pair.void, pair.votes = True, {}
            pair.events += 1
            if owner:
                effects.pairs.add(other)
        return
    if pair.void:
        return  # the pair is gone: the event counts in the trace's revision only
    pair.events += 1
    pair.updated = max(pair.updated, event.micros)
    key = (event.micros, event.event_id)
    current = pair.votes.get(event.labeler)
    if current is None or key > current.key:
        pair.votes[event.labeler] = (
            Vote(key, view.choice, view.strength, event.comment, view.answers,
                 view.rubric_version)
            if owner else Vote(key, view.choice, view.strength)
        )  # fmt: skip
    if owner:
        effects.sends.append((other, mirror_of(raw, view.trace_b)))
        effects.pairs.add(other)


def mirror_of(raw: bytes, trace_b: str) -> bytes:
    """The mirror of a comparison event (its value): for trace_b, marked as a mirror; every
    other field as it came."""
    value = orjson.loads(raw)
    value["trace_id"] = trace_b
    value["mirror"] = True
    return dumps(value)


def notice(org: str, project: str, sender: str, receiver: str, micros: int) -> bytes:
    """The ``pair.void`` that ``sender`` sends ``receiver`` (their pair is gone)."""
    a, b = sorted((sender, receiver))
    return dumps({
        "event_id": f"{pair_id(a, b)}/void/{sender}", "event_type": VOID,
        "occurred_at": format_micros(micros), "org": org, "project": project,
        "trace_id": receiver, "trace_a": a, "trace_b": b,
    })  # fmt: skip


def on_deleted(st: _State, effects: Effects, micros: int) -> None:
    """Step 4 for a trace being deleted: every pair it knows is void, the others told."""
    for other, pair in sorted((st.pairs or {}).items()):
        if pair.void:
            continue  # the other was deleted first: it knows
        pair.void, pair.mine, pair.votes = True, True, {}
        effects.sends.append((other, notice(st.org or "", st.project or "", st.trace_id, other,
                                            micros)))  # fmt: skip
        if st.trace_id < other:
            effects.pairs.add(other)


def on_ignored(st: _State, event: EventView, effects: Effects, micros: int) -> None:
    """A pair event at a deleted trace: a mirror (this is trace_b) is answered with a notice,
    as trace_a does not know yet (step 4); anything else changes nothing."""
    view = event.pair
    if view is None or not view.mirror or event.event_type == VOID:
        return
    other = view.trace_a
    pair = _pairs(st).setdefault(other, Pair())
    pair.void, pair.mine, pair.votes = True, True, {}
    effects.sends.append((other, notice(event.org, event.project, st.trace_id, other, micros)))


def on_rejected(event: EventView, effects: Effects, micros: int) -> None:
    """A mirror dead-lettered for its org/project (trace_b is another project's): trace_a
    is told the pair is void (step 4)."""
    view = event.pair
    if view is not None and view.mirror and event.event_type != VOID:
        effects.sends.append(
            (view.trace_a, notice(event.org, event.project, view.trace_b, view.trace_a, micros))
        )


def resend(st: _State, event: EventView, raw: bytes, effects: Effects, micros: int) -> None:
    """Step 5: what ``event``, redelivered, made the trace send, sent again; the owned pairs it
    touched due again. A pair event owes only its own mirror or notice (so a repeat never
    makes the receiver repeat in turn, and no two traces answer each other forever); the
    trace's own events (its arrival settled the comparisons that waited for it, its deletion
    voided its pairs) owe everything the trace owes."""
    view = event.pair
    if view is None:
        if event.event_type in ("trace.completed", "trace.deleted"):
            _resend_all(st, effects, micros)
        return
    other = _other(st.trace_id, event)
    pair = (st.pairs or {}).get(other)
    if pair is None:
        return
    owner = st.trace_id < other
    if owner:
        effects.pairs.add(other)
    if event.event_type == VOID:
        return
    if not view.mirror:
        if not pair.void and st.deleted_at is None:
            effects.sends.append((other, mirror_of(raw, view.trace_b)))
    elif pair.void and pair.mine:
        effects.sends.append((other, notice(st.org or "", st.project or "", st.trace_id, other,
                                            micros)))  # fmt: skip


def _resend_all(st: _State, effects: Effects, micros: int) -> None:
    """Everything the trace owes the others, sent again; its pair snapshots due again."""
    for other, pair in sorted((st.pairs or {}).items()):
        owner = st.trace_id < other
        if owner:
            effects.pairs.add(other)
        if pair.void:
            if pair.mine:
                effects.sends.append((other, notice(st.org or "", st.project or "",
                                                    st.trace_id, other, micros)))  # fmt: skip
        elif owner and st.deleted_at is None:
            for labeler, vote in sorted(pair.votes.items()):
                effects.sends.append((other, _mirror_again(st, other, labeler, vote)))


def _mirror_again(st: _State, other: str, labeler: str, vote: Vote) -> bytes:
    """A vote's mirror made again from what the owner keeps of it."""
    event_id = vote.key[1]
    value: dict[str, Any] = {
        "event_id": event_id,
        "event_type": "label.uncompared" if vote.choice is None else "label.compared",
        "occurred_at": format_micros(vote.key[0]), "org": st.org, "project": st.project,
        "trace_id": other, "trace_a": st.trace_id, "trace_b": other, "mirror": True,
        "labeler": labeler,
    }  # fmt: skip
    if vote.choice is not None:
        value["choice"] = vote.choice
        optional = {"strength": vote.strength, "rubric": vote.answers,
                    "rubric_version": vote.version, "comment": vote.comment}  # fmt: skip
        value.update({k: v for k, v in optional.items() if v is not None})
    return dumps(value)


def entries(st: _State) -> list[dict[str, Any]] | None:
    """The record's ``comparisons``: every current vote of every pair that is not void, as
    this trace's outcome, by pair id then labeler; None when there is none."""
    found = []
    for other, pair in (st.pairs or {}).items():
        if pair.void:
            continue
        side_a = st.trace_id < other
        pid = pair_id(st.trace_id, other) if side_a else pair_id(other, st.trace_id)
        for labeler, vote in pair.votes.items():
            if vote.choice is not None:
                found.append({"pair_id": pid, "other": other,
                              "outcome": outcome(vote.choice, side_a), "labeler": labeler,
                              "strength": vote.strength,
                              "occurred_at": format_micros(vote.key[0])})  # fmt: skip
    if not found:
        return None
    found.sort(key=lambda e: (e["pair_id"], e["labeler"]))
    return found


def pair_snapshot(st: _State, other: str) -> tuple[str, bytes]:
    """The owner's snapshot of its pair with ``other`` (the pair's id, the value for
    ``trajectories``): the pair record followed by ``"deleted": false``, or the pair's
    erased tombstone once the pair is void or the trace deleted. A pair whose votes were
    all retracted has no votes: not ready, so the corpus writes a tombstone if it holds it."""
    pid = pair_id(st.trace_id, other)
    pair = (st.pairs or {}).get(other) or Pair(void=True)
    head = {"trace_id": pid, "org": st.org, "project": st.project,
            "reward_source": COMPARISONS}  # fmt: skip
    if pair.void or st.deleted_at is not None:
        return pid, dumps({**head, "revision": ERASED_REVISION, "deleted": True, "pair_id": pid,
                           "trace_a": st.trace_id, "trace_b": other})  # fmt: skip
    votes = []
    counts = {"a": 0, "b": 0, "tie": 0, "both_bad": 0}
    for labeler, vote in sorted(pair.votes.items()):
        if vote.choice is None:
            continue
        counts[vote.choice] += 1
        votes.append({"labeler": labeler, "choice": vote.choice, "strength": vote.strength,
                      "answers": vote.answers, "rubric_version": vote.version,
                      "comment": vote.comment,
                      "occurred_at": format_micros(vote.key[0])})  # fmt: skip
    return pid, dumps({
        **head, "revision": pair.events, "pair_id": pid, "trace_a": st.trace_id,
        "trace_b": other, "votes": votes, "wins_a": counts["a"], "wins_b": counts["b"],
        "ties": counts["tie"], "both_bad": counts["both_bad"],
        "updated_at": format_micros(pair.updated), "deleted": False,
    })  # fmt: skip


# --- in the table ---------------------------------------------------------------------------


def dump_pairs(pairs: dict[str, Pair]) -> list[Any]:
    """A state's pairs as its head keeps them: ``[other, events, updated, void, mine,
    votes]`` by other trace, each vote ``[labeler, micros, event_id, choice, strength,
    comment, answers, version]`` by labeler."""
    return [
        [other, p.events, p.updated, p.void, p.mine,
         [[who, *v.key, v.choice, v.strength, v.comment, v.answers, v.version]
          for who, v in sorted(p.votes.items())]]
        for other, p in sorted(pairs.items())
    ]  # fmt: skip


def load_pairs(items: list[Any]) -> dict[str, Pair]:
    """Inverse of :func:`dump_pairs`."""
    return {
        other: Pair({v[0]: Vote((v[1], v[2]), *v[3:]) for v in votes}, events, updated, void,
                    mine)
        for other, events, updated, void, mine, votes in items
    }  # fmt: skip
