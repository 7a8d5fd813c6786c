"""Read-your-writes for the Label queue: what labelers did that the corpora may not show yet.

A label travels broker -> join -> sink -> corpus -> index before the queue can see it: seconds
(the sink's shard age bound) plus the index's poll. So the web service remembers, per
(org, project, labeler, trace), the latest label action it knows of, and the queue query hides
traces labeled or skipped since and brings back those whose label was retracted since.

Two sources feed it: the instance that published an event notes it at once (before it answers
202), and every instance reads the labels topic (a :class:`~rl_export.web.tailing.Tail` that
calls :func:`note_label_event`), so a labeler whose
next request lands on another instance behind a load balancer sees the same queue within that
instance's consumer lag (milliseconds), not the corpora's. An entry is dropped after
``web_overlay_ttl_s``: by then the corpora hold the event (or the worker is down, and the
queue shows what the corpora say). Pure but for the clock; the tail is the I/O.

Comparisons the same way (:class:`FreshVotes`, the overlay's ``votes``): per pair, each
labeler's latest comparison or retraction of a comparison, for the comparison queue.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from pydantic import ValidationError

from rl_export.labeling.queue import FreshAction
from rl_export.model.events import (
    EVENT_ADAPTER,
    LabelCompared,
    LabelRetracted,
    LabelSkipped,
    LabelSubmitted,
    LabelUncompared,
)
from rl_export.model.pairs import pair_id


@dataclass
class Known:
    """What is known of a labeler's actions on one trace: the latest label or retraction
    (the join's "latest": ``occurred_at`` then ``event_id``) and whether they skipped it
    (skips are for good)."""

    label: tuple[tuple[datetime, str], bool] | None = None  # (order, True: label, False: retract)
    skipped: bool = False
    noted_at: float = 0.0  # monotonic, of the latest note
    ratings_sum: int | None = None  # of the latest label (for the team's adjudication)


class FreshVotes:
    """Per pair, each labeler's latest comparison (True) or retraction of one (False) that
    the corpora may not show yet, for one TTL."""

    def __init__(self, ttl_s: float, clock: Callable[[], float]) -> None:
        self.ttl_s = ttl_s
        self.clock = clock
        # (org, project) -> pair id -> labeler -> (order, voted, noted at)
        self._known: dict[tuple[str, str], dict[str, dict[str, tuple[tuple[datetime, str], bool,
                                                                      float]]]] = {}  # fmt: skip
        self._traces: dict[str, tuple[str, str]] = {}  # pair id -> (trace_a, trace_b)

    def note(self, event: LabelCompared | LabelUncompared) -> None:
        pid, voted = pair_id(event.trace_a, event.trace_b), isinstance(event, LabelCompared)
        if voted:
            self._traces[pid] = (event.trace_a, event.trace_b)
        per_pair = self._known.setdefault((event.org, event.project), {}).setdefault(pid, {})
        known = per_pair.get(event.labeler)
        order = event.order_key()
        if known is None or order > known[0]:
            per_pair[event.labeler] = (order, voted, self.clock())

    def fresh(self, org: str, project: str) -> dict[str, dict[str, bool]]:
        """pair id -> labeler -> voted (True) or retracted (False), within the TTL."""
        pairs = self._known.get((org, project), {})
        now = self.clock()
        out: dict[str, dict[str, bool]] = {}
        for pid in list(pairs):
            kept = {who: v for who, v in pairs[pid].items() if now - v[2] <= self.ttl_s}
            if not kept:
                del pairs[pid]
                continue
            pairs[pid] = kept
            out[pid] = {who: v[1] for who, v in kept.items()}
        return out

    def traces(self, pid: str) -> tuple[str, str] | None:
        """The traces of a pair a fresh comparison named (None: none known)."""
        return self._traces.get(pid)

    def expire(self) -> None:
        for key in list(self._known):
            self.fresh(*key)
            if not self._known[key]:
                del self._known[key]
        live = {pid for pairs in self._known.values() for pid in pairs}
        self._traces = {pid: t for pid, t in self._traces.items() if pid in live}


class Overlay:
    """Per labeler, their recent label actions by trace (see the module)."""

    def __init__(self, ttl_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.ttl_s = ttl_s
        self.clock = clock
        self._known: dict[tuple[str, str, str], dict[str, Known]] = {}
        self.votes = FreshVotes(ttl_s, clock)

    def note(
        self,
        event: LabelSubmitted | LabelSkipped | LabelRetracted | LabelCompared | LabelUncompared,
    ) -> None:
        """Remember a label event (a repeated or older one changes nothing)."""
        if isinstance(event, LabelCompared | LabelUncompared):
            if not event.mirror:  # the join's copy for trace_b's partition: the same vote
                self.votes.note(event)
            return
        if isinstance(event, LabelSubmitted) and event.adjudication:
            return  # a reviewer's decision: no label of theirs, no place in anyone's queue
        per_trace = self._known.setdefault((event.org, event.project, event.labeler), {})
        known = per_trace.setdefault(event.trace_id, Known())
        known.noted_at = self.clock()
        if isinstance(event, LabelSkipped):
            known.skipped = True
            return
        order = event.order_key()
        if known.label is None or order > known.label[0]:
            known.label = (order, isinstance(event, LabelSubmitted))
            if isinstance(event, LabelSubmitted):
                known.ratings_sum = event.rating_sum()

    def fresh(self, org: str, project: str) -> dict[str, dict[str, FreshAction]]:
        """Every labeler's recent actions in a project, by trace then labeler: what the team's
        queue corrects the corpora with."""
        found: dict[str, dict[str, FreshAction]] = {}
        for (key_org, key_project, labeler), per_trace in self._known.items():
            if (key_org, key_project) != (org, project):
                continue
            self._drop_old(per_trace)
            for trace_id, known in per_trace.items():
                label = None if known.label is None else known.label[1]
                found.setdefault(trace_id, {})[labeler] = FreshAction(
                    label=label, sum=known.ratings_sum if label else None, skipped=known.skipped
                )
        return found

    def ask(self, org: str, project: str, labeler: str) -> tuple[list[str], list[str]]:
        """(hidden, returned) trace ids for the labeler's queue: labeled or skipped since,
        and label retracted since (the query keeps out what the corpus says was skipped)."""
        per_trace = self._known.get((org, project, labeler))
        if not per_trace:
            return [], []
        self._drop_old(per_trace)
        hidden, returned = [], []
        for trace_id, known in per_trace.items():
            labeled = known.label is not None and known.label[1]
            if known.skipped or labeled:
                hidden.append(trace_id)
            elif known.label is not None:
                returned.append(trace_id)
        return hidden, returned

    def _drop_old(self, per_trace: dict[str, Known]) -> None:
        now = self.clock()
        for trace_id in [t for t, k in per_trace.items() if now - k.noted_at > self.ttl_s]:
            del per_trace[trace_id]

    def expire(self) -> None:
        """Drop every entry older than the TTL (called now and then)."""
        self.votes.expire()
        for key in list(self._known):
            self._drop_old(self._known[key])
            if not self._known[key]:
                del self._known[key]


def note_label_event(overlay: Overlay, value: bytes | None) -> None:
    """Note a value of the labels topic in the overlay (anything else on it is ignored)."""
    if value is None:
        return
    try:
        event: Any = EVENT_ADAPTER.validate_json(value)
    except ValidationError:
        return  # the worker dead-letters it; nothing for the queue
    if isinstance(  # not pair.void: the join's notice between a pair's traces
        event, LabelSubmitted | LabelSkipped | LabelRetracted | LabelCompared | LabelUncompared
    ):
        overlay.note(event)
