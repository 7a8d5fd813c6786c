"""A labeler's workspace and the review queue over the query index (docs/guides/rubrics.md).

* :func:`my_labels`: the caller's current labels (and adjudications) newest first, searched by
  trace id, scenario and comment (case-insensitive), a page at a time after a cursor.
* :func:`review_head` / :func:`review_count`: the traces whose labels disagree, oldest first
  (the rules: :class:`rl_export.labeling.review.ReviewScope`).

Both read the ``traces`` corpus's rows; their answers are kept while its rows do not change
(:meth:`QueryIndex.memo`).
"""

from __future__ import annotations

from dataclasses import dataclass

from rl_export.formats.filters import Filters
from rl_export.index.queryindex import QueryIndex
from rl_export.index.sql import filter_sql
from rl_export.labeling.review import ReviewScope

_REWARD = (
    "coalesce(l.reward, (l.rubric.correctness + l.rubric.helpfulness + l.rubric.efficiency "
    "+ l.rubric.safety) / 20.0)"
)  # a version-0 label's reward is its ratings' sum / 20


@dataclass(frozen=True)
class MyLabel:
    """One of a labeler's current labels, as the index shows it."""

    trace_id: str
    scenario: str
    agent_version: str
    occurred_at: str
    kind: str
    rubric_version: int
    reward: float | None
    comment: str | None


Cursor = tuple[str, str, str]  # (occurred_at, trace_id, kind) of the last item of a page


def my_labels(
    index: QueryIndex, corpus_id: int, labeler: str, *, q: str, limit: int, after: Cursor | None
) -> list[MyLabel]:
    """The labeler's labels, newest first (then trace id, kind), after ``after``."""
    where, params = ["l.labeler = ?"], [labeler]
    if q:
        where.append("(contains(lower(trace_id), ?) OR contains(lower(scenario), ?) "
                     "OR contains(lower(coalesce(l.comment, '')), ?))")  # fmt: skip
        params += [q.lower()] * 3
    if after is not None:
        where.append("(o < ? OR (o = ? AND (trace_id < ? OR (trace_id = ? AND k < ?))))")
        params += [after[0], after[0], after[1], after[1], after[2]]
    text = (
        "SELECT trace_id, scenario, agent_version, o, k, coalesce(l.rubric_version, 0), "
        f"{_REWARD}, l.comment FROM (SELECT trace_id, scenario, agent_version, l, "
        "coalesce(l.occurred_at, '') AS o, coalesce(l.kind, 'label') AS k FROM (SELECT "
        "trace_id, scenario, agent_version, unnest(list_concat(coalesce(labels, []), "
        "CASE WHEN adjudication IS NULL THEN [] ELSE [adjudication] END)) AS l FROM records "
        "WHERE corpus_id = ? AND NOT deleted AND (list_contains(labelers, ?) "
        "OR adjudication.labeler = ?))) WHERE "
        + " AND ".join(where)
        + " ORDER BY o DESC, trace_id DESC, k DESC LIMIT ?"
    )
    args = [corpus_id, labeler, labeler, *params, limit]

    def scan() -> list[MyLabel]:
        rows = index.connection().execute(text, args).fetchall()
        return [MyLabel(r[0], r[1], r[2], r[3], r[4], int(r[5]), r[6], r[7]) for r in rows]

    return index.memo(corpus_id, repr(("my labels", args)), scan)


@dataclass(frozen=True)
class ReviewRow:
    """A trace of the review queue: its labelers, and where its record is."""

    trace_id: str
    labelers: tuple[str, ...]
    body_at: tuple[int, int, int]


def review_head(
    index: QueryIndex, corpus_id: int, scope: ReviewScope, size: int
) -> list[ReviewRow]:
    """The first ``size`` traces of the review queue by the corpora's view, oldest first."""
    where, params = scope.sql()
    text = (
        f"SELECT trace_id, labelers, seg, off, len FROM records WHERE corpus_id = ? AND {where} "
        "ORDER BY completed_us, trace_id LIMIT ?"
    )

    def scan() -> list[ReviewRow]:
        rows = index.connection().execute(text, [corpus_id, *params, size]).fetchall()
        return [ReviewRow(r[0], tuple(r[1] or ()), (int(r[2]), int(r[3]), int(r[4])))
                for r in rows]  # fmt: skip

    return index.memo(corpus_id, repr(("review head", where, params, size)), scan)


def review_count(index: QueryIndex, corpus_id: int, scope: ReviewScope) -> int:
    """How many traces the review queue holds by the corpora's view."""
    where, params = scope.sql()

    def scan() -> int:
        row = (
            index.connection()
            .execute(
                f"SELECT count(*) FROM records WHERE corpus_id = ? AND {where}",
                [corpus_id, *params],
            )
            .fetchone()
        )
        return 0 if row is None else int(row[0])

    return index.memo(corpus_id, repr(("review count", where, params)), scan)


def adjudicator(index: QueryIndex, corpus_id: int, trace_id: str) -> str | None:
    """Who decided the trace, as the corpora show it (None: nobody)."""
    row = (
        index.connection()
        .execute(
            "SELECT adjudication.labeler FROM records WHERE corpus_id = ? AND trace_id = ? "
            "AND NOT deleted",
            [corpus_id, trace_id],
        )
        .fetchone()
    )
    return None if row is None else row[0]


def shared_bodies(index: QueryIndex, corpus_id: int, filters: Filters) -> list[bytes]:
    """The records matching ``filters`` (``limit`` as the agreement report reads it) that two
    labels or more, or an adjudication, make worth a look for the agreement per question."""
    where, params = filter_sql(filters)
    limit = "" if filters.limit is None else f" ORDER BY seq LIMIT {int(filters.limit)}"
    rows = (
        index.connection()
        .execute(
            f"SELECT seg, off, len FROM (SELECT * FROM records WHERE corpus_id = ? AND {where}"
            f"{limit}) WHERE coalesce(labels_count, 0) >= 2 OR adjudication IS NOT NULL",
            [corpus_id, *params],
        )
        .fetchall()
    )
    return index.bodies_at([tuple(r) for r in rows])
