"""The queue of docs/guides/labeling.md, as rules: a trace's target, whose queue it is in, orders.

The queue of labeler C holds the traces of the ``traces`` corpus (not deleted, matching the
request's filters) that C has neither labeled nor skipped, and whose current labels plus
other labelers' unexpired claims are fewer than the trace's target: k, or k + 1 once
adjudication asked for one more label (its labelers' rewards differ by at least
``adjudicate_spread``: asked once, so a trace never goes past k + 1). ``remaining`` counts
C's queue; ``team_remaining`` the traces whose current labels are short of their target.

The web service asks its query index for these in SQL over the corpora's view
(:func:`order_sql`, :func:`target_sql`), then corrects the few traces the corpora do not
show right yet (fresh labels and skips, claims) with :func:`in_queue` and :func:`short`,
which hold the same rules over a :class:`TraceLabels`. Pure: no I/O, no clock.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field

from rl_export.labeling.settings import LabelingSettings, Order

RATING_SUM_SCALE = 20  # a version-0 labeler's reward is their four ratings summed / 20


@dataclass(frozen=True)
class TraceLabels:
    """What the queue needs of one trace: its current labels (labeler -> their reward in
    twentieths: a version-0 label's four ratings summed, another rubric version's reward x 20;
    None when the record did not say: written before ``labels``) and skips."""

    trace_id: str
    sums: Mapping[str, float | None] = field(default_factory=dict)
    skipped_by: frozenset[str] = frozenset()

    def with_fresh(self, fresh: Mapping[str, FreshAction]) -> TraceLabels:
        """This trace as it is once the fresh actions (newer than the corpora) apply."""
        if not fresh:
            return self
        sums = dict(self.sums)
        skipped = set(self.skipped_by)
        for labeler, action in fresh.items():
            if action.skipped:
                skipped.add(labeler)
            if action.label is None:
                continue
            if action.label:
                sums[labeler] = action.sum
            else:
                sums.pop(labeler, None)
        return TraceLabels(self.trace_id, sums, frozenset(skipped))


@dataclass(frozen=True)
class FreshAction:
    """A labeler's latest action on a trace that the corpora may not show yet: ``label``
    True (labeled, ``sum`` of the ratings of a version-0 label, else None until the corpora
    show its reward), False (retracted) or None (only skipped)."""

    label: bool | None = None
    sum: float | None = None
    skipped: bool = False


def spread(sums: Mapping[str, float | None]) -> float | None:
    """The largest difference between two labelers' rewards (0 for fewer than two labels);
    None when a rating sum is unknown."""
    if len(sums) < 2:
        return 0.0
    values = list(sums.values())
    if any(v is None for v in values):
        return None
    known = [v for v in values if v is not None]
    return (max(known) - min(known)) / RATING_SUM_SCALE


def target(settings: LabelingSettings, sums: Mapping[str, float | None]) -> int:
    """k, or k + 1 once the trace's first k labels (or more) disagree by the spread."""
    k = settings.labels_per_trace
    threshold = settings.adjudicate_spread
    if threshold is None or len(sums) < k:
        return k
    found = spread(sums)
    return k + 1 if found is not None and found >= threshold else k


def in_queue(
    labeler: str, trace: TraceLabels, holders: Collection[str], settings: LabelingSettings
) -> bool:
    """Whether the trace is in ``labeler``'s queue; ``holders`` hold its places (claims and
    labels through claims, :meth:`~rl_export.labeling.claims.ClaimBook.holders`)."""
    if labeler in trace.sums or labeler in trace.skipped_by:
        return False
    taken = (set(trace.sums) | set(holders)) - {labeler}
    return len(taken) < target(settings, trace.sums)


def short(trace: TraceLabels, settings: LabelingSettings) -> bool:
    """Whether the trace's current labels are fewer than its target (``team_remaining``)."""
    return len(trace.sums) < target(settings, trace.sums)


def target_sql(settings: LabelingSettings) -> tuple[str, list[object]]:
    """:func:`target` over the index's columns ``labels_count`` and ``spread``."""
    k = settings.labels_per_trace
    if settings.adjudicate_spread is None:
        return "?", [k]
    return (
        "(? + CASE WHEN coalesce(labels_count, 0) >= ? AND spread >= ? THEN 1 ELSE 0 END)",
        [k, k, settings.adjudicate_spread],
    )


def order_terms(
    order: Order, *, labeler: str, pass_threshold: float
) -> tuple[list[str], list[object]]:
    """The queue's order over the index's columns as ascending terms, ties older first, then
    trace id: ``ORDER BY`` them (NULLs last, DuckDB's default), or select them as a row's
    place and compare places with :func:`place` in Python.

    ``uncertain``: traces whose evaluators split (some passed, some not) first, then by how
    near their evaluator reward is to the human pass threshold; traces without an evaluation
    last. ``random``: a shuffle of its own per labeler (a hash of labeler and trace), fixed,
    so a team spreads out over the traces.
    """
    ties = ["completed_us", "trace_id"]
    if order == "oldest":
        return ties, []
    if order == "newest":
        return ["-completed_us", "trace_id"], []
    if order == "uncertain":
        return (
            ["eval_reward IS NULL", "NOT coalesce(eval_split, false)", "abs(eval_reward - ?)",
             *ties],
            [pass_threshold],
        )  # fmt: skip
    return ["hash(?, trace_id)", *ties], [labeler]


def order_sql(order: Order, *, labeler: str, pass_threshold: float) -> tuple[str, list[object]]:
    """The ``ORDER BY`` of a queue (:func:`order_terms`)."""
    terms, params = order_terms(order, labeler=labeler, pass_threshold=pass_threshold)
    return ", ".join(terms), params


def place(values: Sequence[object]) -> tuple[tuple[bool, object], ...]:
    """A row's place in the queue from its :func:`order_terms` values: compares as the
    ``ORDER BY`` does (NULLs after every value, within one term's type)."""
    return tuple((v is None, v) for v in values)
