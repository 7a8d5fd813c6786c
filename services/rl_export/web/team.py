"""The team's queue and claims over this instance's index (docs/guides/labeling.md).

The index answers from the corpora (SQL over the ``traces`` corpus's latest records); the few
traces the corpora do not show right yet, *touched* ones, are decided here with the queue's
rules (:mod:`rl_export.labeling.queue`): those with recent label actions (the overlay, fed by
every instance through the labels topic) and those with known claims (the claim book, fed by
the claims topic). So a label, skip or claim on any instance changes every labeler's queue
within milliseconds, not after the sink's shard age and the index's poll.

:meth:`LabelerQueue.view` is ``GET queue`` (a preview: claims nothing);
:meth:`LabelerQueue.claim` is ``POST queue/claim``: the caller's unexpired claims first
(renewed), then the head of their queue, claimed one trace at a time until ``limit`` are held.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TypeVar

from prometheus_client import Counter

from rl_export.index import labelqueries
from rl_export.index.labelqueries import QueueAsk, QueueFilter, QueueRow
from rl_export.labeling.claims import SlotEntry
from rl_export.labeling.queue import FreshAction, TraceLabels, in_queue, short, target
from rl_export.labeling.settings import LabelingSettings
from rl_export.web.api.deps import query
from rl_export.web.services import Services

CLAIM_ROUNDS = 4  # queue reads per claim request (each after every candidate was lost)
R = TypeVar("R")


async def claim_in_rounds(
    wanted: int,
    tried: set[str],
    head: Callable[[int, frozenset[str]], Awaitable[list[R]]],
    *,
    key: Callable[[R], str],
    claim_one: Callable[[R], Awaitable[SlotEntry | None]],
    counter: Counter,
) -> list[tuple[R, SlotEntry]]:
    """Claim up to ``wanted`` places from the head of a queue (traces or pairs): at most
    :data:`CLAIM_ROUNDS` reads of it, each for more than is left to claim (other labelers
    may win some first), none of ``tried`` (which grows with every candidate). Counts each
    attempt as ``granted`` or ``lost``; returns the candidates won and their claims."""
    got: list[tuple[R, SlotEntry]] = []
    for _ in range(CLAIM_ROUNDS):
        left = wanted - len(got)
        if left <= 0:
            break
        rows = await head(2 * left + 4, frozenset(tried))
        if not rows:
            break
        for row in rows:
            tried.add(key(row))
            taken = await claim_one(row)
            counter.labels("lost" if taken is None else "granted").inc()
            if taken is not None:
                got.append((row, taken))
                if len(got) >= wanted:
                    break
    return got


@dataclass(frozen=True)
class Team:
    """What one request knows of a project's team: settings, fresh actions, the clock."""

    org: str
    project: str
    settings: LabelingSettings
    fresh: dict[str, dict[str, FreshAction]]
    now: float

    def labels(self, row: TraceLabels) -> TraceLabels:
        """A trace's labels with the fresh actions applied."""
        return row.with_fresh(self.fresh.get(row.trace_id, {}))


async def team_of(svc: Services, org: str, project: str) -> Team:
    settings = await svc.labeling.get(org, project)
    return Team(org, project, settings, svc.overlay.fresh(org, project), time.time())


@dataclass(frozen=True)
class Counts:
    remaining: int  # the labeler's queue
    team_remaining: int  # traces short of their target
    labeled: int  # the labeler's current labels


@dataclass(frozen=True)
class QueueView:
    bodies: list[bytes]
    trace_ids: list[str]
    counts: Counts


@dataclass(frozen=True)
class Claimed:
    view: QueueView
    entries: list[SlotEntry]


class LabelerQueue:
    """One labeler's queue in one project, for one request (see the module).

    The index's answers over the whole corpus (the head of the queue, its counts) are kept
    between requests while the corpus does not change (:meth:`QueryIndex.memo`); what
    changes with every claim, the touched traces, is read once per request (taken from the
    head where they are in it, else one lookup of their rows) and decided here."""

    def __init__(
        self, svc: Services, corpus_id: int, team: Team, labeler: str, scope: QueueFilter
    ) -> None:
        self.svc = svc
        self.corpus_id = corpus_id
        self.team = team
        self.labeler = labeler
        self.scope = scope
        self._rows: dict[str, QueueRow] = {}  # of the scope, read in this request
        self._looked: set[str] = set()  # the ids whose rows were read (found or not)

    def _ask(self, touched: list[str] | None = None) -> QueueAsk:
        threshold = self.svc.settings.human_pass_threshold
        return QueueAsk(self.labeler, self.team.settings, threshold, self.scope, touched or ())

    def _touched(self) -> list[str]:
        team = self.team
        return sorted({*team.fresh, *self.svc.claim_book.traces(team.org, team.project)})

    async def _rows_of(self, trace_ids: list[str]) -> list[QueueRow]:
        """The rows of these traces that are in the scope, read once per request."""
        missing = [t for t in trace_ids if t not in self._looked]
        if missing:
            found = await query(labelqueries.touched_rows, self.svc.index, self.corpus_id,
                                self._ask(missing))  # fmt: skip
            self._note(found)
            self._looked.update(missing)
        return [self._rows[t] for t in trace_ids if t in self._rows]

    def _note(self, rows: list[QueueRow]) -> None:
        for row in rows:
            if row.trace_id not in self._looked:
                self._rows[row.trace_id] = row
                self._looked.add(row.trace_id)

    def _keeps(self, row: TraceLabels) -> bool:
        team = self.team
        current = team.labels(row)
        holders = self.svc.claim_book.holders(team.org, team.project, row.trace_id, team.now,
                                              current.sums.keys())  # fmt: skip
        return in_queue(self.labeler, current, holders, team.settings)

    async def counts(self) -> Counts:
        """The index's counts without the touched traces, plus those decided here."""
        touched = await self._rows_of(self._touched())
        totals = await query(labelqueries.queue_totals, self.svc.index, self.corpus_id, self._ask())
        remaining, team_remaining, labeled = labelqueries.untouched_counts(totals, touched)
        for row in touched:
            current = self.team.labels(row.labels)
            remaining += self._keeps(row.labels)
            team_remaining += short(current, self.team.settings)
            labeled += self.labeler in current.sums
        # The totals come from a team scan kept while the corpus's rows do not change, the
        # touched rows from a read of now: a line ingested between the two (the trajectories
        # topic's fresh lines arrive every 50 ms) can leave them one apart for a request.
        # Never below nothing; the next request reads both again.
        return Counts(max(remaining, 0), max(team_remaining, 0), labeled)

    async def head(self, limit: int, exclude: frozenset[str] = frozenset()) -> list[TraceLabels]:
        """The first ``limit`` traces of the queue, in its order, not in ``exclude``."""
        ids = self._touched()
        head = await query(labelqueries.queue_head, self.svc.index, self.corpus_id, self._ask(),
                           limit + len(ids) + len(exclude))  # fmt: skip
        # The head's rows are the touched traces' rows too, when they are in it (a team
        # claims from the head): only the others are looked up.
        self._note(head)
        touched = await self._rows_of(ids)
        decide = set(ids)
        kept = [
            row.labels
            for row in labelqueries.merge_head(head, touched, decide)
            if row.trace_id not in exclude
            and (row.trace_id not in decide or self._keeps(row.labels))
        ]
        return kept[:limit]

    async def view(self, limit: int) -> QueueView:
        """The head of the queue (``limit`` traces) and the counts; claims nothing."""
        picked = [row.trace_id for row in await self.head(limit)]
        bodies = await query(labelqueries.bodies, self.svc.index, self.corpus_id, picked)
        return QueueView(bodies, picked, await self.counts())

    async def _claim_one(self, row: TraceLabels) -> SlotEntry | None:
        team = self.team
        current = team.labels(row)
        taken = await self.svc.claims.claim(
            team.org, team.project, row.trace_id, self.labeler,
            target=target(team.settings, current.sums), lease_s=team.settings.lease_s,
            labelers=current.sums.keys(),
        )  # fmt: skip
        return None if taken is None else taken.entry

    async def claim(self, limit: int) -> Claimed:
        """Up to ``limit`` traces held by the labeler: their unexpired claims first
        (renewed), then the head of their queue. Counts claims by outcome."""
        svc, team, counter = self.svc, self.team, self.svc.metrics.claims
        entries: list[SlotEntry] = []
        held_claims = svc.claim_book.claims_of(team.org, team.project, self.labeler, team.now)
        in_scope = {r.trace_id: r.labels for r in await self._rows_of(
            [held.trace_id for held in held_claims[:limit]])}  # fmt: skip
        for held in held_claims:
            if len(entries) >= limit:
                break
            row = in_scope.get(held.trace_id) or await query(  # or out of the request's scope
                labelqueries.trace_labels, svc.index, self.corpus_id, held.trace_id
            )
            if row is None:  # deleted since it was claimed: let it go
                await svc.claims.release(team.org, team.project, held.trace_id, self.labeler)
                continue
            entry = await self._claim_one(row)
            if entry is not None:
                counter.labels("renewed").inc()
                entries.append(entry)
        won = await claim_in_rounds(
            limit - len(entries), {e.trace_id for e in entries}, self.head,
            key=lambda row: row.trace_id, claim_one=self._claim_one, counter=counter,
        )  # fmt: skip
        entries += [entry for _, entry in won]
        trace_ids = [e.trace_id for e in entries]
        return Claimed(QueueView(await self._bodies(trace_ids), trace_ids, await self.counts()),
                       entries)  # fmt: skip

    async def _bodies(self, trace_ids: list[str]) -> list[bytes]:
        """The traces' records: read where this request's rows say they are when it read
        them all (a claim's traces come from the head), else looked up."""
        rows = [self._rows[t] for t in trace_ids if t in self._rows]
        if len(rows) == len(trace_ids):
            return await query(labelqueries.row_bodies, self.svc.index, self.corpus_id, rows)
        return await query(labelqueries.bodies, self.svc.index, self.corpus_id, trace_ids)
