"""The agreement report: alpha pinned to Krippendorff's published example and to the
``krippendorff`` package (point estimates, explicit resamples, the bootstrap's interval),
rho and kappa to published examples, the undefined cases, and the report of records."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import krippendorff
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats

from rl_export.labeling.agreement import (
    DIMENSIONS,
    AgreementBuilder,
    AgreementInput,
    Level,
    agreement_report,
    alpha_with_interval,
    alphas,
    average_ranks,
    cohen_kappa,
    coincidences,
    patterns,
    spearman,
    spearman_coded,
    value_counts,
)
from tests.records import record

NAN = np.nan

# Krippendorff, K. (2011). "Computing Krippendorff's Alpha-Reliability". Departmental Papers
# (ASC) 43, Annenberg School for Communication, University of Pennsylvania,
# http://repository.upenn.edu/asc_papers/43 : the reliability data of its sections C to E
# (observers A to D, units 1 to 12, missing values), whose alphas it computes by hand as
# 0.743 (nominal), 0.815 (ordinal) and 0.849 (interval).
KRIPPENDORFF_2011 = np.array(
    [
        [1, 2, 3, 3, 2, 1, 4, 1, 2, NAN, NAN, NAN],
        [1, 2, 3, 3, 2, 2, 4, 1, 2, 5, NAN, 3],
        [NAN, 3, 3, 3, 2, 3, 4, 2, 2, 5, 1, NAN],
        [1, 2, 3, 3, 2, 4, 4, 1, 2, 5, 1, NAN],
    ]
)


def columns(data: np.ndarray[Any, Any]) -> tuple[Any, Any]:
    """Reliability data (observers x units, NaN missing, values 1..V) as the report's
    columns: units numbered 0.. over the pairable ones, values 0..V-1."""
    observer, unit = np.nonzero(~np.isnan(data))
    values = data[observer, unit].astype(np.int64) - 1
    per_unit = np.bincount(unit, minlength=data.shape[1])
    keep = per_unit[unit] >= 2
    renumber = np.cumsum(per_unit >= 2) - 1
    return renumber[unit[keep]], values[keep]


def package_alpha(data: np.ndarray[Any, Any], level: Level, domain: int) -> float:
    return float(
        krippendorff.alpha(data, level_of_measurement=level, value_domain=np.arange(1, domain + 1))
    )


@pytest.mark.parametrize(
    ("level", "published"), [("nominal", 0.743), ("ordinal", 0.815), ("interval", 0.849)]
)
def test_alpha_of_krippendorffs_published_example(level: Level, published: float) -> None:
    units, values = columns(KRIPPENDORFF_2011)
    found = alpha_with_interval(units, values, 5, level, resamples=50)
    assert found.units == 11  # unit 12 has a single value: not pairable
    assert found.alpha is not None
    assert round(found.alpha, 3) == published
    assert found.alpha == pytest.approx(package_alpha(KRIPPENDORFF_2011, level, 5), abs=1e-12)


def units_of(observers: int) -> st.SearchStrategy[list[list[float]]]:
    value = st.one_of(st.just(NAN), st.integers(1, 5).map(float))
    unit = st.lists(value, min_size=observers, max_size=observers)
    return st.lists(unit, min_size=2, max_size=25)


reliability_data = st.integers(2, 6).flatmap(units_of)


@settings(max_examples=60, deadline=None)
@given(rows=reliability_data, level=st.sampled_from(["nominal", "ordinal", "interval"]))
def test_alpha_over_patterns_equals_the_package(rows: list[list[float]], level: Level) -> None:
    data = np.array(rows).T  # observers x units
    units, values = columns(data)
    pairable = data[:, (~np.isnan(data)).sum(axis=0) >= 2]
    found = alpha_with_interval(units, values, 5, level, resamples=20)
    assert found.units == pairable.shape[1]
    distinct = np.unique(pairable[~np.isnan(pairable)])
    if found.units < 2 or len(distinct) < 2:
        assert found.alpha is None
        return
    assert found.alpha == pytest.approx(package_alpha(pairable, level, 5), abs=1e-9)


def pattern_of_units(counts: np.ndarray[Any, Any]) -> tuple[Any, Any, list[int]]:
    """The patterns, their terms, and each unit's pattern (found by row, independently)."""
    rows, _ = patterns(counts)
    where = {tuple(r): n for n, r in enumerate(rows.tolist())}
    return rows, coincidences(rows), [where[tuple(r)] for r in counts.tolist()]


@pytest.mark.parametrize("level", ["ordinal", "interval"])
def test_alpha_of_explicit_resamples_equals_the_package(level: Level) -> None:
    # Twelve labelers, 40 traces with two to five labels each.
    rng = np.random.default_rng(7)
    truth = rng.integers(1, 6, 40)
    data = np.full((12, 40), NAN)
    for unit in range(40):
        who = rng.choice(12, size=rng.integers(2, 6), replace=False)
        noise = rng.integers(-1, 2, len(who))
        data[who, unit] = np.clip(truth[unit] + noise, 1, 5)
    units, values = columns(data)
    _, terms, unit_pattern = pattern_of_units(value_counts(units, values, 5))
    for _ in range(25):
        drawn = rng.integers(0, 40, 40)  # units drawn with replacement
        counts = np.bincount(np.array(unit_pattern)[drawn], minlength=len(terms))
        mine = alphas(counts[None, :].astype(float), terms, level, np.arange(5.0))[0]
        assert mine == pytest.approx(package_alpha(data[:, drawn], level, 5), abs=1e-9)


@pytest.mark.parametrize("level", ["nominal", "ordinal", "interval"])
def test_the_interval_is_the_percentiles_of_the_packages_alphas_on_the_same_draws(
    level: Level,
) -> None:
    units, values = columns(KRIPPENDORFF_2011)
    counts = value_counts(units, values, 5)
    rows, weights = patterns(counts)
    found = alpha_with_interval(units, values, 5, level, resamples=200, seed=3)
    # The same multinomial draws over the patterns, each turned back into reliability data
    # (a unit of each pattern, as many times as drawn) for the package.
    draws = np.random.default_rng(3).multinomial(len(counts), weights / len(counts), size=200)
    expected = []
    for draw in draws:
        units_of_draw = [row for row, times in zip(rows, draw, strict=True) for _ in range(times)]
        observers = int(max(r.sum() for r in rows))
        data = np.full((observers, len(units_of_draw)), NAN)
        for column, row in enumerate(units_of_draw):
            given_values = np.repeat(np.arange(1, 6), row)
            data[: len(given_values), column] = given_values
        if len(np.unique(data[~np.isnan(data)])) > 1:
            expected.append(package_alpha(data, level, 5))
    assert found.ci95 is not None
    assert found.ci95 == pytest.approx(tuple(np.percentile(expected, [2.5, 97.5])), abs=1e-9)
    assert found.ci95[0] <= (found.alpha or 0) <= found.ci95[1]


def test_alpha_is_null_with_fewer_than_two_units_or_no_variation() -> None:
    one_unit = alpha_with_interval(np.array([0, 0, 0]), np.array([1, 3, 4]), 5, "ordinal")
    assert (one_unit.alpha, one_unit.ci95, one_unit.units) == (None, None, 1)
    none = alpha_with_interval(np.zeros(0, np.int64), np.zeros(0, np.int64), 5, "interval")
    assert (none.alpha, none.ci95, none.units) == (None, None, 0)
    same = alpha_with_interval(np.array([0, 0, 1, 1, 2, 2]), np.full(6, 2), 5, "ordinal")
    assert (same.alpha, same.ci95, same.units) == (None, None, 3)


def test_perfect_agreement_is_one_and_the_bootstrap_is_repeatable() -> None:
    units = np.repeat(np.arange(30), 2)
    values = np.repeat(np.arange(30) % 5, 2)
    found = alpha_with_interval(units, values, 5, "interval")
    assert found.alpha == 1.0
    assert found.ci95 == (1.0, 1.0)
    noisy = values.copy()
    noisy[::7] = (noisy[::7] + 2) % 5
    first = alpha_with_interval(units, noisy, 5, "interval")
    assert first == alpha_with_interval(units, noisy, 5, "interval")  # fixed seed
    assert first.ci95 is not None
    assert first.alpha is not None
    assert first.ci95[0] < first.alpha < first.ci95[1]
    assert first != alpha_with_interval(units, noisy, 5, "interval", seed=1)


def test_patterns_group_equal_rows_whatever_their_width() -> None:
    rng = np.random.default_rng(1)
    # 17 values and counts up to 40: 41**17 does not fit in 64 bits, the keys are renumbered.
    counts = rng.integers(0, 41, (500, 17)) * (rng.random((500, 17)) < 0.2)
    counts = np.concatenate([counts, counts[:200]])  # repeats
    rows, weights = patterns(counts)
    expected_rows, expected_weights = np.unique(counts, axis=0, return_counts=True)
    order = np.lexsort(rows.T[::-1])
    assert np.array_equal(rows[order], expected_rows)
    assert np.array_equal(weights[order], expected_weights)


# --- Spearman's rho and Cohen's kappa -------------------------------------------------------


def test_spearman_of_a_published_example_and_with_ties() -> None:
    # Wikipedia, "Spearman's rank correlation coefficient", example: IQ against hours of TV
    # per week of ten people; rho = -29/165.
    iq = np.array([106, 100, 86, 101, 99, 103, 97, 113, 112, 110], np.float64)
    tv = np.array([7, 27, 2, 50, 28, 29, 20, 12, 6, 17], np.float64)
    assert spearman(iq, tv) == pytest.approx(-29 / 165, abs=1e-12)
    # Ties take average ranks: x ranks 1, 2.5, 2.5, 4; y ranks 1.5, 1.5, 3, 4. Pearson of
    # those by hand: deviations (-1.5, 0, 0, 1.5) and (-1, -1, 0.5, 1.5), so
    # rho = 3.75 / sqrt(4.5 * 4.5) = 0.8333...
    x = np.array([0.1, 0.5, 0.5, 0.9])
    y = np.array([0.2, 0.2, 0.6, 0.8])
    assert spearman(x, y) == pytest.approx(3.75 / 4.5, abs=1e-12)


@settings(max_examples=60, deadline=None)
@given(pairs=st.lists(st.tuples(st.integers(0, 6), st.integers(0, 6)), min_size=3, max_size=60))
def test_ranks_and_rho_are_scipys(pairs: list[tuple[int, int]]) -> None:
    x = np.array([a / 6 for a, _ in pairs])
    y = np.array([b / 4 for _, b in pairs])
    assert np.array_equal(average_ranks(x), stats.rankdata(x))
    if len(set(x)) < 2 or len(set(y)) < 2:
        assert spearman(x, y) is None
        return
    expected = stats.spearmanr(x, y).statistic
    assert spearman(x, y) == pytest.approx(expected, abs=1e-12)
    # The human rewards' way: their values as order-preserving codes.
    distinct, codes = np.unique(y, return_inverse=True)
    assert spearman_coded(x, codes, len(distinct)) == pytest.approx(expected, abs=1e-12)


def test_spearman_is_null_when_undefined() -> None:
    assert spearman(np.array([0.5]), np.array([0.2])) is None
    assert spearman(np.zeros(0), np.zeros(0)) is None
    assert spearman(np.array([0.5, 0.5, 0.5]), np.array([0.2, 0.4, 0.6])) is None
    assert spearman(np.array([0.1, 0.5, 0.9]), np.array([0.6, 0.6, 0.6])) is None


def kappa_of(table: Sequence[int]) -> float | None:
    """Kappa of a 2x2 table (yes/yes, yes/no, no/yes, no/no) of raters A and B."""
    a = np.array([True] * (table[0] + table[1]) + [False] * (table[2] + table[3]))
    b = np.array([True] * table[0] + [False] * table[1] + [True] * table[2] + [False] * table[3])
    return cohen_kappa(a, b)


def test_cohen_kappa_of_published_examples() -> None:
    # Wikipedia, "Cohen's kappa", the grant proposals read by two readers: 20 yes/yes, 5
    # yes/no, 10 no/yes, 15 no/no: p_o = 0.7, p_e = 0.5, kappa = 0.4.
    assert kappa_of([20, 5, 10, 15]) == pytest.approx(0.4, abs=1e-12)
    # Its two "same agreement, different kappa" tables: 45/15/25/15 -> 0.1304 and
    # 25/35/5/35 -> 0.2593 (both p_o = 0.60).
    assert kappa_of([45, 15, 25, 15]) == pytest.approx(0.1304, abs=1e-4)
    assert kappa_of([25, 35, 5, 35]) == pytest.approx(0.2593, abs=1e-4)
    assert kappa_of([10, 0, 0, 10]) == 1.0


def test_cohen_kappa_is_null_when_chance_agreement_is_certain() -> None:
    assert kappa_of([5, 0, 0, 0]) is None  # both always yes
    assert kappa_of([0, 0, 0, 5]) is None
    assert kappa_of([0, 0, 0, 0]) is None
    assert kappa_of([0, 5, 0, 0]) == 0.0  # always opposite, but each constant: p_e = 0


# --- the report of records ------------------------------------------------------------------


def rated(trace_id: str, *labels: tuple[str, tuple[int, int, int, int]], **kw: Any) -> Any:
    """A ``traces`` corpus record with these current labels (labeler, four ratings)."""
    value = record(trace_id, source=None, reward=None, passed=None, **kw)
    value["human_labels"] = [
        {"labeler": who, "rubric": dict(zip(DIMENSIONS, r, strict=True)), "comment": None,
         "occurred_at": "2026-01-02T00:00:00Z"}
        for who, r in sorted(labels)
    ]  # fmt: skip
    value["labels_count"] = len(labels)
    value["labelers"] = sorted(who for who, _ in labels)
    return value


def judged(value: dict[str, Any], *results: tuple[str, float, bool]) -> dict[str, Any]:
    value["evaluation"] = {
        "evaluation_id": "ev", "occurred_at": "2026-01-02T00:00:00Z", "report": {},
        "results": [{"evaluator": e, "score": s, "passed": p, "reasoning": "r"}
                    for e, s, p in results],
    }  # fmt: skip
    return value


def report_of(records: list[dict[str, Any]], **kw: Any) -> dict[str, Any]:
    builder = AgreementBuilder()
    for value in records:
        builder.add(value)
    out: dict[str, Any] = agreement_report(builder.build(), **kw).model_dump(mode="json")
    return out


def test_the_report_of_records() -> None:
    a = judged(rated("a", ("ana", (4, 4, 4, 4)), ("bo", (4, 4, 4, 2))),
               ("judge", 0.9, True), ("tone", 0.4, False))  # fmt: skip
    b = judged(
        rated("b", ("ana", (2, 2, 2, 2)), ("bo", (1, 2, 2, 2)), ("cy", (2, 2, 3, 3))),
        ("judge", 0.3, False),
        ("judge", 0.2, False),
    )  # the last result counts
    c = judged(rated("c", ("cy", (5, 5, 5, 5))), ("judge", 0.7, True))
    d = judged(rated("d"), ("judge", 0.5, True))  # no label: not compared
    d["skipped_by"] = ["bo", "dee"]
    old = record("old", source=None, reward=None, passed=None, labels=2)
    del old["human_labels"]  # written before records carried labels: ratings unknown
    gone = {"trace_id": "gone", "revision": 9, "deleted": True}
    report = report_of([a, b, c, d, old, gone])

    assert set(report) == {"traces", "labeled", "multi_labeled", "labelers", "dimensions",
                           "labelers_detail", "evaluators"}  # fmt: skip
    assert (report["traces"], report["labeled"], report["multi_labeled"]) == (5, 4, 3)
    assert report["labelers"] == 4
    assert set(report["dimensions"]) == {*DIMENSIONS, "reward"}
    assert all(d["units"] == 2 for d in report["dimensions"].values())
    # Rewards: a: ana 16/20, bo 14/20; b: ana 8/20, bo 7/20, cy 10/20; c: cy 20/20.
    detail = {d["labeler"]: d for d in report["labelers_detail"]}
    assert list(detail) == ["ana", "bo", "cy", "dee"]
    assert detail["ana"] == {"labeler": "ana", "labels": 2, "skips": 0,
                             "mean_reward": pytest.approx((0.8 + 0.4) / 2),
                             # |.8 - .7| on a, |.4 - (.35 + .5) / 2| on b
                             "mean_abs_diff": pytest.approx((0.1 + 0.025) / 2)}  # fmt: skip
    assert detail["bo"]["skips"] == 1
    assert detail["bo"]["mean_abs_diff"] == pytest.approx((0.1 + 0.1) / 2)  # |.35 - .45|
    assert detail["cy"]["mean_reward"] == pytest.approx((0.5 + 1.0) / 2)
    assert detail["cy"]["mean_abs_diff"] == pytest.approx(0.125)  # b only: |.5 - .375|
    assert detail["dee"] == {"labeler": "dee", "labels": 0, "skips": 1, "mean_reward": None,
                             "mean_abs_diff": None}  # fmt: skip
    # Human rewards a 0.75 (passed at 0.7), b 25/60 (failed), c 1.0 (passed).
    judge, tone = report["evaluators"]
    assert (judge["evaluator"], judge["traces"]) == ("judge", 3)
    assert judge["spearman"] == pytest.approx(0.5)  # ranks (3, 1, 2) against (2, 1, 3)
    assert judge["pass_kappa"] == 1.0
    # One trace: no rank correlation; kappa is defined (each side constant, p_e = 0).
    assert tone == {"evaluator": "tone", "traces": 1, "spearman": None, "pass_kappa": 0.0}


def test_evaluators_against_human_rewards_that_tie_across_label_counts() -> None:
    # Rewards such as 16/20 and 32/40 are equal: they must share a rank.
    rng = np.random.default_rng(11)
    records, human, scores, verdicts, counts = [], [], [], [], []
    for n in range(200):
        count = int(rng.integers(1, 4))
        ratings = [tuple(int(v) for v in rng.integers(3, 6, 4)) for _ in range(count)]
        score = round(float(rng.random()), 1)  # ties among scores too
        records.append(judged(rated(f"t{n}", *[(f"l{k}", r) for k, r in enumerate(ratings)]),
                              ("judge", score, score >= 0.5)))  # fmt: skip
        human.append(sum(map(sum, ratings)) / (20 * count))
        counts.append(count)
        scores.append(score)
        verdicts.append((score >= 0.5, human[-1] >= 0.7))
    (judge,) = report_of(records, resamples=5)["evaluators"]
    assert judge["traces"] == 200
    counts_of = {}  # each reward, and the label counts it came from
    for reward, count in zip(human, counts, strict=True):
        counts_of.setdefault(reward, set()).add(count)
    assert any(len(c) > 1 for c in counts_of.values())  # equal rewards from different counts
    assert judge["spearman"] == pytest.approx(stats.spearmanr(scores, human).statistic, abs=1e-12)
    table = [sum(1 for v in verdicts if v == want) for want in
             [(True, True), (True, False), (False, True), (False, False)]]  # fmt: skip
    n, agree = 200, table[0] + table[3]
    chance = ((table[0] + table[1]) * (table[0] + table[2])
              + (table[2] + table[3]) * (table[1] + table[3])) / n**2  # fmt: skip
    assert judge["pass_kappa"] == pytest.approx((agree / n - chance) / (1 - chance), abs=1e-12)


def test_the_reward_alpha_is_interval_over_each_labelers_own_reward() -> None:
    rng = np.random.default_rng(5)
    records, data = [], np.full((6, 30), NAN)
    for n in range(30):
        who = sorted(rng.choice(6, size=int(rng.integers(1, 4)), replace=False))
        labels = [(f"l{k}", tuple(int(v) for v in rng.integers(1, 6, 4))) for k in who]
        records.append(rated(f"t{n}", *labels))
        for k, (_, ratings) in zip(who, labels, strict=True):
            data[k, n] = sum(ratings)
    report = report_of(records, resamples=10)
    pairable = data[:, (~np.isnan(data)).sum(axis=0) >= 2]
    expected = krippendorff.alpha(pairable, level_of_measurement="interval")
    assert report["dimensions"]["reward"]["alpha"] == pytest.approx(expected, abs=1e-9)
    assert report["dimensions"]["reward"]["units"] == pairable.shape[1]


def test_an_empty_report_has_nulls_and_counts_of_zero() -> None:
    report = report_of([])
    assert (report["traces"], report["labeled"], report["labelers"]) == (0, 0, 0)
    assert report["dimensions"]["reward"] == {"alpha": None, "ci95": None, "units": 0}
    assert (report["labelers_detail"], report["evaluators"]) == ([], [])


def test_the_input_is_checked() -> None:
    def make(**kw: Any) -> AgreementInput:
        fields: dict[str, Any] = {
            "traces": 1, "labelers": ("ana",), "label_trace": np.array([0]),
            "label_labeler": np.array([0]), "ratings": np.array([[1, 2, 3, 4]], np.int8),
            "pass_threshold": np.array([0.7]), "skips": np.array([0]),
        }  # fmt: skip
        return AgreementInput(**(fields | kw))

    make()
    with pytest.raises(ValueError, match=r"rating is outside 1\.\.5"):
        make(ratings=np.array([[1, 2, 3, 6]], np.int8))
    with pytest.raises(ValueError, match=r"label_trace holds an index outside 0\.\.0"):
        make(label_trace=np.array([1]))
    with pytest.raises(ValueError, match="differ in length"):
        make(label_labeler=np.array([0, 0]))
    with pytest.raises(ValueError, match="pass_threshold"):
        make(pass_threshold=np.array([0.7, 0.7]))
