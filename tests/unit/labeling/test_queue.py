"""The queue's rules (DESIGN.md section 8): targets, adjudication, who sees which trace."""

from __future__ import annotations

import random

import duckdb
import pytest

from rl_export.labeling.queue import (
    FreshAction,
    TraceLabels,
    in_queue,
    order_sql,
    order_terms,
    place,
    short,
    spread,
    target,
    target_sql,
)
from rl_export.labeling.settings import LabelingSettings

K2 = LabelingSettings(labels_per_trace=2)
ADJUDICATED = LabelingSettings(labels_per_trace=2, adjudicate_spread=0.3)


def trace(sums: dict[str, int | None] | None = None, skipped: tuple[str, ...] = ()) -> TraceLabels:
    return TraceLabels("tr-1", sums or {}, frozenset(skipped))


def test_spread_is_the_largest_reward_difference() -> None:
    assert spread({}) == 0.0
    assert spread({"ana": 12}) == 0.0
    assert spread({"ana": 20, "bo": 8, "cy": 14}) == pytest.approx(0.6)
    assert spread({"ana": 20, "bo": None}) is None


@pytest.mark.parametrize(
    ("sums", "expected"),
    [
        ({}, 2),
        ({"ana": 20}, 2),  # one label has no spread to speak of
        ({"ana": 20, "bo": 18}, 2),  # 0.1 apart
        ({"ana": 20, "bo": 14}, 3),  # 0.3 apart: one more label
        ({"ana": 20, "bo": 14, "cy": 20}, 3),  # asked once: never k + 2
        ({"ana": 20, "bo": None}, 2),  # unknown spread: no adjudication
    ],
)
def test_adjudication_asks_for_one_more_label_once(
    sums: dict[str, int | None], expected: int
) -> None:
    assert target(ADJUDICATED, sums) == expected
    assert target(K2, sums) == 2


def test_a_labeler_never_sees_what_they_labeled_or_skipped() -> None:
    assert not in_queue("ana", trace({"ana": 16}), (), K2)
    assert not in_queue("ana", trace(skipped=("ana",)), (), K2)
    assert in_queue("ana", trace(skipped=("bo",)), (), K2)


def test_labels_and_others_claims_fill_the_target_skips_do_not() -> None:
    assert in_queue("cy", trace({"ana": 16}, skipped=("bo", "dee")), (), K2)
    assert not in_queue("cy", trace({"ana": 16}), ("bo",), K2)
    # The labeler's own claim does not keep them out.
    assert in_queue("cy", trace({"ana": 16}), ("cy",), K2)
    assert not in_queue("cy", trace({"ana": 16, "bo": 15}), (), K2)
    # Adjudication opens one more place.
    assert in_queue("cy", trace({"ana": 20, "bo": 12}), (), ADJUDICATED)


def test_short_counts_labels_only() -> None:
    assert short(trace({"ana": 16}), K2)
    assert not short(trace({"ana": 16, "bo": 16}), K2)
    assert short(trace({"ana": 20, "bo": 12}), ADJUDICATED)


def test_fresh_actions_apply_over_the_corpora() -> None:
    before = trace({"ana": 16, "bo": 12})
    after = before.with_fresh(
        {
            "ana": FreshAction(label=False),
            "cy": FreshAction(label=True, sum=20),
            "dee": FreshAction(skipped=True),
        }
    )
    assert dict(after.sums) == {"bo": 12, "cy": 20}
    assert after.skipped_by == {"dee"}
    assert before.with_fresh({}) is before


def test_the_sql_target_is_the_python_target() -> None:
    db = duckdb.connect()
    cases: list[dict[str, int | None]] = [
        {}, {"a": 20}, {"a": 20, "b": 18}, {"a": 20, "b": 14}, {"a": 20, "b": 14, "c": 9},
        {"a": 20, "b": None},
    ]  # fmt: skip
    for settings in (K2, ADJUDICATED, LabelingSettings(labels_per_trace=1, adjudicate_spread=0)):
        sql, params = target_sql(settings)
        for sums in cases:
            found = spread(sums)
            row = db.execute(
                f"SELECT {sql} FROM (SELECT ?::BIGINT AS labels_count, ?::DOUBLE AS spread)",
                [*params, len(sums), found],
            ).fetchone()
            assert row is not None
            assert row[0] == target(settings, sums), (settings, sums)


ROWS = [
    # trace_id, completed_us, eval_reward, eval_split
    ("tr-a", 3, 0.9, False),
    ("tr-b", 1, None, None),
    ("tr-c", 2, 0.65, False),
    ("tr-d", 2, 0.2, True),
    ("tr-e", 1, 0.71, False),
    ("tr-f", 5, 0.4, True),
]


def ordered(order: str, labeler: str = "ana") -> list[str]:
    db = duckdb.connect()
    db.execute(
        "CREATE TABLE t (trace_id VARCHAR, completed_us BIGINT, eval_reward DOUBLE, "
        "eval_split BOOLEAN)"
    )
    db.executemany("INSERT INTO t VALUES (?, ?, ?, ?)", ROWS)
    sql, params = order_sql(order, labeler=labeler, pass_threshold=0.7)  # type: ignore[arg-type]
    return [r[0] for r in db.execute(f"SELECT trace_id FROM t ORDER BY {sql}", params).fetchall()]


def test_oldest_and_newest_break_ties_by_trace_id() -> None:
    assert ordered("oldest") == ["tr-b", "tr-e", "tr-c", "tr-d", "tr-a", "tr-f"]
    assert ordered("newest") == ["tr-f", "tr-a", "tr-c", "tr-d", "tr-b", "tr-e"]


def test_uncertain_puts_split_evaluators_first_then_the_nearest_to_the_threshold() -> None:
    # split: tr-f (0.3 off), tr-d (0.5 off); then tr-e (0.01), tr-c (0.05), tr-a (0.2); none last
    assert ordered("uncertain") == ["tr-f", "tr-d", "tr-e", "tr-c", "tr-a", "tr-b"]


def test_random_is_a_fixed_shuffle_of_its_own_per_labeler() -> None:
    assert ordered("random", "ana") == ordered("random", "ana")
    assert sorted(ordered("random", "ana")) == sorted(r[0] for r in ROWS)
    shuffles = {tuple(ordered("random", f"l{n}")) for n in range(8)}
    assert len(shuffles) > 1


@pytest.mark.parametrize("order", ["oldest", "newest", "uncertain", "random"])
def test_places_read_back_from_the_terms_sort_as_the_order_by_does(order: str) -> None:
    """The web service merges a queue's head with its touched traces in Python by the rows'
    places: they must sort as DuckDB's ORDER BY (NULLs last, ties by trace id)."""
    rng = random.Random(order)
    db = duckdb.connect()
    db.execute(
        "CREATE TABLE t (trace_id VARCHAR, completed_us BIGINT, eval_reward DOUBLE, "
        "eval_split BOOLEAN)"
    )
    rows = [
        (f"tr-{n:03d}", rng.choice([None, *range(5)]), rng.choice([None, 0.2, 0.7, 0.75, 0.9]),
         rng.choice([None, True, False]))
        for n in range(200)
    ]  # fmt: skip
    db.executemany("INSERT INTO t VALUES (?, ?, ?, ?)", rows)
    for labeler in ("ana", "bo"):
        terms, params = order_terms(order, labeler=labeler, pass_threshold=0.7)  # type: ignore[arg-type]
        sql, _ = order_sql(order, labeler=labeler, pass_threshold=0.7)  # type: ignore[arg-type]
        by_sql = db.execute(f"SELECT trace_id FROM t ORDER BY {sql}", params).fetchall()
        found = db.execute(f"SELECT trace_id, {', '.join(terms)} FROM t", params).fetchall()
        by_place = sorted(found, key=lambda r: place(r[1:]))
        assert [r[0] for r in by_place] == [r[0] for r in by_sql]
