"""The comparison queue's read model: what each live trace of the ``traces`` corpus brings to
pairs (its prompt key, version, evaluator reward, the comparisons its record lists), kept in
memory beside the query index and brought up to date from it
(docs/guides/labeling.md#6-comparisons).

The index's columns say which traces changed (their ``revision``) but not their prompt nor
their ``comparisons``: those are in the bodies. So :class:`PairBook` keeps, per corpus, the
facts of each live trace at the revision it read (:class:`TraceFacts`), and on each change of
the corpus (:meth:`QueryIndex.changes`) reads one column scan and the bodies of the traces
whose revision moved, only: a label or a comparison re-reads one body, not the corpus.

From the facts and a project's settings, :meth:`PairBook.pairs` makes the project's pairs
(:func:`rl_export.labeling.pairs.pairs_of`), their current comparisons (who voted, from
``trace_a``'s record: the record of ``trace_b`` mirrors it) and the queue's orders, kept while
the corpus does not change (:meth:`QueryIndex.memo`). :meth:`PairBook.ratings_input` hands
the ratings (:mod:`rl_export.labeling.ratings`) the votes of the traces that match filters.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import orjson

from rl_export.formats.filters import Filters
from rl_export.index.queryindex import QueryIndex
from rl_export.index.sql import filter_sql
from rl_export.labeling.pairs import Pair, PairTrace, order_key, pairs_of, prompt_key, short
from rl_export.labeling.ratings import RatingsBuilder, RatingsInput
from rl_export.labeling.settings import LabelingSettings, Order

BODIES_PER_READ = 2048  # bodies read at once when facts are brought up to date


@dataclass(frozen=True, slots=True)
class TraceFacts:
    """A live trace as pairing needs it, at ``revision``. ``comparisons``: its record's
    entries where it is ``trace_a`` (``(pair_id, other, labeler, outcome)``)."""

    revision: int
    prompt: str | None
    scenario: str | None
    agent_version: str | None
    eval_reward: float | None
    completed_us: int
    comparisons: tuple[tuple[str, str, str, str], ...]


def facts_of(body: bytes, revision: int, eval_reward: float | None,
             completed_us: int) -> TraceFacts:  # fmt: skip
    """A record's facts (its body parsed once)."""
    record = orjson.loads(body)
    trace_id = record.get("trace_id")
    entries = []
    for entry in record.get("comparisons") or ():
        if not isinstance(entry, dict):
            continue
        values = (entry.get("pair_id"), entry.get("other"), entry.get("labeler"),
                  entry.get("outcome"))  # fmt: skip
        if all(isinstance(v, str) for v in values) and str(trace_id) < str(values[1]):
            entries.append((str(values[0]), str(values[1]), str(values[2]), str(values[3])))
    scenario, version = record.get("scenario"), record.get("agent_version")
    return TraceFacts(
        revision, prompt_key(record.get("messages")),
        scenario if isinstance(scenario, str) else None,
        version if isinstance(version, str) else None, eval_reward, completed_us,
        tuple(entries),
    )  # fmt: skip


@dataclass(frozen=True)
class ProjectPairs:
    """A project's pairs under one settings' pairing, with what the queue needs of them."""

    pairs: dict[str, Pair]  # by pair id
    voters: dict[str, frozenset[str]]  # pair id -> labelers with a current comparison
    ordered: dict[str, list[Pair]]  # order name -> the pairs in that order (not ``random``)
    short: int  # pairs whose comparisons are fewer than their target
    voted_short: dict[str, int]  # labeler -> short pairs they compared

    def in_order(self, order: Order, labeler: str) -> list[Pair]:
        found = self.ordered.get(order)
        if found is None:  # random: a shuffle per labeler, sorted on demand
            return sorted(self.pairs.values(), key=order_key(order, labeler))
        return found


@dataclass
class _Corpus:
    facts: dict[str, TraceFacts] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)


class PairBook:
    """Every followed ``traces`` corpus's trace facts (see the module)."""

    def __init__(self, index: QueryIndex, partners: int) -> None:
        self.index = index
        self.partners = partners
        self._corpora: dict[int, _Corpus] = {}
        self._lock = threading.Lock()

    def _corpus(self, corpus_id: int) -> _Corpus:
        with self._lock:
            return self._corpora.setdefault(corpus_id, _Corpus())

    def facts(self, corpus_id: int) -> dict[str, TraceFacts]:
        """The corpus's live traces' facts, brought up to date once per change of its rows."""
        return self.index.memo(corpus_id, "pair facts", lambda: self._refresh(corpus_id))

    def _refresh(self, corpus_id: int) -> dict[str, TraceFacts]:
        kept = self._corpus(corpus_id)
        rows = (
            self.index.connection()
            .execute(
                "SELECT trace_id, revision, seg, off, len, eval_reward, "
                "coalesce(completed_us, 0) FROM records WHERE corpus_id = ? AND NOT deleted",
                [corpus_id],
            )
            .fetchall()
        )
        with kept.lock:
            old = kept.facts
            facts: dict[str, TraceFacts] = {}
            stale = []
            for trace_id, revision, seg, off, length, reward, completed in rows:
                known = old.get(trace_id)
                if known is not None and known.revision == revision:
                    facts[trace_id] = known
                else:
                    stale.append((trace_id, revision, (seg, off, length), reward, completed))
            for start in range(0, len(stale), BODIES_PER_READ):
                chunk = stale[start : start + BODIES_PER_READ]
                bodies = self.index.bodies_at([place for _, _, place, _, _ in chunk])
                for row, body in zip(chunk, bodies, strict=True):
                    trace_id, revision, _, reward, completed = row
                    facts[trace_id] = facts_of(body, int(revision or 0), reward, int(completed))
            kept.facts = facts
            return facts

    def pairs(self, corpus_id: int, settings: LabelingSettings) -> ProjectPairs:
        """The project's pairs, their voters and orders (kept while the corpus holds)."""
        key = repr(("pairs", settings.pair_on, settings.pair_versions,
                    settings.comparisons_per_pair, self.partners))  # fmt: skip
        return self.index.memo(corpus_id, key, lambda: self._pairs(corpus_id, settings))

    def _pairs(self, corpus_id: int, settings: LabelingSettings) -> ProjectPairs:
        facts = self.facts(corpus_id)
        traces = []
        for trace_id, f in facts.items():
            found = f.prompt if settings.pair_on == "prompt" else f.scenario
            if found is not None:
                traces.append(PairTrace(trace_id, found, f.agent_version, f.eval_reward,
                                        f.completed_us))  # fmt: skip
        pairs = {p.pair_id: p for p in pairs_of(traces, settings, self.partners)}
        voters = _voters(facts)
        k = settings.comparisons_per_pair
        short_count = 0
        voted_short: dict[str, int] = {}
        for pid in pairs:
            who = voters.get(pid, frozenset())
            if short(who, k):
                short_count += 1
                for labeler in who:
                    voted_short[labeler] = voted_short.get(labeler, 0) + 1
        listed = list(pairs.values())
        ordered = {
            order: sorted(listed, key=order_key(order, ""))
            for order in ("oldest", "newest", "uncertain")
        }
        return ProjectPairs(pairs, voters, ordered, short_count, voted_short)

    def voters(self, corpus_id: int) -> dict[str, frozenset[str]]:
        """Who compared each pair (any pairing), by pair id."""
        return self.index.memo(corpus_id, "pair voters", lambda: _voters(self.facts(corpus_id)))

    def ratings_input(self, corpus_id: int, filters: Filters) -> RatingsInput:
        """The ratings' input over the live traces matching ``filters``."""
        facts = self.facts(corpus_id)
        where, params = filter_sql(filters)
        limit = "" if filters.limit is None else f" ORDER BY seq LIMIT {int(filters.limit)}"
        sql = f"SELECT trace_id FROM records WHERE corpus_id = ? AND {where}{limit}"
        rows = self.index.connection().execute(sql, [corpus_id, *params]).fetchall()
        builder = RatingsBuilder()
        for (trace_id,) in rows:
            f = facts.get(trace_id)
            if f is not None:
                builder.add(_record(trace_id, f))
        return builder.build()


def _voters(facts: Mapping[str, TraceFacts]) -> dict[str, frozenset[str]]:
    found: dict[str, set[str]] = {}
    for f in facts.values():
        for pid, _, labeler, _ in f.comparisons:
            found.setdefault(pid, set()).add(labeler)
    return {pid: frozenset(who) for pid, who in found.items()}


def _record(trace_id: str, f: TraceFacts) -> dict[str, Any]:
    """The fields of a record :class:`RatingsBuilder` reads, from its facts."""
    return {
        "trace_id": trace_id,
        "agent_version": f.agent_version,
        "comparisons": [
            {"pair_id": pid, "other": other, "labeler": labeler, "outcome": outcome}
            for pid, other, labeler, outcome in f.comparisons
        ],
    }
