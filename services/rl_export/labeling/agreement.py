"""The agreement report (docs/guides/labeling.md), pure: how far labelers agree with each other,
and how far each evaluator agrees with them.

The report is a function of a columnar input, :class:`AgreementInput` (numpy arrays: a row
per current label, a row per evaluator result, a value per trace and per labeler), so the
web service can fill it from its DuckDB index and the command line from records
(:class:`AgreementBuilder`, in memory proportional to the labels and results, not to the
records)::

    builder = AgreementBuilder()
    for record in latest_records:          # the traces corpus, filtered
        builder.add(record)
    report = agreement_report(builder.build())
    report.model_dump(mode="json")         # section 8's JSON object

How the report is computed (:func:`agreement_report`; the steps match the code):

1. Per trace, the number of current labels and the sum of their ratings; a label's own
   reward is its four ratings summed / 20.
2. Krippendorff's alpha over the *units*, the traces with at least two current labels: one
   value per labeler, **ordinal** for each dimension's rating, **interval** for the labeler's
   reward (:func:`alpha_with_interval`). Alpha depends on the data only through the coincidence
   matrix, a sum over units of a term that depends only on the unit's multiset of values (its
   *pattern*: how many labelers gave each value). So units are grouped by pattern
   (:func:`patterns`), the point estimate is alpha of the weighted sum, and a bootstrap
   resample of units is a multinomial draw of the patterns' counts: 1,000 resamples cost a
   multinomial draw and a (1,000 x patterns) matrix product, whatever the number of units, and
   are exact in distribution. The 95 % interval is the 2.5th and 97.5th percentiles of the
   resamples' alphas (resamples with no variation left out), fixed seed. The unit tests check
   these alphas against the ``krippendorff`` package, on Krippendorff's published example and
   on explicit resamples. (The package itself builds a units x values x values array: 7.8 s and
   1.4 GB for the reward over 200,000 units here, so it is the tests' reference, not the
   report's engine.)
3. Per labeler: labels, skips, mean reward, and the mean absolute difference between their
   reward and the mean reward of the other labelers of the same traces.
4. Per evaluator, over the traces with both its result and at least one current label:
   Spearman's rho (Pearson's correlation of average ranks: ties share the mean of their
   ranks) between its score and the human reward, and Cohen's kappa between its ``passed``
   and the human ``passed`` (reward >= the trace's pass threshold, computed as the join
   does). Each is null when undefined (fewer than two traces or a constant side for rho;
   chance agreement of 1 for kappa). The unit tests check rho against scipy's
   ``spearmanr`` and published examples; the ranks are this module's own, as scipy's stable
   sort made them the report's largest cost (:func:`average_ranks`).

A record written before records carried ``labels`` has labels whose ratings are unknown: it
counts in ``traces``, ``labeled`` and ``multi_labeled`` (from ``labels_count``) and its skips
count, but no rating of it enters alpha, the labelers' figures or the evaluators' (their
``units`` and ``traces`` say how many traces did).
"""

from __future__ import annotations

from array import array
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np
import numpy.typing as npt
from pydantic import BaseModel, ConfigDict

from rl_export.model.events import Rubric

DIMENSIONS: tuple[str, ...] = tuple(Rubric.model_fields)
"""The rubric's dimensions, in the order of :attr:`AgreementInput.ratings`' columns."""
RATINGS = 5  # each rating is 1..5
RESAMPLES = 1000
SEED = 30  # the bootstrap's fixed seed: the same input gives the same interval

Level = Literal["nominal", "ordinal", "interval"]  # the report uses ordinal and interval
IntArray = npt.NDArray[np.int64]
FloatArray = npt.NDArray[np.float64]


# --- the report (section 8's JSON shape) ----------------------------------------------------


class _Out(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class Alpha(_Out):
    """Krippendorff's alpha with its bootstrap 95 % interval, over ``units`` traces."""

    alpha: float | None
    ci95: tuple[float, float] | None
    units: int


class Dimensions(_Out):
    correctness: Alpha
    helpfulness: Alpha
    efficiency: Alpha
    safety: Alpha
    reward: Alpha


class LabelerDetail(_Out):
    labeler: str
    labels: int
    skips: int
    mean_reward: float | None
    mean_abs_diff: float | None


class EvaluatorDetail(_Out):
    evaluator: str
    traces: int
    spearman: float | None
    pass_kappa: float | None


class AgreementReport(_Out):
    """docs/guides/labeling.md's agreement report."""

    traces: int
    labeled: int
    multi_labeled: int
    labelers: int
    dimensions: Dimensions
    labelers_detail: list[LabelerDetail]
    evaluators: list[EvaluatorDetail]


# --- the input ------------------------------------------------------------------------------


@dataclass(frozen=True)
class AgreementInput:
    """The report's input, a column per field. Traces are numbered ``0 .. traces - 1``,
    labelers and evaluators by their place in ``labelers`` / ``evaluators``.

    One row per current label (at most one per trace and labeler): ``label_trace``,
    ``label_labeler`` and ``ratings`` (``(labels, 4)``, 1..5, columns in :data:`DIMENSIONS`
    order). One row per evaluator result of a trace's current evaluation (at most one per
    trace and evaluator): ``result_trace``, ``result_evaluator``, ``result_score`` (0..1),
    ``result_passed``. Per trace its human ``pass_threshold``; per labeler their ``skips``.
    ``unrated_labeled`` / ``unrated_multi_labeled`` count traces with at least one / two
    current labels whose ratings are unknown (records written before ``labels``)."""

    traces: int
    labelers: tuple[str, ...]
    label_trace: IntArray
    label_labeler: IntArray
    ratings: npt.NDArray[np.int8]
    pass_threshold: FloatArray
    skips: IntArray
    evaluators: tuple[str, ...] = ()
    result_trace: IntArray = field(default_factory=lambda: np.zeros(0, np.int64))
    result_evaluator: IntArray = field(default_factory=lambda: np.zeros(0, np.int64))
    result_score: FloatArray = field(default_factory=lambda: np.zeros(0, np.float64))
    result_passed: npt.NDArray[np.bool_] = field(default_factory=lambda: np.zeros(0, np.bool_))
    unrated_labeled: int = 0
    unrated_multi_labeled: int = 0

    def __post_init__(self) -> None:
        """Check the shapes and ranges (cheap: a few passes over the columns)."""
        labels = len(self.label_trace)
        if len(self.label_labeler) != labels or self.ratings.shape != (labels, len(DIMENSIONS)):
            raise ValueError("label_trace, label_labeler and ratings (labels x 4) differ in length")
        results = len(self.result_trace)
        if not len(self.result_evaluator) == len(self.result_score) == len(self.result_passed):
            raise ValueError("the result columns differ in length")
        if len(self.result_evaluator) != results:
            raise ValueError("the result columns differ in length")
        if len(self.pass_threshold) != self.traces or len(self.skips) != len(self.labelers):
            raise ValueError("pass_threshold needs a value per trace, skips one per labeler")
        _check_range("label_trace", self.label_trace, self.traces)
        _check_range("label_labeler", self.label_labeler, len(self.labelers))
        _check_range("result_trace", self.result_trace, self.traces)
        _check_range("result_evaluator", self.result_evaluator, len(self.evaluators))
        if labels and (self.ratings.min() < 1 or self.ratings.max() > RATINGS):
            raise ValueError("a rating is outside 1..5")


def _check_range(name: str, values: IntArray, bound: int) -> None:
    if len(values) and (values.min() < 0 or values.max() >= bound):
        raise ValueError(f"{name} holds an index outside 0..{bound - 1}")


class AgreementBuilder:
    """Builds an :class:`AgreementInput` from trajectory records, one at a time.

    Reads ``human_labels`` (missing: ratings unknown, ``labels_count`` counts), ``skipped_by``,
    ``pass_threshold`` and ``evaluation.results`` (an evaluator named twice: its last
    result, as the record's ``evaluator_scores``). Tombstones are not traces.
    """

    FIELDS = frozenset(
        {"human_labels", "labels_count", "skipped_by", "pass_threshold", "evaluation", "deleted"}
    )
    """The record fields :meth:`add` reads (an export's scan may parse only these)."""

    def __init__(self) -> None:
        self.traces = 0
        self._labelers: dict[str, int] = {}
        self._evaluators: dict[str, int] = {}
        self._skips: array[int] = array("q")
        self._label_trace: array[int] = array("q")
        self._label_labeler: array[int] = array("q")
        self._ratings: array[int] = array("b")
        self._threshold: array[float] = array("d")
        self._result_trace: array[int] = array("q")
        self._result_evaluator: array[int] = array("q")
        self._result_score: array[float] = array("d")
        self._result_passed: array[int] = array("b")
        self._unrated = [0, 0]

    def _labeler(self, name: str) -> int:
        found = self._labelers.get(name)
        if found is None:
            found = self._labelers[name] = len(self._labelers)
            self._skips.append(0)
        return found

    def add(self, record: Mapping[str, Any]) -> None:
        """Take one latest record (of the ``traces`` corpus, usually)."""
        if record.get("deleted"):
            return
        trace = self.traces
        self.traces += 1
        self._threshold.append(float(record["pass_threshold"]))
        labels = record.get("human_labels")
        if labels is None:  # written before records carried labels: ratings unknown
            count = record.get("labels_count") or 0
            self._unrated[0] += count >= 1
            self._unrated[1] += count >= 2
        else:
            # Version-0 rating labels enter the ratings; the others (another rubric version's,
            # labeling/questions.py) only the counts, as labels whose ratings are unknown.
            rated = [x for x in labels if "answers" not in x]
            others = sum(x.get("kind", "label") == "label" for x in labels) - len(rated)
            self._unrated[0] += others and not rated
            self._unrated[1] += others and len(rated) < 2 <= len(rated) + others
            for label in rated:
                self._label_trace.append(trace)
                self._label_labeler.append(self._labeler(label["labeler"]))
                rubric = label["rubric"]
                self._ratings.extend(rubric[d] for d in DIMENSIONS)
        for name in record.get("skipped_by") or ():
            self._skips[self._labeler(name)] += 1
        evaluation = record.get("evaluation")
        results = evaluation.get("results") if isinstance(evaluation, Mapping) else None
        latest = {r["evaluator"]: r for r in results or ()}
        for name, result in latest.items():
            index = self._evaluators.setdefault(name, len(self._evaluators))
            self._result_trace.append(trace)
            self._result_evaluator.append(index)
            self._result_score.append(float(result["score"]))
            self._result_passed.append(bool(result["passed"]))

    def build(self) -> AgreementInput:
        """The input of everything added so far."""
        return AgreementInput(
            traces=self.traces,
            labelers=tuple(self._labelers),
            label_trace=np.frombuffer(self._label_trace, np.int64).copy(),
            label_labeler=np.frombuffer(self._label_labeler, np.int64).copy(),
            ratings=np.frombuffer(self._ratings, np.int8).reshape(-1, len(DIMENSIONS)).copy(),
            pass_threshold=np.frombuffer(self._threshold, np.float64).copy(),
            skips=np.frombuffer(self._skips, np.int64).copy(),
            evaluators=tuple(self._evaluators),
            result_trace=np.frombuffer(self._result_trace, np.int64).copy(),
            result_evaluator=np.frombuffer(self._result_evaluator, np.int64).copy(),
            result_score=np.frombuffer(self._result_score, np.float64).copy(),
            result_passed=np.frombuffer(self._result_passed, np.int8).astype(np.bool_),
            unrated_labeled=self._unrated[0],
            unrated_multi_labeled=self._unrated[1],
        )


# --- Krippendorff's alpha over patterns -----------------------------------------------------


def value_counts(units: IntArray, values: IntArray, domain: int) -> IntArray:
    """``(units, domain)``: how many labelers gave each value (``0 .. domain - 1``) to each
    unit (``0 .. units.max()``)."""
    count = int(units.max()) + 1 if len(units) else 0
    flat = np.bincount(values * count + units, minlength=count * domain)
    # Laid out value by value (a transposed view): patterns reads it a value at a time.
    counts: IntArray = flat.reshape(domain, count).T
    return counts


def patterns(counts: IntArray) -> tuple[IntArray, IntArray]:
    """The distinct rows of ``counts`` and how many units have each: ``(rows, weights)``.

    A row becomes one integer (mixed radix, a digit per value); when the next digit would
    overflow, the keys so far are renumbered densely first, so any row width works."""
    units = len(counts)
    key = np.zeros(units, np.int64)
    span = 1  # keys are below span (a Python int: no overflow in the check)
    for column in counts.T:
        base = int(column.max(initial=0)) + 1
        if span * base >= 1 << 62:
            _, key = np.unique(key, return_inverse=True)
            key = key.astype(np.int64)
            span = int(key.max(initial=0)) + 1
        key = key * base + column
        span *= base
    _, first, weights = np.unique(key, return_index=True, return_counts=True)
    return counts[first], weights.astype(np.int64)


def coincidences(rows: IntArray) -> FloatArray:
    """Each pattern's term of the coincidence matrix, flattened: ``(patterns, V * V)``.

    A unit of m values contributes, for every ordered pair of its values by two different
    labelers, 1 / (m - 1) to the pair's cell (Krippendorff 2011, section C)."""
    pairable = rows.sum(axis=1)
    outer = rows[:, :, None] * rows[:, None, :]
    diagonal = np.arange(rows.shape[1])
    outer[:, diagonal, diagonal] -= rows  # a value is not paired with itself
    terms: FloatArray = (outer / (pairable - 1)[:, None, None]).reshape(len(rows), -1)
    return terms


def _distances(level: Level, totals: FloatArray, values: FloatArray) -> FloatArray:
    """The squared distances between values, ``(resamples, V, V)``, from each resample's
    value totals ``(resamples, V)`` (ordinal distances depend on them)."""
    if level != "ordinal":
        delta = values[:, None] - values[None, :]
        square = (delta != 0).astype(np.float64) if level == "nominal" else delta * delta
        return np.broadcast_to(square, (len(totals), *delta.shape))
    # ordinal: (sum of n_g for g from c to k, minus (n_c + n_k) / 2) squared
    cumulative = np.cumsum(totals, axis=1)
    size = totals.shape[1]
    low = np.minimum.outer(np.arange(size), np.arange(size))
    high = np.maximum.outer(np.arange(size), np.arange(size))
    between = cumulative[:, high] - cumulative[:, low] + totals[:, low]
    delta = between - (totals[:, low] + totals[:, high]) / 2
    return delta * delta


def alphas(drawn: FloatArray, terms: FloatArray, level: Level, values: FloatArray) -> FloatArray:
    """Alpha of each resample, given as how many units of each pattern it holds
    (``(resamples, patterns)``; the patterns' :func:`coincidences` are ``terms``); NaN where
    it is undefined (no variation: the expected disagreement is 0).

    Ordinal distances depend on each resample's value totals, so its whole coincidence
    matrix is made. Interval and nominal distances are fixed: what alpha needs of a
    resample, its observed disagreement and its value totals, is then linear in the counts,
    one (patterns x (1 + V)) product instead of (patterns x V * V)."""
    size = len(values)
    if level == "ordinal":
        o = (drawn @ terms).reshape(len(drawn), size, size)
        totals = o.sum(axis=1)
        distances = _distances(level, totals, values)
        disagreement = np.einsum("bvw,bvw->b", o, distances)
    else:
        fixed = _distances(level, np.zeros((1, size)), values)
        per_pattern = np.column_stack(
            [terms @ fixed[0].ravel(), terms.reshape(len(terms), size, size).sum(axis=1)]
        )
        found = drawn @ per_pattern
        disagreement, totals = found[:, 0], found[:, 1:]
        distances = np.broadcast_to(fixed[0], (len(drawn), size, size))
    n = totals.sum(axis=1)
    expected = np.einsum("bv,bw,bvw->b", totals, totals, distances)  # the diagonal's 0
    out = np.full(len(drawn), np.nan)
    defined = expected > 0
    out[defined] = 1 - (n[defined] - 1) * disagreement[defined] / expected[defined]
    return out


def alpha_with_interval(
    units: IntArray,
    values: IntArray,
    domain: int,
    level: Level,
    *,
    resamples: int = RESAMPLES,
    seed: int = SEED,
    scale: FloatArray | None = None,
) -> Alpha:
    """Krippendorff's alpha of the pairable values ``values[i]`` (``0 .. domain - 1``,
    equally spaced, or standing for ``scale[values[i]]``) of units ``units[i]`` (``0 .. U -
    1``, each with at least two), and its bootstrap 95 % interval over units."""
    counts = value_counts(units, values, domain)
    count = len(counts)
    if count < 2:
        return Alpha(alpha=None, ci95=None, units=count)
    rows, weights = patterns(counts)
    terms = coincidences(rows)
    if scale is None:
        scale = np.arange(domain, dtype=np.float64)
    point = alphas(weights[None, :].astype(np.float64), terms, level, scale)[0]
    if not np.isfinite(point):
        return Alpha(alpha=None, ci95=None, units=count)
    rng = np.random.default_rng(seed)
    drawn = rng.multinomial(count, weights / count, size=resamples).astype(np.float64)
    spread = alphas(drawn, terms, level, scale)
    spread = spread[np.isfinite(spread)]  # resamples left with no variation have no alpha
    if not len(spread):
        return Alpha(alpha=float(point), ci95=None, units=count)
    low, high = np.percentile(spread, [2.5, 97.5])
    return Alpha(alpha=float(point), ci95=(float(low), float(high)), units=count)


# --- Spearman's rho and Cohen's kappa -------------------------------------------------------


def average_ranks(x: FloatArray) -> FloatArray:
    """1-based ranks, ties given the mean of the ranks they span (scipy's ``rankdata``, which
    the tests compare it with; that one sorts stably, here an unstable sort does: 130 against
    35 ms for 450,000 scores here, three times per report)."""
    order = np.argsort(x)  # the order among equal values does not matter: they are averaged
    ordered = x[order]
    first = np.empty(len(x), np.bool_)
    first[:1] = True
    np.not_equal(ordered[1:], ordered[:-1], out=first[1:])
    starts = np.flatnonzero(first)  # where each run of equal values starts, and ends below
    ends = np.append(starts[1:], len(x))
    ranks = np.empty(len(x), np.float64)
    ranks[order] = ((starts + ends + 1) / 2)[np.cumsum(first) - 1]
    return ranks


def spearman(x: FloatArray, y: FloatArray) -> float | None:
    """Spearman's rank correlation: Pearson's of the average ranks; None with fewer than two
    pairs or a constant side."""
    if len(x) < 2 or np.all(x == x[0]) or np.all(y == y[0]):
        return None
    return _pearson(average_ranks(x), average_ranks(y))


def spearman_coded(x: FloatArray, codes: IntArray, count: int) -> float | None:
    """:func:`spearman` of ``x`` against values given as order-preserving codes ``0 ..
    count - 1`` (equal values, equal codes): those are ranked by counting, without a sort.
    The human rewards take few values; ranking them so saves a sort per evaluator."""
    if len(x) < 2 or np.all(x == x[0]) or np.all(codes == codes[0]):
        return None
    tally = np.bincount(codes, minlength=count)
    below = np.cumsum(tally) - tally
    ranks = (below + (tally + 1) / 2)[codes]  # the average of the ranks a tie spans
    return _pearson(average_ranks(x), ranks)


def _pearson(a: FloatArray, b: FloatArray) -> float | None:
    a, b = a - a.mean(), b - b.mean()
    r = float(a @ b / np.sqrt((a @ a) * (b @ b)))
    return min(max(r, -1.0), 1.0) if np.isfinite(r) else None


def cohen_kappa(a: npt.NDArray[np.bool_], b: npt.NDArray[np.bool_]) -> float | None:
    """Cohen's kappa of two raters' yes/no verdicts on the same items: (p_o - p_e) /
    (1 - p_e), in integer counts; None when chance agreement p_e is 1 (or no item)."""
    n = len(a)
    if n == 0:
        return None
    yes_a, yes_b = int(a.sum()), int(b.sum())
    agree = int(np.count_nonzero(a == b))
    chance = yes_a * yes_b + (n - yes_a) * (n - yes_b)  # p_e * n * n
    if chance == n * n:
        return None
    return (agree * n - chance) / (n * n - chance)


# --- the report -----------------------------------------------------------------------------


def agreement_report(
    data: AgreementInput, *, resamples: int = RESAMPLES, seed: int = SEED
) -> AgreementReport:
    """The agreement report of the input (see the module for the steps)."""
    # 1. Labels per trace, each label's reward sum (4..20), each trace's sum.
    per_trace = np.bincount(data.label_trace, minlength=data.traces)
    sums = data.ratings.sum(axis=1, dtype=np.int64)
    trace_sums = np.asarray(
        np.bincount(data.label_trace, weights=sums, minlength=data.traces), np.float64
    )  # sums of integers, exact in float64
    labeled = int(np.count_nonzero(per_trace >= 1)) + data.unrated_labeled
    multi = int(np.count_nonzero(per_trace >= 2)) + data.unrated_multi_labeled

    # 2. Alpha over the units (traces with at least two labels), numbered 0 .. U - 1.
    pairable = per_trace[data.label_trace] >= 2
    unit_of = np.cumsum(per_trace >= 2) - 1
    units = unit_of[data.label_trace[pairable]]
    paired = data.ratings[pairable].T.astype(np.int64) - 1  # a row per dimension, 0 .. 4
    reward_values = sums[pairable] - len(DIMENSIONS)  # 0 .. 16: (sum - 4), spaced like sum / 20
    # The two largest steps, the reward's resamples and the evaluators' ranks, run in threads
    # beside the rest (numpy's multinomial draws and sorts release the GIL): the same
    # figures, each step with its own seeded generator, in about two thirds of the time on
    # two cores.
    with ThreadPoolExecutor(2, thread_name_prefix="agreement") as pool:
        reward = pool.submit(
            alpha_with_interval, units, reward_values,
            RATINGS * len(DIMENSIONS) - len(DIMENSIONS) + 1, "interval",
            resamples=resamples, seed=seed,
        )  # fmt: skip
        evaluators = pool.submit(_evaluators, data, per_trace, trace_sums)
        found: dict[str, Alpha] = {}
        for n, dimension in enumerate(DIMENSIONS):
            ratings = paired[n]
            found[dimension] = alpha_with_interval(
                units, ratings, RATINGS, "ordinal", resamples=resamples, seed=seed
            )
        details = _labelers(data, sums, per_trace, trace_sums)
        found["reward"] = reward.result()
        return AgreementReport(
            traces=data.traces,
            labeled=labeled,
            multi_labeled=multi,
            labelers=len(details),
            dimensions=Dimensions(**found),
            labelers_detail=details,
            evaluators=evaluators.result(),
        )


def _labelers(
    data: AgreementInput, sums: IntArray, per_trace: IntArray, trace_sums: FloatArray
) -> list[LabelerDetail]:
    """3. Per labeler with a label or a skip, by name."""
    count = len(data.labelers)
    who = data.label_labeler
    labels = np.bincount(who, minlength=count)
    reward_sums = np.bincount(who, weights=sums, minlength=count)
    # Against the mean of the other labelers of the same trace: (trace sum - own) / (n - 1).
    shared = per_trace[data.label_trace] >= 2
    others = per_trace[data.label_trace[shared]] - 1
    mean_others = (trace_sums[data.label_trace[shared]] - sums[shared]) / others
    gaps = np.abs(sums[shared] - mean_others) / 20
    gap_sums = np.bincount(who[shared], weights=gaps, minlength=count)
    gap_counts = np.bincount(who[shared], minlength=count)
    out = []
    for n in sorted(range(count), key=lambda k: data.labelers[k]):
        if not labels[n] and not data.skips[n]:
            continue
        out.append(
            LabelerDetail(
                labeler=data.labelers[n],
                labels=int(labels[n]),
                skips=int(data.skips[n]),
                mean_reward=float(reward_sums[n] / (20 * labels[n])) if labels[n] else None,
                mean_abs_diff=float(gap_sums[n] / gap_counts[n]) if gap_counts[n] else None,
            )
        )
    return out


def _reward_codes(sums: IntArray, counts: IntArray) -> tuple[IntArray, int]:
    """Each trace's human reward ``sums / (20 * counts)`` as an order-preserving code (equal
    rewards, equal codes), and how many codes: from the few (sum, count) pairs present, so
    the traces' rewards are never sorted."""
    width = int(counts.max(initial=0)) + 1
    key = sums * width + counts
    present = np.flatnonzero(np.bincount(key[counts >= 1], minlength=1))
    rewards = (present // width) / (20 * (present % width))  # as the join divides
    distinct, codes = np.unique(rewards, return_inverse=True)
    lookup = np.zeros(int(key.max(initial=0)) + 1, np.int64)
    lookup[present] = codes
    return lookup[key], len(distinct)


def _evaluators(
    data: AgreementInput, per_trace: IntArray, trace_sums: FloatArray
) -> list[EvaluatorDetail]:
    """4. Per evaluator, by name: rho and kappa against the human reward and verdict."""
    with np.errstate(invalid="ignore", divide="ignore"):  # unlabeled traces: NaN, not used
        human_reward = trace_sums / (20 * per_trace)
        human_passed = human_reward >= data.pass_threshold  # as the join decides it
    labeled = per_trace >= 1
    code, distinct = _reward_codes(trace_sums.astype(np.int64), per_trace)
    both = labeled[data.result_trace]
    trace = data.result_trace[both]
    evaluator = data.result_evaluator[both]
    score, passed = data.result_score[both], data.result_passed[both]
    out = []
    for n in sorted(range(len(data.evaluators)), key=lambda k: data.evaluators[k]):
        mine = evaluator == n
        traces = trace[mine]
        out.append(
            EvaluatorDetail(
                evaluator=data.evaluators[n],
                traces=len(traces),
                spearman=spearman_coded(score[mine], code[traces], distinct),
                pass_kappa=cohen_kappa(passed[mine], human_passed[traces]),
            )
        )
    return out
