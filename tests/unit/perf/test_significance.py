"""Whether two sets of bench runs differ (the test ``make bench`` and ``bench-ab`` print)."""

from __future__ import annotations

import pytest

from tests.perf.significance import compare, verdict


def test_runs_that_all_beat_the_others_are_a_difference_and_mixed_ones_are_not() -> None:
    control = [9_000.0, 9_500.0, 10_000.0, 10_500.0, 11_000.0]
    faster = [11_500.0, 12_000.0, 12_500.0, 13_000.0, 13_500.0]
    shown = compare(control, faster)
    assert shown["ratio"] == pytest.approx(12_500 / 10_000)
    assert shown["p"] == pytest.approx(2 / 252)  # 2 of the C(10, 5) orders are this extreme
    assert verdict(shown) == "1.25 (p=0.008)"
    mixed = compare(control, [9_200.0, 9_800.0, 10_200.0, 10_800.0, 13_000.0])
    assert mixed["p"] > 0.5
    assert verdict(mixed) == f"~ (p={mixed['p']:.3f})"


def test_three_rounds_can_never_show_a_difference() -> None:
    apart = compare([1.0, 2.0, 3.0], [10.0, 20.0, 30.0])
    assert apart["p"] == pytest.approx(0.1)  # 2 of the C(6, 3) = 20 orders
    assert verdict(apart).startswith("~ ")
