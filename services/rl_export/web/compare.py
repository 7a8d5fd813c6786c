"""A labeler's comparison queue and claims over this instance's pair book
(docs/guides/labeling.md#6-comparisons).

The pair book (:mod:`rl_export.index.pairbook`) answers from the corpora: a project's pairs,
who compared each, the queue's orders. The few pairs the corpora do not show right yet,
*touched* ones, are decided here with the queue's rules (:mod:`rl_export.labeling.pairs`):
those with recent comparisons or retractions (the overlay's ``votes``, fed by every instance
through the labels topic) and those with known claims (the claim book, in the project's
comparison space). Claims are the trace queue's slot chains, keyed by pair id, with
``comparisons_per_pair`` places: no pair ever holds more comparisons and claims than that,
across instances (:mod:`rl_export.labeling.claims`).
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass

import orjson

from rl_export.index import labelqueries
from rl_export.index.pairbook import ProjectPairs
from rl_export.labeling.claims import SlotEntry
from rl_export.labeling.evaluations import evaluations_shown
from rl_export.labeling.pairs import Pair, compare_space, in_queue, order_key, short
from rl_export.web.api.deps import query
from rl_export.web.api.items import items
from rl_export.web.services import Services
from rl_export.web.team import Team, claim_in_rounds


@dataclass(frozen=True)
class PairCounts:
    remaining: int  # the labeler's queue
    team_remaining: int  # pairs short of their target


class CompareQueue:
    """One labeler's comparison queue in one project, for one request (see the module)."""

    def __init__(self, svc: Services, corpus_id: int, team: Team, labeler: str,
                 pairs: ProjectPairs) -> None:  # fmt: skip
        self.svc, self.corpus_id, self.team, self.labeler = svc, corpus_id, team, labeler
        self.pairs = pairs
        self.space = compare_space(team.project)
        self.fresh = svc.overlay.votes.fresh(team.org, team.project)

    @classmethod
    async def of(cls, svc: Services, corpus_id: int, team: Team, labeler: str) -> CompareQueue:
        pairs = await query(svc.pairbook.pairs, corpus_id, team.settings)
        return cls(svc, corpus_id, team, labeler, pairs)

    def voters(self, pid: str) -> frozenset[str]:
        """Who compared the pair: the corpora's view with the fresh votes applied."""
        found = set(self.pairs.voters.get(pid, ()))
        for labeler, voted in self.fresh.get(pid, {}).items():
            (found.add if voted else found.discard)(labeler)
        return frozenset(found)

    def holders(self, pid: str) -> set[str]:
        return self.svc.claim_book.holders(self.team.org, self.space, pid, self.team.now,
                                           self.voters(pid))  # fmt: skip

    def keeps(self, pid: str) -> bool:
        k = self.team.settings.comparisons_per_pair
        return in_queue(self.labeler, self.voters(pid), self.holders(pid), k)

    def counts(self) -> PairCounts:
        """The book's counts, corrected for the touched pairs."""
        k = self.team.settings.comparisons_per_pair
        remaining = self.pairs.short - self.pairs.voted_short.get(self.labeler, 0)
        team_remaining = self.pairs.short
        touched = {*self.fresh, *self.svc.claim_book.traces(self.team.org, self.space)}
        for pid in touched:
            if pid not in self.pairs.pairs:
                continue
            before = self.pairs.voters.get(pid, frozenset())
            remaining -= short(before, k) and self.labeler not in before
            team_remaining -= short(before, k)
            remaining += self.keeps(pid)
            team_remaining += short(self.voters(pid), k)
        return PairCounts(remaining, team_remaining)

    def head(self, limit: int, exclude: frozenset[str] = frozenset()) -> list[Pair]:
        """The first ``limit`` pairs of the queue, in the project's order: the book lists
        the pairs short of their target by the corpora; a touched pair it does not list (a
        fresh retraction reopened it) is merged in at its place."""
        order = self.team.settings.order
        key = order_key(order, self.labeler)
        touched = {*self.fresh, *self.svc.claim_book.traces(self.team.org, self.space)}
        known, listed = self.pairs.pairs, self.pairs.listed
        extra = sorted((known[p] for p in touched if p in known and p not in listed), key=key)
        out: list[Pair] = []
        for pair in heapq.merge(self.pairs.in_order(order, self.labeler), extra, key=key):
            if pair.pair_id not in exclude and self.keeps(pair.pair_id):
                out.append(pair)
                if len(out) >= limit:
                    break
        return out

    async def claim_one(self, pair: Pair) -> SlotEntry | None:
        settings = self.team.settings
        taken = await self.svc.claims.claim(
            self.team.org, self.space, pair.pair_id, self.labeler,
            target=settings.comparisons_per_pair, lease_s=settings.lease_s,
            labelers=self.voters(pair.pair_id),
        )  # fmt: skip
        return None if taken is None else taken.entry

    async def claim(self, limit: int) -> tuple[list[Pair], list[SlotEntry]]:
        """Up to ``limit`` pairs held by the labeler: their unexpired claims first (renewed),
        then the head of their queue. Counts claims by outcome."""
        counter = self.svc.metrics.claims
        got: list[tuple[Pair, SlotEntry]] = []
        held = self.svc.claim_book.claims_of(self.team.org, self.space, self.labeler,
                                             self.team.now)  # fmt: skip
        for entry in held:
            if len(got) >= limit:
                break
            pair = self.pairs.pairs.get(entry.trace_id)
            if pair is None:  # a trace of it deleted, or the pairing changed: let it go
                await self.svc.claims.release(self.team.org, self.space, entry.trace_id,
                                              self.labeler)  # fmt: skip
                continue
            renewed = await self.claim_one(pair)
            if renewed is not None:
                counter.labels("renewed").inc()
                got.append((pair, renewed))

        async def head(n: int, exclude: frozenset[str]) -> list[Pair]:
            return self.head(n, exclude)

        got += await claim_in_rounds(
            limit - len(got), {p.pair_id for p, _ in got}, head,
            key=lambda pair: pair.pair_id, claim_one=self.claim_one, counter=counter,
        )  # fmt: skip
        return [p for p, _ in got], [e for _, e in got]

    async def items(self, pairs: list[Pair]) -> list[bytes]:
        """``{pair_id, trace_a, trace_b, a, b}`` per pair whose traces are both live: the
        records blind (no one's comparisons, labels or counts) and redacted."""
        ids = [t for p in pairs for t in (p.trace_a, p.trace_b)]
        bodies = await query(labelqueries.bodies, self.svc.index, self.corpus_id, ids)
        shown = evaluations_shown(self.team.settings.show_evaluations, labeled=False)
        records = await items(self.svc, bodies, blinded=True, evaluations=shown)
        by_id = {orjson.loads(b)["trace_id"]: r for b, r in zip(bodies, records, strict=True)}
        out = []
        for p in pairs:
            a, b = by_id.get(p.trace_a), by_id.get(p.trace_b)
            if a is not None and b is not None:
                head = orjson.dumps({"pair_id": p.pair_id, "trace_a": p.trace_a,
                                     "trace_b": p.trace_b})[:-1]  # fmt: skip
                out.append(b'%b,"a":%b,"b":%b}' % (head, a, b))
        return out
