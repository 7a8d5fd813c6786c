"""Ratings and agreement of comparisons (rl_export.labeling.ratings), checked against independent
computations: Bradley-Terry by scipy's optimiser and by a minorise-maximise iteration (Hunter
2004), alpha by the ``krippendorff`` package, the interval by an explicit resampling of
pairs, and hand-worked examples."""

from __future__ import annotations

import math

import krippendorff
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.optimize import minimize

from rl_export.labeling.ratings import (
    CHOICES,
    RatingsBuilder,
    RatingsInput,
    bradley_terry,
    elo,
    has_maximum,
    pair_agreement,
    ratings_report,
)


def _input(pairs: list[tuple[int, int]], votes: list[tuple[int, int, int]],
           versions: int) -> RatingsInput:  # fmt: skip
    """Pairs (version of a, version of b) and votes (pair, labeler, choice)."""
    labelers = max((v[1] for v in votes), default=-1) + 1
    return RatingsInput(
        versions=tuple(f"v{n}" for n in range(versions)),
        pair_a=np.array([p[0] for p in pairs], np.int64),
        pair_b=np.array([p[1] for p in pairs], np.int64),
        labelers=tuple(f"l{n}" for n in range(labelers)),
        vote_pair=np.array([v[0] for v in votes], np.int64),
        vote_labeler=np.array([v[1] for v in votes], np.int64),
        vote_choice=np.array([v[2] for v in votes], np.int64),
    )


def _scipy_bt(wins: np.ndarray) -> np.ndarray:
    """Maximum likelihood by a general optimiser, from the likelihood as written."""
    size = len(wins)

    def negative(theta: np.ndarray) -> float:
        diff = theta[:, None] - theta[None, :]
        return float(np.sum(wins * np.logaddexp(0.0, -diff)))

    found = minimize(negative, np.zeros(size), method="BFGS", options={"gtol": 1e-10})
    theta = np.asarray(found.x, np.float64)
    centred: np.ndarray = theta - theta.mean()
    return centred


def _mm_bt(wins: np.ndarray, rounds: int = 20_000) -> np.ndarray:
    """Hunter's minorise-maximise iteration: p_i <- W_i / sum_j n_ij / (p_i + p_j)."""
    games = wins + wins.T
    won = wins.sum(axis=1)
    p = np.ones(len(wins))
    for _ in range(rounds):
        p = won / (games / (p[:, None] + p[None, :])).sum(axis=1)
        p /= np.exp(np.log(p).mean())
    return np.log(p)


@st.composite
def win_matrices(draw: st.DrawFn) -> np.ndarray:
    size = draw(st.integers(2, 6))
    cells = draw(st.lists(st.integers(0, 12), min_size=size * size, max_size=size * size))
    wins = np.array(cells, np.float64).reshape(size, size) / 2  # half wins: ties
    np.fill_diagonal(wins, 0)
    return wins


@settings(max_examples=40, deadline=None)
@given(win_matrices())
def test_strengths_are_the_maximum_likelihood_of_an_independent_optimiser(wins: np.ndarray) -> None:
    (theta,) = bradley_terry(wins[None])
    if not has_maximum(wins[None])[0]:
        assert np.isnan(theta).all()
        return
    assert np.allclose(elo(theta[None])[0], elo(_scipy_bt(wins)[None])[0], atol=1e-3)
    assert np.allclose(theta, _mm_bt(wins), atol=1e-5)


def test_a_separated_graph_has_no_maximum() -> None:
    """A version that never won (nor tied) against the others runs off to minus infinity."""
    wins = np.array([[0, 3, 1], [1, 0, 2], [0, 0, 0]], np.float64)
    assert not has_maximum(wins[None])[0]
    assert np.isnan(bradley_terry(wins[None])).all()
    wins[2, 0] = 0.5  # one tie with v0
    assert has_maximum(wins[None])[0]


def test_three_wins_in_four_is_400_log10_3_apart_around_1000() -> None:
    """Hand-worked: p_a / p_b = 3, so the difference is 400 log10 3 = 190.85 points."""
    data = _input([(0, 1)] * 4, [(0, 0, 0), (1, 0, 0), (2, 0, 0), (3, 0, 1)], versions=2)
    report = ratings_report(data)
    by = {r.agent_version: r for r in report.ratings}
    gap = 400 * math.log10(3)
    assert by["v0"].rating == pytest.approx(1000 + gap / 2)
    assert by["v1"].rating == pytest.approx(1000 - gap / 2)
    assert by["v0"].comparisons == by["v1"].comparisons == 4
    assert [r.agent_version for r in report.ratings] == ["v0", "v1"]


def test_ties_and_both_bad_are_half_a_win_each() -> None:
    """One win each way and a tie and a both_bad: level. A tie added to 2-1 moves it to 2.5-1.5."""
    level = _input([(0, 1)] * 4, [(0, 0, 0), (1, 0, 1), (2, 0, 2), (3, 0, 3)], versions=2)
    assert [r.rating for r in ratings_report(level).ratings] == [pytest.approx(1000)] * 2
    data = _input([(0, 1)] * 4, [(0, 0, 0), (1, 0, 0), (2, 0, 1), (3, 0, 2)], versions=2)
    top = ratings_report(data).ratings[0]
    assert top.rating == pytest.approx(1000 + 200 * math.log10(2.5 / 1.5))


def test_pairs_of_one_version_count_for_agreement_not_ratings() -> None:
    data = _input([(0, 0), (0, 1), (1, 0)], [(0, 0, 0), (0, 1, 0), (1, 0, 0), (2, 0, 0)], 2)
    report = ratings_report(data)
    assert {r.agent_version: r.comparisons for r in report.ratings} == {"v0": 2, "v1": 2}
    assert report.agreement.pairs == 1


def test_no_maximum_gives_null_ratings_with_their_counts() -> None:
    data = _input([(0, 1)] * 3, [(0, 0, 0), (1, 0, 0), (2, 0, 0)], versions=2)
    assert [(r.rating, r.ci95, r.comparisons) for r in ratings_report(data).ratings] == [
        (None, None, 3), (None, None, 3)
    ]  # fmt: skip


def _random_input(seed: int, pairs: int, versions: int) -> RatingsInput:
    rng = np.random.default_rng(seed)
    a = rng.integers(0, versions, pairs)
    b = (a + rng.integers(1, versions, pairs)) % versions
    strength = np.linspace(-0.6, 0.6, versions)
    p = 1 / (1 + np.exp(-(strength[a] - strength[b])))
    choice = np.where(rng.random(pairs) < p, 0, 1)
    choice[rng.random(pairs) < 0.15] = 2
    return RatingsInput(
        tuple(f"v{n}" for n in range(versions)), a, b, ("l",), np.arange(pairs),
        np.zeros(pairs, np.int64), choice,
    )  # fmt: skip


def test_the_interval_matches_an_explicit_resampling_of_pairs() -> None:
    """The patterns' multinomial draw is a resample of pairs in distribution: its percentiles
    agree with 1,000 explicit resamples of the pairs (another generator) within their noise."""
    data = _random_input(3, 400, 3)
    report = ratings_report(data)
    rng = np.random.default_rng(99)
    explicit = []
    for _ in range(1000):
        pick = rng.integers(0, 400, 400)
        wins = np.zeros((3, 3))
        for n in pick:
            a, b, c = data.pair_a[n], data.pair_b[n], data.vote_choice[n]
            wins[a, b] += 1.0 if c == 0 else 0.5 if c >= 2 else 0.0
            wins[b, a] += 1.0 if c == 1 else 0.5 if c >= 2 else 0.0
        explicit.append(elo(_scipy_bt(wins)[None])[0])
    low, high = np.percentile(explicit, [2.5, 97.5], axis=0)
    for r in report.ratings:
        n = int(r.agent_version[1:])
        assert r.ci95 is not None
        assert r.rating is not None
        assert r.ci95[0] < r.rating < r.ci95[1]
        assert r.ci95[0] == pytest.approx(low[n], abs=8)
        assert r.ci95[1] == pytest.approx(high[n], abs=8)


def test_the_interval_is_fixed_by_its_seed() -> None:
    data = _random_input(5, 300, 4)
    assert ratings_report(data) == ratings_report(data)
    assert ratings_report(data, seed=1) != ratings_report(data)


@st.composite
def votes(draw: st.DrawFn) -> list[list[float]]:
    """A labelers x pairs matrix of choices (NaN: no vote)."""
    labelers = draw(st.integers(2, 5))
    pairs = draw(st.integers(2, 12))
    cell = st.one_of(st.just(math.nan), st.integers(0, len(CHOICES) - 1).map(float))
    return [draw(st.lists(cell, min_size=pairs, max_size=pairs)) for _ in range(labelers)]


@settings(max_examples=80, deadline=None)
@given(votes())
def test_agreement_matches_the_krippendorff_package(matrix: list[list[float]]) -> None:
    rows = [
        (pair, labeler, int(choice))
        for labeler, line in enumerate(matrix)
        for pair, choice in enumerate(line)
        if not math.isnan(choice)
    ]
    data = _input([(0, 1)] * len(matrix[0]), rows, versions=2)
    found = pair_agreement(data)
    per_pair = np.sum(~np.isnan(np.array(matrix)), axis=0)
    assert found.pairs == int((per_pair >= 2).sum())
    if found.pairs < 2:
        assert found.alpha is None
        return
    values = np.array(matrix)
    kept = values[:, per_pair >= 2]
    if len(np.unique(kept[~np.isnan(kept)])) < 2:
        assert found.alpha is None
    else:
        expected = krippendorff.alpha(kept, level_of_measurement="nominal",
                                      value_domain=np.arange(len(CHOICES)))  # fmt: skip
        assert found.alpha == pytest.approx(expected, abs=1e-9)
    # percent: per pair, agreeing pairs of its labelers over all pairs of them
    shares = []
    for column in kept.T:
        seen = [int(v) for v in column if not math.isnan(v)]
        same = sum(a == b for i, a in enumerate(seen) for b in seen[i + 1 :])
        shares.append(same / (len(seen) * (len(seen) - 1) / 2))
    assert found.percent == pytest.approx(float(np.mean(shares)))


def test_agreement_hand_worked() -> None:
    """Two pairs: both labelers chose a; then a and b. Percent (1 + 0) / 2; alpha by hand:
    coincidences a-a 2, a-b 1, b-a 1, n = 4; D_o = 2/4, D_e = (3 * 1 * 2) / (4 * 3) = 1/2:
    alpha = 1 - (1/2) / (1/2) = 0."""
    data = _input([(0, 1), (0, 1)], [(0, 0, 0), (0, 1, 0), (1, 0, 0), (1, 1, 1)], versions=2)
    found = pair_agreement(data)
    assert (found.pairs, found.percent) == (2, 0.5)
    assert found.alpha == pytest.approx(0.0)


def test_the_builder_reads_each_pair_from_its_trace_a() -> None:
    """trace_a's entries are the votes; trace_b's mirror them (ignored); a pair whose other
    trace is missing (deleted, filtered out) does not count."""
    builder = RatingsBuilder()
    builder.add({"trace_id": "a", "agent_version": "v1", "comparisons": [
        {"pair_id": "p1", "other": "b", "outcome": "win", "labeler": "x"},
        {"pair_id": "p1", "other": "b", "outcome": "tie", "labeler": "y"},
        {"pair_id": "p2", "other": "gone", "outcome": "win", "labeler": "x"},
    ]})  # fmt: skip
    builder.add({"trace_id": "b", "agent_version": "v2", "comparisons": [
        {"pair_id": "p1", "other": "a", "outcome": "loss", "labeler": "x"},
        {"pair_id": "p1", "other": "a", "outcome": "tie", "labeler": "y"},
        {"pair_id": "p4", "other": "0", "outcome": "win", "labeler": "z"},
    ]})  # fmt: skip
    builder.add({"trace_id": "0", "agent_version": "v2", "comparisons": [
        {"pair_id": "p3", "other": "b", "outcome": "both_bad", "labeler": "z"},
    ]})  # fmt: skip
    builder.add({"trace_id": "gone", "deleted": True})
    data = builder.build()
    assert data.versions == ("v1", "v2")
    assert list(data.pair_a) == [0, 1]  # p1: a (v1); p3: 0 (v2)
    assert list(data.pair_b) == [1, 1]  # p1: b (v2); p3: b (v2)
    assert list(data.vote_choice) == [0, 2, 3]
    assert data.labelers == ("x", "y", "z")


def test_bad_inputs_are_refused() -> None:
    with pytest.raises(ValueError, match="vote_choice"):
        _input([(0, 1)], [(0, 0, 4)], versions=2)
    with pytest.raises(ValueError, match="two votes"):
        _input([(0, 1)], [(0, 0, 0), (0, 0, 1)], versions=2)
    with pytest.raises(ValueError, match="pair_b"):
        _input([(0, 2)], [], versions=2)


def test_an_empty_input_has_no_ratings() -> None:
    report = ratings_report(RatingsBuilder().build())
    assert report.model_dump() == {
        "ratings": [], "agreement": {"pairs": 0, "percent": None, "alpha": None}
    }  # fmt: skip
