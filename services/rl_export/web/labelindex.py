"""The team's queries over the query index (DESIGN.md section 8): the head of a labeler's
queue and its counts, a trace's labels, records in the order asked, and the agreement report's
input. The rules are :mod:`rl_export.labeling`'s; this module says them in SQL over the
``traces`` corpus's rows (:mod:`rl_export.web.index`), and :mod:`rl_export.web.team` corrects
the traces the corpora do not show right yet."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from rl_export.labeling.queue import TraceLabels, order_sql, target_sql
from rl_export.labeling.settings import LabelingSettings
from rl_export.web.index import LABEL_SUM, QueryIndex

# A trace's labels and skips for the queue's rules: labelers, their rating sums (NULL for a
# record written before ``labels``), skips.
_LABELS_OF = (
    f"trace_id, labelers, list_transform(labels, lambda x: {{'labeler': x.labeler, "
    f"'sum': {LABEL_SUM}}}), skipped_by"
)


def _trace_labels(
    trace_id: str, labelers: list[str], sums: list[dict[str, Any]] | None, skipped: list[str]
) -> TraceLabels:
    known: dict[str, int | None] = (
        dict.fromkeys(labelers) if sums is None else {x["labeler"]: int(x["sum"]) for x in sums}
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
    limit: int
    settings: LabelingSettings
    pass_threshold: float
    scope: QueueFilter = QueueFilter()
    touched: Sequence[str] = ()


def _queue_where(ask: QueueAsk) -> tuple[str, str, list[Any], list[Any]]:
    """The scope's condition and whether a trace is in the labeler's queue by the
    corpora's view (labels fill the target, the labeler's own labels and skips exclude)."""
    scope, scope_params = ask.scope.sql()
    target, target_params = target_sql(ask.settings)
    eligible = (
        "(NOT list_contains(labelers, ?) AND NOT list_contains(skipped_by, ?) "
        f"AND coalesce(labels_count, 0) < {target})"
    )
    return scope, eligible, scope_params, [ask.labeler, ask.labeler, *target_params]


def queue_candidates(index: QueryIndex, corpus_id: int, ask: QueueAsk) -> list[TraceLabels]:
    """The head of the labeler's queue in the project's order: up to ``limit`` traces,
    the touched ones among them whatever the corpora say (the caller decides those)."""
    scope, eligible, scope_params, eligible_params = _queue_where(ask)
    order, order_params = order_sql(
        ask.settings.order, labeler=ask.labeler, pass_threshold=ask.pass_threshold
    )
    rows = (
        index.reader()
        .execute(
            f"SELECT {_LABELS_OF} FROM records WHERE corpus_id = ? AND {scope} AND "
            f"({eligible} OR list_contains(?::VARCHAR[], trace_id)) ORDER BY {order} LIMIT ?",
            [
                corpus_id,
                *scope_params,
                *eligible_params,
                list(ask.touched),
                *order_params,
                ask.limit,
            ],
        )
        .fetchall()
    )
    return [_trace_labels(*row) for row in rows]


def queue_counts(
    index: QueryIndex, corpus_id: int, ask: QueueAsk
) -> tuple[int, int, int, list[TraceLabels]]:
    """``remaining``, ``team_remaining`` and the labeler's own labels over the untouched
    traces of the scope, and the touched traces of the scope (for the caller to count)."""
    scope, eligible, scope_params, eligible_params = _queue_where(ask)
    target, target_params = target_sql(ask.settings)
    touched = list(ask.touched)
    db = index.reader()
    row = db.execute(
        f"SELECT count(*) FILTER (WHERE {eligible}), "
        f"count(*) FILTER (WHERE coalesce(labels_count, 0) < {target}), "
        "count(*) FILTER (WHERE list_contains(labelers, ?)) FROM records "
        f"WHERE corpus_id = ? AND {scope} AND NOT list_contains(?::VARCHAR[], trace_id)",
        [*eligible_params, *target_params, ask.labeler, corpus_id, *scope_params, touched],
    ).fetchone()
    rows = []
    if touched:
        rows = db.execute(
            f"SELECT {_LABELS_OF} FROM records WHERE corpus_id = ? AND {scope} AND "
            "list_contains(?::VARCHAR[], trace_id)",
            [corpus_id, *scope_params, touched],
        ).fetchall()
    counts = (int(row[0]), int(row[1]), int(row[2])) if row is not None else (0, 0, 0)
    return (*counts, [_trace_labels(*r) for r in rows])


def trace_labels(index: QueryIndex, corpus_id: int, trace_id: str) -> TraceLabels | None:
    """A live trace's labels and skips as the corpora show them (None: not live)."""
    row = (
        index.reader()
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
        index.reader()
        .execute(
            "SELECT trace_id, seg, off, len FROM records WHERE corpus_id = ? AND NOT deleted "
            "AND list_contains(?::VARCHAR[], trace_id)",
            [corpus_id, list(trace_ids)],
        )
        .fetchall()
    )
    where = {r[0]: r[1:] for r in rows}
    return index.bodies_at([where[t] for t in trace_ids if t in where])
