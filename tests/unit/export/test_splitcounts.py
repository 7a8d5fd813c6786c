"""A training set's rows per split, and the warnings a split-by with few values draws
(issue 56: five scenarios over train=0.9,eval=0.1 put every row in train, silently)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from rl_export.export.splitcounts import VALUES_PER_SPLIT, count_splits
from rl_export.export.splits import parse_split


def test_five_scenarios_over_two_splits_warn_and_an_empty_split_is_named() -> None:
    split = parse_split("train", "train=0.9,eval=0.1", "scenario")
    assert split is not None
    scenarios = [f"s{n % 5}" for n in range(672)]
    counts = count_splits(split, scenarios)
    assert sum(counts.rows.values()) == 672
    assert counts.values == 5
    assert any("5 distinct values for 2 splits" in w for w in counts.warnings)
    empty = [name for name, n in counts.rows.items() if n == 0]
    for name in empty:
        assert any(f"split {name!r}" in w for w in counts.warnings)


def test_trace_ids_split_near_their_fractions_without_a_warning() -> None:
    split = parse_split("train", "train=0.9,eval=0.1")
    assert split is not None
    counts = count_splits(split, [f"tr-{n}" for n in range(2000)])
    assert counts.warnings == []
    assert 1700 < counts.rows["train"] < 1900


@given(st.lists(st.sampled_from([f"v{n}" for n in range(30)]), max_size=200))
def test_counts_are_each_rows_split(values: list[str]) -> None:
    split = parse_split("a", "a=0.5,b=0.3,c=0.2", "scenario", "salt")
    assert split is not None
    counts = count_splits(split, values)
    expected = {"a": 0, "b": 0, "c": 0}
    for value in values:
        expected[split.of({"scenario": value})] += 1
    assert counts.rows == expected
    assert counts.values == len(set(values))
    few = values and len(set(values)) < VALUES_PER_SPLIT * 3
    assert bool(few) == any("distinct value" in w for w in counts.warnings)
