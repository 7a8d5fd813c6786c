"""The scaling simulation's figures from a group's samples (no broker)."""

from __future__ import annotations

import pytest

from tests.perf.bench_scaling import Owners, Sample, figures

TWO: Owners = {("t", 0): "a", ("t", 1): "a", ("t", 2): "b", ("t", 3): "b"}
FOUR: Owners = {("t", 0): "a", ("t", 1): "c", ("t", 2): "b", ("t", 3): "d"}


def samples() -> list[Sample]:
    """Steady lag 10 on two members; at t=100 a rebalance (t=101-103), four members after."""
    out: list[Sample] = [(90.0 + i, True, TWO, 10) for i in range(10)]
    out += [(100.5, True, TWO, 12), (101.0, False, {}, 40), (102.0, False, {}, 80)]
    out += [(103.0, True, FOUR, 90), (104.0, True, FOUR, 50), (105.0, True, FOUR, 25)]
    out += [(106.0, True, FOUR, 11), (107.0, True, FOUR, 9)]
    return out


def test_a_change_counts_its_rebalance_moves_and_drain() -> None:
    change = figures("join", "2 -> 4", samples(), 100.0, 200.0)
    assert change.rebalances == 1
    assert change.moved == 2  # partitions 1 and 3 changed owner
    assert change.lag_before == pytest.approx(10)
    assert change.lag_peak == 90
    assert change.drain_s == pytest.approx(5.0)  # lag 25 is within 10 + 20 at t=105


def test_a_second_rebalance_restarts_the_drain() -> None:
    more = [(s[0] + 10, *s[1:]) for s in samples()[10:]]  # another round from t=110
    change = figures("join", "2 -> 4", samples() + more, 100.0, 200.0)
    assert change.rebalances == 2
    assert change.drain_s == pytest.approx(15.0)


def test_a_lag_that_never_comes_back_has_no_drain_time() -> None:
    stuck = [*samples()[:13], (103.0, True, FOUR, 500), (104.0, True, FOUR, 400)]
    change = figures("sink", "4 -> 2", stuck, 100.0, 200.0)
    assert change.drain_s is None
    assert change.moved == 2


def test_no_samples_before_the_change_give_no_figures() -> None:
    change = figures("join", "2 -> 4", samples()[10:], 100.0, 200.0)
    assert (change.rebalances, change.moved, change.drain_s) == (0, 0, None)
