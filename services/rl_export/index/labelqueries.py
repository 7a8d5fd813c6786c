"""The team's queries over the query index (docs/guides/labeling.md): the head of a labeler's
queue and its counts, a trace's labels, records in the order asked, and the agreement report's
input. The rules are :mod:`rl_export.labeling`'s; this module says them in SQL over the
``traces`` corpus's rows (:mod:`rl_export.index.queryindex`), and :mod:`rl_export.web.team` corrects
the traces the corpora do not show right yet."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from rl_export.formats.filters import Filters
from rl_export.index.queryindex import BodiesGone, QueryIndex
from rl_export.index.sql import LABEL_SUM, filter_sql
from rl_export.labeling.agreement import DIMENSIONS, AgreementInput
from rl_export.labeling.queue import TraceLabels, order_terms, place, target_sql
from rl_export.labeling.settings import LabelingSettings

# A trace's labels and skips for the queue's rules: labelers, their rewards in twentieths (a
# version-0 label's rating sum; NULL for a record written before ``labels``), skips.
_LABELS_OF = (
    f"trace_id, labelers, list_transform(labels, lambda x: {{'labeler': x.labeler, "
    f"'sum': {LABEL_SUM}}}), skipped_by"
)


def _trace_labels(
    trace_id: str, labelers: list[str], sums: list[dict[str, Any]] | None, skipped: list[str]
) -> TraceLabels:
    known: dict[str, float | None] = (
        dict.fromkeys(labelers) if sums is None else {x["labeler"]: x["sum"] for x in sums}
    )
    return TraceLabels(trace_id, known, frozenset(skipped))


@dataclass(frozen=True)
class QueueFilter:
    """What a labeler's queue may be narrowed to (``passed``: the evaluator's verdict)."""

    scenario: str | None = None
    agent_version: str | None = None
    passed: bool | None = None

    def sql(self) -> tuple[str, list[Any]]:
        clauses, params = ["NOT deleted"], []
        for column, value in (("scenario", self.scenario), ("agent_version", self.agent_version),
                              ("eval_passed", self.passed)):  # fmt: skip
            if value is not None:
                clauses.append(f"{column} = ?")
                params.append(value)
        return " AND ".join(clauses), params


@dataclass(frozen=True)
class QueueAsk:
    """A labeler's queue (:mod:`rl_export.labeling.queue`): the ``touched`` traces are
    always returned (if they match ``scope``) for the caller to decide; the others are
    decided here, from the corpora's view."""

    labeler: str
    settings: LabelingSettings
    pass_threshold: float
    scope: QueueFilter = QueueFilter()
    touched: Sequence[str] = ()


@dataclass(frozen=True)
class QueueRow:
    """A trace of the scope as the index shows it: its labels and skips, its place in the
    queue's order (:func:`~rl_export.labeling.queue.place`), and the three things the
    counts add up: in the labeler's queue by the corpora's view, short of its target,
    labeled by the labeler."""

    labels: TraceLabels
    place: tuple[tuple[bool, object], ...]
    in_queue: bool
    short: bool
    own: bool
    body_at: tuple[int, int, int]  # (segment, offset, length) of its record in the index

    @property
    def trace_id(self) -> str:
        return self.labels.trace_id


# A QueueRow's columns before its order terms: _LABELS_OF's four, the three flags, the
# record's place.
_BODY_AT = "seg, off, len"
_TERMS_AT = 11


@dataclass(frozen=True)
class _QueueSql:
    """The SQL of one labeler's queue over the index's ``records``."""

    scope: str  # the scope's condition (not deleted, the request's filters)
    scope_params: list[Any]
    eligible: str  # in the labeler's queue by the corpora's view
    eligible_params: list[Any]
    flags: list[str]  # QueueRow's in_queue, short, own
    flag_params: list[Any]
    terms: list[str]  # the order's terms
    term_params: list[Any]

    @classmethod
    def of(cls, ask: QueueAsk) -> _QueueSql:
        scope, scope_params = ask.scope.sql()
        target, target_params = target_sql(ask.settings)
        eligible = (
            "(NOT list_contains(labelers, ?) AND NOT list_contains(skipped_by, ?) "
            f"AND coalesce(labels_count, 0) < {target})"
        )
        eligible_params = [ask.labeler, ask.labeler, *target_params]
        flags = [
            f"coalesce({eligible}, false)",
            _short(target),
            "coalesce(list_contains(labelers, ?), false)",
        ]
        terms, term_params = order_terms(
            ask.settings.order, labeler=ask.labeler, pass_threshold=ask.pass_threshold
        )
        return cls(scope, scope_params, eligible, eligible_params, flags,
                   [*eligible_params, *target_params, ask.labeler], terms, term_params)  # fmt: skip

    def select(self, corpus_id: int, where: str, where_params: list[Any]) -> tuple[str, list[Any]]:
        """QueueRows of the scope's traces that match ``where``."""
        return (
            f"SELECT {', '.join([_LABELS_OF, *self.flags, _BODY_AT, *self.terms])} FROM records "
            f"WHERE corpus_id = ? AND {self.scope} AND {where}",
            [*self.flag_params, *self.term_params, corpus_id, *self.scope_params, *where_params],
        )

    def key(self, *more: object) -> str:
        """What names an answer of this SQL for :meth:`QueryIndex.memo`."""
        return repr((self.scope, self.scope_params, self.flags, self.flag_params, self.terms,
                     self.term_params, *more))  # fmt: skip


def _short(target: str) -> str:
    """A trace short of its target (``target``: :func:`target_sql`'s expression)."""
    return f"coalesce(coalesce(labels_count, 0) < {target}, false)"


def _queue_row(row: tuple[Any, ...]) -> QueueRow:
    trace_id, labelers, sums, skipped, in_queue, short, own, seg, off, length, *terms = row
    return QueueRow(_trace_labels(trace_id, labelers, sums, skipped), place(terms),
                    bool(in_queue), bool(short), bool(own),
                    (int(seg), int(off), int(length)))  # fmt: skip


IN_LIST = "trace_id IN (SELECT unnest(?::VARCHAR[]))"
"""A trace among a list of ids: a hash join in DuckDB. ``list_contains(?, trace_id)`` compares
every row with every id: 2.1 to 2.6 s over 1,000,000 rows for 2,000 ids (a team's claims
are that many), against 22 to 32 ms."""

HEAD_MIN = 64
"""The fewest rows of a queue's head asked of the index (:func:`queue_head`): sizes are
powers of two from here, so a labeler's claims ask for the same few heads."""


def queue_head(index: QueryIndex, corpus_id: int, ask: QueueAsk, size: int) -> list[QueueRow]:
    """At least the first ``size`` traces of the labeler's queue by the corpora's view
    (touched or not), in its order: a scan of the corpus, kept while its rows do not change
    (:meth:`QueryIndex.memo`)."""
    size = max(HEAD_MIN, 1 << max(size - 1, 0).bit_length())
    sql = _QueueSql.of(ask)
    order = ", ".join(str(_TERMS_AT + n) for n in range(len(sql.terms)))
    text, params = sql.select(corpus_id, sql.eligible, sql.eligible_params)

    def scan() -> list[QueueRow]:
        rows = index.connection().execute(f"{text} ORDER BY {order} LIMIT ?", [*params, size])
        return [_queue_row(r) for r in rows.fetchall()]

    return index.memo(corpus_id, sql.key("head", size), scan)


def touched_rows(index: QueryIndex, corpus_id: int, ask: QueueAsk) -> list[QueueRow]:
    """The touched traces of the scope (``ask.touched``) as the index shows them."""
    if not ask.touched:
        return []
    sql = _QueueSql.of(ask)
    text, params = sql.select(corpus_id, IN_LIST, [list(ask.touched)])
    return [_queue_row(r) for r in index.connection().execute(text, params).fetchall()]


def queue_totals(index: QueryIndex, corpus_id: int, ask: QueueAsk) -> tuple[int, int, int]:
    """The sums of QueueRow's three flags over every trace of the scope, touched or not, for
    ``ask.labeler``: taken from the team's totals (:func:`team_totals`), one scan of the
    corpus for every labeler of the team, kept while its rows do not change."""
    team = team_totals(index, corpus_id, ask.scope, ask.settings)
    theirs, own = team.by_labeler.get(ask.labeler, (0, 0))
    return team.open - theirs, team.short, own


@dataclass(frozen=True)
class TeamTotals:
    """Counts over a scope's traces that every labeler's queue counts are made of."""

    short: int  # short of their target
    open: int  # of those, with labelers and skips known: in the queue of whoever is on neither
    by_labeler: dict[str, tuple[int, int]]  # (open traces they labeled or skipped, labeled)


def team_totals(
    index: QueryIndex, corpus_id: int, scope: QueueFilter, settings: LabelingSettings
) -> TeamTotals:
    """A labeler's queue holds the scope's traces short of their target that they neither
    labeled nor skipped (:class:`_QueueSql`'s ``eligible``: a trace whose labelers or skips
    are unknown, NULL, is in nobody's). So one scan gives every labeler's counts: the open
    traces, less each labeler's own among them, found by unnesting each trace's labelers
    and skips. Kept while the corpus's rows do not change (:meth:`QueryIndex.memo`), for
    the whole team: a labeler's first claim after a change does not scan again."""
    where, where_params = scope.sql()
    target, target_params = target_sql(settings)
    short = _short(target)
    rows = (
        f"SELECT labelers, {short} AS short, (labelers IS NOT NULL AND skipped_by IS NOT NULL "
        f"AND {short}) AS open, list_distinct(list_concat(coalesce(labelers, []), "
        f"coalesce(skipped_by, []))) AS touched_by FROM records WHERE corpus_id = ? AND {where}"
    )
    params = [*target_params, *target_params, corpus_id, *where_params]
    text = (
        f"WITH s AS MATERIALIZED ({rows}) "
        "SELECT NULL, count(*) FILTER (WHERE short), count(*) FILTER (WHERE open), 0 FROM s "
        "UNION ALL SELECT who, 0, count(*) FILTER (WHERE open), "
        "count(*) FILTER (WHERE list_contains(labelers, who)) "
        "FROM (SELECT unnest(touched_by) AS who, labelers, open FROM s "
        "WHERE len(touched_by) > 0) GROUP BY who"
    )

    def scan() -> TeamTotals:
        found = index.connection().execute(text, params).fetchall()
        totals = next(r for r in found if r[0] is None)
        by = {str(r[0]): (int(r[2]), int(r[3])) for r in found if r[0] is not None}
        return TeamTotals(int(totals[1]), int(totals[2]), by)

    return index.memo(corpus_id, repr(("team totals", where, where_params, target,
                                       target_params)), scan)  # fmt: skip


def merge_head(head: list[QueueRow], touched: list[QueueRow], ids: set[str]) -> list[QueueRow]:
    """The rows of the queue's head by the corpora's view (:func:`queue_head`) that are not
    touched (``ids``), and the touched traces of the scope (``touched``) whatever the
    corpora say of them, in the queue's order. Its first ``len(head) - len(ids)`` rows are
    the first of both (all of them when the head is the whole queue): ask for a head that
    long."""
    kept = [r for r in head if r.trace_id not in ids]
    return sorted([*kept, *touched], key=lambda r: r.place)


def untouched_counts(totals: tuple[int, int, int], touched: list[QueueRow]) -> tuple[int, int, int]:
    """The counts of :func:`queue_totals` without the touched traces' parts."""
    remaining, short, own = totals
    for row in touched:
        remaining -= row.in_queue
        short -= row.short
        own -= row.own
    return remaining, short, own


def trace_labels(index: QueryIndex, corpus_id: int, trace_id: str) -> TraceLabels | None:
    """A live trace's labels and skips as the corpora show them (None: not live)."""
    row = (
        index.connection()
        .execute(
            f"SELECT {_LABELS_OF} FROM records WHERE corpus_id = ? AND trace_id = ? "
            "AND NOT deleted",
            [corpus_id, trace_id],
        )
        .fetchone()
    )
    return None if row is None else _trace_labels(*row)


def bodies(index: QueryIndex, corpus_id: int, trace_ids: Sequence[str]) -> list[bytes]:
    """The records of live traces, in the order asked (traces not live left out)."""
    if not trace_ids:
        return []
    rows = (
        index.connection()
        .execute(
            "SELECT trace_id, seg, off, len FROM records WHERE corpus_id = ? AND NOT deleted "
            f"AND {IN_LIST}",
            [corpus_id, list(trace_ids)],
        )
        .fetchall()
    )
    where = {r[0]: r[1:] for r in rows}
    return index.bodies_at([where[t] for t in trace_ids if t in where])


def row_bodies(index: QueryIndex, corpus_id: int, rows: Sequence[QueueRow]) -> list[bytes]:
    """The records of queue rows, read at the places the rows name: no lookup. A row kept
    from before a merge of the index's segments names a segment that may be gone (the merge
    copied its bodies, byte for byte, to a new one): then the records are looked up again."""
    try:
        return index.bodies_at([row.body_at for row in rows])
    except (FileNotFoundError, BodiesGone):
        return bodies(index, corpus_id, [row.trace_id for row in rows])


def last_results(
    trace: npt.NDArray[np.int64], evaluator: npt.NDArray[np.int64],
    place: npt.NDArray[np.int64], evaluators: int,
) -> npt.NDArray[np.bool_]:  # fmt: skip
    """Which result rows count: of an evaluator named twice in one evaluation, the last
    (greatest ``place`` in its ``results``), as the records' ``evaluator_scores`` keep it.
    Evaluators are rarely named twice, so only the rows of repeated (trace, evaluator)
    pairs are sorted (in DuckDB, a window over every result row cost four times the rest of
    the query)."""
    key = trace * max(evaluators, 1) + evaluator
    repeated = np.bincount(key)[key] > 1 if len(key) else np.zeros(0, np.bool_)
    keep = ~repeated
    rows = np.flatnonzero(repeated)
    if len(rows):
        ordered = rows[np.lexsort((place[rows], key[rows]))]  # by pair, then place
        ends = np.ones(len(ordered), np.bool_)
        ends[:-1] = key[ordered][1:] != key[ordered][:-1]
        keep[ordered[ends]] = True
    return keep


def agreement_input(index: QueryIndex, corpus_id: int, filters: Filters) -> AgreementInput:
    """The agreement report's input over the latest records matching ``filters`` (the
    ``traces`` corpus, usually), built in DuckDB and fetched as columns: a row per current
    label and per evaluator result, a value per trace and per labeler."""
    where, params = filter_sql(filters)
    db = index.connection()
    limit = "" if filters.limit is None else f" ORDER BY seq LIMIT {int(filters.limit)}"
    matching = f"(SELECT * FROM records WHERE corpus_id = ? AND {where}{limit})"
    # Only the traces with a label or a skip enter the report's columns (numbered first;
    # the others only count): evaluator results count only on traces with a label (rho and
    # kappa are against the human reward). Every evaluator is named, numbered by name.
    # One transaction: the count, the traces and the evaluators read the same rows, whatever
    # the index ingests meanwhile; rolled back at the end, with the tables made for this.
    db.begin()
    try:
        total = db.execute(f"SELECT count(*) FROM {matching}", [corpus_id, *params]).fetchone()
        db.execute(
            "CREATE OR REPLACE TEMP TABLE agreement_traces AS SELECT "
            "row_number() OVER () - 1 AS t, labels, labels_count, skipped_by, pass_threshold, "
            f"CASE WHEN len(labels) > 0 THEN results END AS results FROM {matching} "
            "WHERE coalesce(len(labels), 0) > 0 OR coalesce(len(skipped_by), 0) > 0 "
            "OR (labels IS NULL AND coalesce(labels_count, 0) >= 1)",
            [corpus_id, *params],
        )
        db.execute(
            "CREATE OR REPLACE TEMP TABLE agreement_evaluators AS SELECT name, "
            "row_number() OVER (ORDER BY name) - 1 AS e FROM (SELECT DISTINCT "
            f"unnest(results).evaluator AS name FROM {matching})",
            [corpus_id, *params],
        )
        return _agreement_input(db, int(total[0]) if total is not None else 0)
    finally:
        db.rollback()


def _agreement_input(db: Any, traces: int) -> AgreementInput:
    """The input from ``agreement_traces``, the ``traces`` matching traces' rows with a label
    or a skip (the others are numbered after them, with nothing to add)."""
    # Labels of other rubric versions than 0 count as labels whose ratings are unknown.
    kept, unrated, unrated_multi = db.execute(
        "SELECT count(*), count(*) FILTER (WHERE (labels IS NULL AND labels_count >= 1) OR "
        "(rated = 0 AND len(labels) >= 1)), count(*) FILTER (WHERE (labels IS NULL AND "
        "labels_count >= 2) OR (rated < 2 AND len(labels) >= 2)) FROM (SELECT *, "
        "len(list_filter(labels, lambda x: x.rubric_version IS NULL)) AS rated "
        "FROM agreement_traces)"
    ).fetchone()
    # Labelers: whoever labeled or skipped, numbered in name order.
    db.execute(
        "CREATE OR REPLACE TEMP TABLE agreement_labelers AS SELECT name, "
        "row_number() OVER (ORDER BY name) - 1 AS n FROM (SELECT DISTINCT name FROM ("
        "SELECT unnest(labels).labeler AS name FROM agreement_traces UNION ALL "
        "SELECT unnest(skipped_by) FROM agreement_traces))"
    )
    names = [r[0] for r in db.execute("SELECT name FROM agreement_labelers ORDER BY n").fetchall()]
    labels = db.execute(
        "SELECT a.t, l.n, "
        + ", ".join(f"a.label.rubric.{d} AS {d}" for d in DIMENSIONS)
        + " FROM (SELECT t, unnest(labels) AS label FROM agreement_traces) a "
        "JOIN agreement_labelers l ON l.name = a.label.labeler "
        "WHERE a.label.rubric_version IS NULL ORDER BY a.t, l.n"
    ).fetchnumpy()
    skips = db.execute(
        "SELECT l.n, count(*) FROM (SELECT unnest(skipped_by) AS name FROM agreement_traces) s "
        "JOIN agreement_labelers l USING (name) GROUP BY l.n"
    ).fetchall()
    evaluators = [
        r[0] for r in db.execute("SELECT name FROM agreement_evaluators ORDER BY e").fetchall()
    ]
    results = db.execute(
        "SELECT r.t AS t, v.e AS e, r.score AS score, r.passed AS passed, r.i AS i FROM "
        "(SELECT t, unnest(results).evaluator AS evaluator, unnest(results).score AS score, "
        "unnest(results).passed AS passed, generate_subscripts(results, 1) AS i "
        "FROM agreement_traces) r JOIN agreement_evaluators v ON v.name = r.evaluator"
    ).fetchnumpy()
    last = last_results(np.asarray(results["t"], np.int64), np.asarray(results["e"], np.int64),
                        np.asarray(results["i"], np.int64), len(evaluators))  # fmt: skip
    results = {name: np.asarray(column)[last] for name, column in results.items()}
    thresholds = db.execute("SELECT pass_threshold FROM agreement_traces ORDER BY t").fetchnumpy()
    skip_counts = np.zeros(len(names), np.int64)
    for n, count in skips:
        skip_counts[int(n)] = int(count)
    ratings = (
        np.column_stack([labels[d] for d in DIMENSIONS]) if len(labels["t"]) else np.zeros((0, 4))
    )
    return AgreementInput(
        traces=int(traces),
        labelers=tuple(names),
        label_trace=np.asarray(labels["t"], np.int64),
        label_labeler=np.asarray(labels["n"], np.int64),
        ratings=np.asarray(ratings, np.int8).reshape(-1, 4),
        pass_threshold=np.concatenate(
            [  # the traces without a label: no human verdict
                np.asarray(thresholds["pass_threshold"], np.float64),
                np.full(traces - int(kept), np.nan),
            ]
        ),
        skips=skip_counts,
        evaluators=tuple(evaluators),
        result_trace=np.asarray(results["t"], np.int64),
        result_evaluator=np.asarray(results["e"], np.int64),
        result_score=np.asarray(results["score"], np.float64),
        result_passed=np.asarray(results["passed"], np.bool_),
        unrated_labeled=int(unrated),
        unrated_multi_labeled=int(unrated_multi),
    )
