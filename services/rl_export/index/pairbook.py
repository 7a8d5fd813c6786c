"""The comparison queue's read model: what each live trace of the ``traces`` corpus brings to
pairs (its prompt key, version, evaluator reward, the comparisons its record lists), kept in
memory beside the query index and brought up to date from it
(docs/guides/labeling.md#6-comparisons).

The index's columns say which traces changed but not their prompt nor their ``comparisons``:
those are in the bodies. So :class:`PairBook` keeps, per corpus, the facts of each live trace
(:class:`TraceFacts`) and follows the index's rows by ``seq`` (the order lines were read: a
row that replaces another is read later, so has a greater one). On each change of the corpus
(:meth:`QueryIndex.changes`) it reads the rows past the last ``seq`` it saw and the bodies of
those whose revision moved, only: a label or a comparison re-reads one body, not the corpus.
(Should the live rows ever number other than the facts, after the index read a corpus again,
it reads everything again.)

Per project settings (``pair_on``, ``pair_versions``, ``comparisons_per_pair``) a
:class:`_PairView` keeps the pairs (:func:`rl_export.labeling.pairs.pairs_of`, group by group),
who compared each (from ``trace_a``'s record: ``trace_b``'s mirrors it), the queue's orders
(sorted lists) and counts, and applies the changed traces to the groups they leave and join,
only. :meth:`PairBook.pairs` hands out an immutable :class:`ProjectPairs` per change of the
corpus, the latest one kept (they are large: not in the index's memo, which keeps
hundreds). :meth:`PairBook.ratings_input` gives the ratings
(:mod:`rl_export.labeling.ratings`) the votes of the traces that match filters.
"""

from __future__ import annotations

import bisect
import threading
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar, cast

import orjson

from rl_export.formats.filters import Filters
from rl_export.index.queryindex import QueryIndex
from rl_export.index.sql import filter_sql
from rl_export.labeling.pairs import Pair, PairTrace, order_key, pairs_of, prompt_key, short
from rl_export.labeling.ratings import RatingsBuilder, RatingsInput
from rl_export.labeling.settings import LabelingSettings, Order
from rl_export.model.pairs import pair_id

BODIES_PER_READ = 2048  # bodies read at once when facts are brought up to date
CHANGE_LOG = 64  # refreshes whose changed traces are kept for the views to catch up with
REORDER_AFTER = 2048  # pairs in and out of a view at once past which its orders are re-sorted
ORDERS: tuple[Order, ...] = ("oldest", "newest", "uncertain")  # kept sorted (``random``: per
# labeler, sorted on demand)

T = TypeVar("T")
Entry = tuple[str, str, str, str]  # (pair_id, other, labeler, outcome) of trace_a's record


@dataclass(frozen=True, slots=True)
class TraceFacts:
    """A live trace as pairing needs it, at ``revision``. ``comparisons``: its record's
    entries where it is ``trace_a``."""

    revision: int
    prompt: str | None
    scenario: str | None
    agent_version: str | None
    eval_reward: float | None
    completed_us: int
    comparisons: tuple[Entry, ...]


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
        if not all(isinstance(v, str) for v in values) or not str(trace_id) < str(values[1]):
            continue  # trace_b's entries mirror trace_a's
        if values[0] != pair_id(str(trace_id), str(values[1])):
            continue  # not the pair it names: a pair's votes are its trace_a's entries only
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
    ordered: dict[str, list[Pair]]  # order name -> the pairs short of their target, in that
    # order (not ``random``)
    short: int  # pairs whose comparisons are fewer than their target
    voted_short: dict[str, int]  # labeler -> short pairs they compared
    listed: frozenset[str] = frozenset()  # the pair ids in ``ordered``: short of their target

    def in_order(self, order: Order, labeler: str) -> list[Pair]:
        """The pairs short of their target (the only ones a queue may hold), in ``order``."""
        found = self.ordered.get(order)
        if found is None:  # random: a shuffle per labeler, sorted on demand
            return sorted(self.ordered["oldest"], key=order_key(order, labeler))
        return found


class _PairView:
    """One pairing's pairs, kept up to date group by group (see the module)."""

    def __init__(self, settings: LabelingSettings, partners: int) -> None:
        self.settings, self.partners = settings, partners
        self.generation = -1  # of the corpus's facts it reflects (-1: none yet)
        self.group_of: dict[str, str] = {}  # trace id -> its group's key
        self.groups: dict[str, dict[str, PairTrace]] = {}
        self.group_pairs: dict[str, list[Pair]] = {}
        self.pairs: dict[str, Pair] = {}
        # The pairs short of their target, in each order: a pair compared k times is in nobody's
        # queue, so a queue's head never walks past the many done ones.
        self.sorted: dict[Order, list[tuple[Any, str]]] = {o: [] for o in ORDERS}
        self.listed: set[str] = set()  # the pair ids in ``sorted``
        self.short = 0
        self.voted_short: dict[str, int] = {}

    def _key(self, f: TraceFacts) -> str | None:
        return f.prompt if self.settings.pair_on == "prompt" else f.scenario

    def _count(self, voters: frozenset[str], sign: int) -> None:
        if short(voters, self.settings.comparisons_per_pair):
            self.short += sign
            for labeler in voters:
                self.voted_short[labeler] = self.voted_short.get(labeler, 0) + sign

    def _place(self, gone: list[Pair], made: list[Pair]) -> None:
        """Take ``gone`` out of the sorted orders and put ``made`` in: one by one when they
        are few, else by sorting again (a large group changed)."""
        gone = [p for p in gone if p.pair_id in self.listed]
        self.listed.difference_update(p.pair_id for p in gone)
        self.listed.update(p.pair_id for p in made)
        if len(gone) + len(made) > REORDER_AFTER:
            for order in ORDERS:
                key = order_key(order, "")
                self.sorted[order] = sorted((key(self.pairs[pid]), pid) for pid in self.listed)
            return
        for order in ORDERS:
            key, entries = order_key(order, ""), self.sorted[order]
            for pair in gone:
                del entries[bisect.bisect_left(entries, (key(pair), pair.pair_id))]
            for pair in made:
                bisect.insort(entries, (key(pair), pair.pair_id))

    def apply(self, facts: Mapping[str, TraceFacts], changed: Iterable[str],
              voters: Mapping[str, frozenset[str]],
              counted: Mapping[str, frozenset[str]]) -> None:  # fmt: skip
        """Bring the view to ``facts`` and ``voters``: ``changed`` are the traces that moved
        since the view's generation, ``counted`` the voters the view counted of the pairs
        whose voters moved since."""
        touched: set[str] = set()
        for trace_id in changed:
            before = self.group_of.pop(trace_id, None)
            if before is not None:
                self.groups[before].pop(trace_id, None)
                touched.add(before)
            f = facts.get(trace_id)
            key = None if f is None else self._key(f)
            if f is not None and key is not None:
                self.group_of[trace_id] = key
                self.groups.setdefault(key, {})[trace_id] = PairTrace(
                    trace_id, key, f.agent_version, f.eval_reward, f.completed_us
                )
                touched.add(key)
        # A pair's voters move only with its trace_a's record, whose group is then made again
        # below: its pairs' counts are taken out as ``counted`` says and put in as now.
        gone: list[Pair] = []
        made: list[Pair] = []
        for key in touched:
            for pair in self.group_pairs.pop(key, ()):
                del self.pairs[pair.pair_id]
                self._count(counted.get(pair.pair_id, voters.get(pair.pair_id, frozenset())), -1)
                gone.append(pair)
            members = self.groups.get(key, {})
            if len(members) < 2:  # most traces: a prompt of their own, no pair
                if not members:
                    self.groups.pop(key, None)
                continue
            fresh = pairs_of(members.values(), self.settings, self.partners)
            self.group_pairs[key] = fresh
            k = self.settings.comparisons_per_pair
            for pair in fresh:
                self.pairs[pair.pair_id] = pair
                now = voters.get(pair.pair_id, frozenset())
                self._count(now, 1)
                if short(now, k):
                    made.append(pair)
        self._place(gone, made)

    def snapshot(self, voters: Mapping[str, frozenset[str]]) -> ProjectPairs:
        ordered: dict[str, list[Pair]] = {
            o: [self.pairs[pid] for _, pid in self.sorted[o]] for o in ORDERS
        }
        mine = {pid: voters[pid] for pid in self.pairs if pid in voters}
        return ProjectPairs(dict(self.pairs), mine, ordered, self.short,
                            dict(self.voted_short), frozenset(self.listed))  # fmt: skip


@dataclass
class _Corpus:
    facts: dict[str, TraceFacts] = field(default_factory=dict)
    last_seq: int = -1
    generation: int = 0
    log: list[tuple[int, frozenset[str], dict[str, frozenset[str]]]] = field(default_factory=list)
    voters: dict[str, frozenset[str]] = field(default_factory=dict)
    traces_of: dict[str, tuple[str, str]] = field(default_factory=dict)  # pair -> (a, b)
    views: dict[str, _PairView] = field(default_factory=dict)
    answers: dict[str, tuple[int, Any]] = field(default_factory=dict)  # key -> (changes, it)
    lock: threading.Lock = field(default_factory=threading.Lock)


class PairBook:
    """Every followed ``traces`` corpus's trace facts and pairings (see the module)."""

    def __init__(self, index: QueryIndex, partners: int) -> None:
        self.index = index
        self.partners = partners
        self._corpora: dict[int, _Corpus] = {}
        self._lock = threading.Lock()

    def _corpus(self, corpus_id: int) -> _Corpus:
        with self._lock:
            return self._corpora.setdefault(corpus_id, _Corpus())

    def _latest(self, corpus_id: int, key: str, compute: Callable[[_Corpus], T]) -> T:
        """``compute`` over the corpus brought up to date, kept while its rows do not change:
        only the latest answer per key (they are large: the index's memo keeps hundreds of
        answers, one per change, until they age out)."""
        changes = self.index.changes(corpus_id)  # read first: never keep an older answer newer
        kept = self._corpus(corpus_id)
        with kept.lock:
            found = kept.answers.get(key)
            if found is not None and found[0] == changes:
                return cast(T, found[1])
            self._refresh(corpus_id, kept)
            value = compute(kept)
            kept.answers[key] = (changes, value)
            return value

    def facts(self, corpus_id: int) -> dict[str, TraceFacts]:
        """The corpus's live traces' facts (a copy: for tests and benchmarks)."""
        kept = self._corpus(corpus_id)
        with kept.lock:
            self._refresh(corpus_id, kept)
            return dict(kept.facts)

    def _refresh(self, corpus_id: int, kept: _Corpus) -> None:
        """Read the rows past ``last_seq`` (everything when the live count disagrees)."""
        db = self.index.connection()
        live = db.execute("SELECT count(*) FROM records WHERE corpus_id = ? AND NOT deleted",
                          [corpus_id]).fetchone()  # fmt: skip
        rows = db.execute(
            "SELECT trace_id, revision, deleted, seg, off, len, eval_reward, "
            "coalesce(completed_us, 0), seq FROM records WHERE corpus_id = ? AND seq > ?",
            [corpus_id, kept.last_seq],
        ).fetchall()
        seen = sum(1 for r in rows if r[0] in kept.facts)
        kept_live = len(kept.facts) - seen + sum(1 for r in rows if not r[2])
        if live is not None and kept_live != live[0] and kept.last_seq >= 0:
            kept.facts, kept.last_seq, kept.views, kept.answers = {}, -1, {}, {}  # read again
            kept.voters, kept.traces_of, kept.log = {}, {}, []
            self._refresh(corpus_id, kept)
            return
        stale = []
        changed: set[str] = set()
        for trace_id, revision, deleted, seg, off, length, reward, completed, seq in rows:
            kept.last_seq = max(kept.last_seq, int(seq))
            known = kept.facts.get(trace_id)
            if deleted:
                if known is not None:
                    changed.add(trace_id)
                continue
            if known is None or known.revision != revision:
                stale.append((trace_id, int(revision or 0), (seg, off, length), reward,
                              int(completed)))  # fmt: skip
        new: dict[str, TraceFacts | None] = dict.fromkeys(changed)
        for start in range(0, len(stale), BODIES_PER_READ):
            chunk = stale[start : start + BODIES_PER_READ]
            bodies = self.index.bodies_at([place for _, _, place, _, _ in chunk])
            for (trace_id, revision, _, reward, completed), body in zip(chunk, bodies,
                                                                        strict=True):  # fmt: skip
                new[trace_id] = facts_of(body, revision, reward, completed)
        if new:
            self._apply(kept, new)

    @staticmethod
    def _apply(kept: _Corpus, new: Mapping[str, TraceFacts | None]) -> None:
        """Take the new facts (None: the trace is gone), the voters of the pairs they name."""
        old_voters: dict[str, frozenset[str]] = {}
        for trace_id, f in new.items():
            before = kept.facts.pop(trace_id, None)
            named = {e[0] for e in before.comparisons} if before else set()
            if f is not None:
                kept.facts[trace_id] = f
                named |= {e[0] for e in f.comparisons}
            for pid in named:
                old_voters.setdefault(pid, kept.voters.get(pid, frozenset()))
            for entry in before.comparisons if before else ():
                kept.voters.pop(entry[0], None)
            for pid, other, labeler, _ in f.comparisons if f else ():
                kept.voters[pid] = kept.voters.get(pid, frozenset()) | {labeler}
                kept.traces_of[pid] = (trace_id, other)
        kept.generation += 1
        kept.log.append((kept.generation, frozenset(new), old_voters))
        del kept.log[:-CHANGE_LOG]

    def pairs(self, corpus_id: int, settings: LabelingSettings) -> ProjectPairs:
        """The project's pairs, their voters and orders (one snapshot per change)."""
        key = repr(("pairs", settings.pair_on, settings.pair_versions,
                    settings.comparisons_per_pair, self.partners))  # fmt: skip
        return self._latest(corpus_id, key, lambda kept: self._pairs(kept, settings, key))

    def _pairs(self, kept: _Corpus, settings: LabelingSettings, key: str) -> ProjectPairs:
        """The pairing's view brought to the corpus's facts (under its lock: _latest)."""
        view = kept.views.get(key)
        since = [entry for entry in kept.log if view and entry[0] > view.generation]
        caught = view is not None and (not since or since[0][0] == view.generation + 1)
        if view is None or not caught:
            view = kept.views[key] = _PairView(settings, self.partners)
            view.apply(kept.facts, list(kept.facts), kept.voters, {})
        elif since:
            changed: set[str] = set()
            counted: dict[str, frozenset[str]] = {}
            for _, traces, old_voters in since:  # the earliest is what the view counted
                changed |= traces
                for pid, was in old_voters.items():
                    counted.setdefault(pid, was)
            view.apply(kept.facts, changed, kept.voters, counted)
        view.generation = kept.generation
        return view.snapshot(kept.voters)

    def voters(self, corpus_id: int) -> dict[str, frozenset[str]]:
        """Who compared each pair (any pairing), by pair id."""
        return self._latest(corpus_id, "voters", lambda kept: dict(kept.voters))

    def pair_traces(self, corpus_id: int, pair_id: str) -> tuple[str, str] | None:
        """The traces of a pair some live record lists a comparison of."""
        kept = self._corpus(corpus_id)
        with kept.lock:
            self._refresh(corpus_id, kept)
            return kept.traces_of.get(pair_id) if pair_id in kept.voters else None

    def ratings_input(self, corpus_id: int, filters: Filters) -> RatingsInput:
        """The ratings' input over the live traces matching ``filters``: the traces with
        comparisons and their others (a pair counts when both match)."""
        matching: set[str] | None = None
        if filters != Filters():
            where, params = filter_sql(filters)
            limit = "" if filters.limit is None else f" ORDER BY seq LIMIT {int(filters.limit)}"
            sql = f"SELECT trace_id FROM records WHERE corpus_id = ? AND {where}{limit}"
            rows = self.index.connection().execute(sql, [corpus_id, *params]).fetchall()
            matching = {r[0] for r in rows}
        kept = self._corpus(corpus_id)
        with kept.lock:
            self._refresh(corpus_id, kept)
            return _ratings_input(kept.facts, matching)


def _ratings_input(facts: Mapping[str, TraceFacts], matching: set[str] | None) -> RatingsInput:
    """The traces with comparisons that match, and their others that match."""
    builder = RatingsBuilder()
    others: set[str] = set()
    for trace_id, f in facts.items():
        if f.comparisons and (matching is None or trace_id in matching):
            builder.add(_record(trace_id, f))
            others.update(e[1] for e in f.comparisons)
    for trace_id in others:
        other = facts.get(trace_id)
        if other is None or other.comparisons:  # gone, or added above if it matches
            continue
        if matching is None or trace_id in matching:
            builder.add(_record(trace_id, other))
    return builder.build()


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
