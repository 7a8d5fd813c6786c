"""Ratings and agreement of comparisons (docs/guides/agreement.md), pure: which agent version
people prefer, by how much, how sure we are, and how far the labelers agree.

The input is columnar, :class:`RatingsInput` (a row per pair: the agent versions of its two
traces; a row per current vote: its pair, labeler and choice), filled from trajectory
records' ``comparisons`` (:class:`RatingsBuilder`: each pair is read from the record of its
``trace_a``, the smaller id, whose entries say ``win`` when the vote chose ``a``)::

    builder = RatingsBuilder()
    for record in latest_records:          # the traces corpus, filtered
        builder.add(record)
    ratings_report(builder.build()).model_dump(mode="json")   # section 12's JSON object

How the report is computed (:func:`ratings_report`; the steps match the code):

1. Each pair of two different agent versions gives, per vote, a win to the version chosen,
   or half a win to each for ``tie`` and ``both_bad`` (neither preferred: Chatbot Arena's
   rule for "both are bad"). Pairs of one version tell nothing of versions and are left
   out of the ratings (not of the agreement). ``wins[i, j]`` sums version i's wins over j.
2. Bradley-Terry by maximum likelihood: P(i beats j) = p_i / (p_i + p_j). With theta =
   log p, the log-likelihood sum w_ij log sigmoid(theta_i - theta_j) is concave; Newton's
   method (:func:`bradley_terry`, steps capped, many win matrices at once) finds its
   maximum with sum theta = 0. The maximum exists exactly when the graph "i won at least
   half a vote against j" is strongly connected (Hunter 2004, assumption 1); otherwise a
   version's strength runs off to infinity and the ratings are null.
3. The Elo scale: rating_i = 1000 + 400 log10(p_i) less the mean over versions, so a
   difference of 400 means odds of 10 to 1, and the mean is 1000.
4. A 95 % bootstrap interval over pairs (1,000 resamples, fixed seed): a pair's part of the
   win matrix depends only on its *pattern* (its two versions and its counts of a, b and
   tie votes), so a resample of pairs is a multinomial draw of the patterns' counts (exact
   in distribution, as the agreement report's bootstrap over units) and its wins are a sum
   over patterns. Resamples without a maximum are left out of the percentiles, as the
   agreement report leaves out resamples with no variation; no resample with one: null.
5. Agreement over the pairs with votes of two or more labelers: percent agreement (per pair,
   the share of its labelers' pairs that made the same choice, averaged over the pairs) and
   Krippendorff's alpha, nominal over the four choices (:func:`~rl_export.labeling.
   agreement.alpha_with_interval`).

The unit tests check the strengths against scipy's optimiser and a minorise-maximise
iteration, alpha against the ``krippendorff`` package, and the interval against an explicit
resampling of pairs.
"""

from __future__ import annotations

import math
from array import array
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt
from pydantic import BaseModel, ConfigDict

from rl_export.labeling.agreement import alpha_with_interval

CHOICES: tuple[str, ...] = ("a", "b", "tie", "both_bad")
"""A vote's choice, coded by its place here (``vote_choice``)."""
OUTCOME_CHOICE: dict[str, int] = {"win": 0, "loss": 1, "tie": 2, "both_bad": 3}
"""A ``comparisons`` entry's outcome, for the trace that holds it, as the choice it stands for
when that trace is ``trace_a``."""
RESAMPLES = 1000
SEED = 57  # the bootstrap's fixed seed: the same input gives the same interval
MEAN_RATING = 1000.0
ELO = 400.0 / math.log(10.0)  # natural log-strength to Elo points
MAX_STEP = 2.0  # the largest Newton step in any log-strength (keeps a far start from overshooting)
TOLERANCE = 1e-10
MAX_ITERATIONS = 200
CELLS_PER_CHUNK = 4_000_000  # resamples x patterns held at once by the bootstrap

IntArray = npt.NDArray[np.int64]
FloatArray = npt.NDArray[np.float64]


class _Out(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class Rating(_Out):
    """An agent version's Bradley-Terry rating on the Elo scale; ``comparisons``: its votes
    against other versions."""

    agent_version: str
    rating: float | None
    ci95: tuple[float, float] | None
    comparisons: int


class PairAgreement(_Out):
    """Agreement over ``pairs`` compared by two or more labelers (null below two pairs, or
    alpha when no choice varies)."""

    pairs: int
    percent: float | None
    alpha: float | None


class RatingsReport(_Out):
    """Section 12's ratings: ``GET comparisons/ratings``, ``rl-export ratings``."""

    ratings: list[Rating]
    agreement: PairAgreement


# --- the input ------------------------------------------------------------------------------


@dataclass(frozen=True)
class RatingsInput:
    """Pairs and votes, a column per field. ``pair_a`` / ``pair_b``: the agent versions
    (places in ``versions``) of the pair's ``trace_a`` and ``trace_b``; per current vote its
    pair (place in the pair columns), labeler (place in ``labelers``) and choice (place in
    :data:`CHOICES`), at most one per pair and labeler."""

    versions: tuple[str, ...]
    pair_a: IntArray
    pair_b: IntArray
    labelers: tuple[str, ...]
    vote_pair: IntArray
    vote_labeler: IntArray
    vote_choice: IntArray

    def __post_init__(self) -> None:
        if len(self.pair_a) != len(self.pair_b):
            raise ValueError("pair_a and pair_b differ in length")
        if not len(self.vote_pair) == len(self.vote_labeler) == len(self.vote_choice):
            raise ValueError("the vote columns differ in length")
        for name, values, bound in (
            ("pair_a", self.pair_a, len(self.versions)),
            ("pair_b", self.pair_b, len(self.versions)),
            ("vote_pair", self.vote_pair, len(self.pair_a)),
            ("vote_labeler", self.vote_labeler, len(self.labelers)),
            ("vote_choice", self.vote_choice, len(CHOICES)),
        ):
            if len(values) and (values.min() < 0 or values.max() >= bound):
                raise ValueError(f"{name} holds an index outside 0..{bound - 1}")
        if len(self.vote_pair):
            key = self.vote_pair * max(len(self.labelers), 1) + self.vote_labeler
            if len(np.unique(key)) != len(key):
                raise ValueError("a labeler has two votes on one pair")


class RatingsBuilder:
    """Builds a :class:`RatingsInput` from trajectory records, one at a time.

    Reads ``trace_id``, ``agent_version`` and ``comparisons``; a pair counts once both its
    traces were added (neither deleted nor filtered out) and is read from its ``trace_a``'s
    entries (``trace_id < other``): the record of ``trace_b`` holds the same votes, mirrored.
    Tombstones are not traces.
    """

    FIELDS = frozenset({"trace_id", "agent_version", "comparisons", "deleted"})
    """The record fields :meth:`add` reads."""

    def __init__(self) -> None:
        self._version_of: dict[str, str] = {}
        self._pairs: dict[str, tuple[str, str]] = {}  # pair_id -> (trace_a, trace_b)
        self._votes: dict[str, dict[str, int]] = {}  # pair_id -> labeler -> choice

    def add(self, record: Mapping[str, Any]) -> None:
        """Take one record (a tombstone or a record without a trace id counts for nothing)."""
        trace_id = record.get("trace_id")
        if record.get("deleted") is True or not isinstance(trace_id, str):
            return
        version = record.get("agent_version")
        self._version_of[trace_id] = version if isinstance(version, str) else ""
        for entry in record.get("comparisons") or ():
            if not isinstance(entry, Mapping):
                continue
            pair_id, other, labeler = entry.get("pair_id"), entry.get("other"), entry.get("labeler")
            choice = OUTCOME_CHOICE.get(str(entry.get("outcome")))
            if not isinstance(pair_id, str) or not isinstance(labeler, str):
                continue
            if not isinstance(other, str) or choice is None or trace_id >= other:
                continue  # trace_b's entries mirror trace_a's
            self._pairs[pair_id] = (trace_id, other)
            self._votes.setdefault(pair_id, {})[labeler] = choice

    def build(self) -> RatingsInput:
        """The input over the pairs both of whose traces were added, in pair id order."""
        versions: dict[str, int] = {}
        labelers: dict[str, int] = {}
        pair_a, pair_b = array("q"), array("q")
        vote_pair, vote_labeler, vote_choice = array("q"), array("q"), array("q")
        for pair_id in sorted(self._pairs):
            a, b = self._pairs[pair_id]
            if a not in self._version_of or b not in self._version_of:
                continue
            n = len(pair_a)
            pair_a.append(versions.setdefault(self._version_of[a], len(versions)))
            pair_b.append(versions.setdefault(self._version_of[b], len(versions)))
            for labeler, choice in sorted(self._votes[pair_id].items()):
                vote_pair.append(n)
                vote_labeler.append(labelers.setdefault(labeler, len(labelers)))
                vote_choice.append(choice)
        return RatingsInput(
            versions=tuple(versions),
            pair_a=np.asarray(pair_a, np.int64),
            pair_b=np.asarray(pair_b, np.int64),
            labelers=tuple(labelers),
            vote_pair=np.asarray(vote_pair, np.int64),
            vote_labeler=np.asarray(vote_labeler, np.int64),
            vote_choice=np.asarray(vote_choice, np.int64),
        )


# --- Bradley-Terry --------------------------------------------------------------------------


def has_maximum(wins: FloatArray) -> npt.NDArray[np.bool_]:
    """Per win matrix ``(..., V, V)``: whether the Bradley-Terry likelihood has a maximum,
    i.e. the graph "i won something against j" is strongly connected (reachability by
    repeated squaring)."""
    size = wins.shape[-1]
    reach = ((wins > 0) | np.eye(size, dtype=bool)).astype(np.float64)
    for _ in range(max(size - 1, 1).bit_length()):
        reach = (reach @ reach > 0).astype(np.float64)
    return np.asarray(reach.all(axis=(-2, -1)), np.bool_)


def bradley_terry(wins: FloatArray) -> FloatArray:
    """The maximum-likelihood log-strengths ``(R, V)`` (sum 0 per row) of win matrices
    ``(R, V, V)`` (``wins[r, i, j]``: i's wins over j, ties as halves); NaN rows where no
    maximum exists (:func:`has_maximum`). Newton's method on the concave log-likelihood,
    every matrix at once: the negative Hessian is a graph Laplacian, made invertible on the
    sum-zero plane by adding ``1 1^T / V``."""
    count, size = wins.shape[0], wins.shape[-1]
    theta = np.zeros((count, size))
    ok = has_maximum(wins)
    theta[~ok] = np.nan
    if size < 2 or not ok.any():
        return theta
    w = wins[ok]
    games = w + np.swapaxes(w, 1, 2)
    won = w.sum(axis=2)
    t = np.zeros((len(w), size))
    ones = np.full((size, size), 1.0 / size)
    active = np.ones(len(w), dtype=bool)
    for _ in range(MAX_ITERATIONS):
        idx = np.flatnonzero(active)
        if not len(idx):
            break
        diff = t[idx, :, None] - t[idx, None, :]
        s = 1.0 / (1.0 + np.exp(-diff))
        gradient = won[idx] - (games[idx] * s).sum(axis=2)
        h = games[idx] * s * (1.0 - s)
        laplacian = -h
        laplacian[:, np.arange(size), np.arange(size)] += h.sum(axis=2)
        step = np.linalg.solve(laplacian + ones, gradient[..., None])[..., 0]
        biggest = np.abs(step).max(axis=1)
        step *= np.minimum(1.0, MAX_STEP / np.maximum(biggest, 1e-300))[:, None]
        t[idx] += step
        t[idx] -= t[idx].mean(axis=1, keepdims=True)
        active[idx] = biggest > TOLERANCE
    theta[ok] = t
    return theta


def elo(theta: FloatArray) -> FloatArray:
    """Log-strengths as Elo ratings: 400 log10 odds, mean :data:`MEAN_RATING` per row."""
    centred = theta - theta.mean(axis=-1, keepdims=True)
    out: FloatArray = MEAN_RATING + ELO * centred
    return out


# --- the report -----------------------------------------------------------------------------


@dataclass(frozen=True)
class _Patterns:
    """Distinct pairs of different versions: ``low`` < ``high`` (version places), the wins of
    each over the other (ties as halves), and how many pairs have each pattern."""

    low: IntArray
    high: IntArray
    low_wins: FloatArray
    high_wins: FloatArray
    weights: IntArray


def _patterns(data: RatingsInput) -> _Patterns:
    pairs = len(data.pair_a)
    per_choice = np.zeros((pairs, len(CHOICES)), np.int64)
    np.add.at(per_choice, (data.vote_pair, data.vote_choice), 1)
    a_wins = per_choice[:, 0] + (per_choice[:, 2] + per_choice[:, 3]) / 2
    b_wins = per_choice[:, 1] + (per_choice[:, 2] + per_choice[:, 3]) / 2
    keep = (data.pair_a != data.pair_b) & (per_choice.sum(axis=1) > 0)
    flip = data.pair_a > data.pair_b
    low = np.where(flip, data.pair_b, data.pair_a)[keep]
    high = np.where(flip, data.pair_a, data.pair_b)[keep]
    low_wins = np.where(flip, b_wins, a_wins)[keep]
    high_wins = np.where(flip, a_wins, b_wins)[keep]
    if not len(low):
        empty = np.zeros(0, np.int64)
        return _Patterns(empty, empty, np.zeros(0), np.zeros(0), empty)
    rows = np.column_stack([low, high, low_wins * 2, high_wins * 2]).astype(np.int64)
    unique, weights = np.unique(rows, axis=0, return_counts=True)
    return _Patterns(unique[:, 0], unique[:, 1], unique[:, 2] / 2.0, unique[:, 3] / 2.0,
                     weights.astype(np.int64))  # fmt: skip


def _wins(p: _Patterns, drawn: FloatArray, size: int) -> FloatArray:
    """The win matrices ``(R, V, V)`` of resamples holding ``drawn[r, k]`` pairs of pattern k."""
    out = np.zeros((len(drawn), size * size))
    cells_low = p.low * size + p.high
    cells_high = p.high * size + p.low
    # A cell's wins are a sum over its patterns: one matrix product per side.
    for cells, wins in ((cells_low, p.low_wins), (cells_high, p.high_wins)):
        unique, where = np.unique(cells, return_inverse=True)
        spread = np.zeros((len(cells), len(unique)))
        spread[np.arange(len(cells)), where] = wins
        out[:, unique] += drawn @ spread
    return out.reshape(len(drawn), size, size)


def _comparisons(data: RatingsInput) -> IntArray:
    """Per version: its votes against another version."""
    a = data.pair_a[data.vote_pair]
    b = data.pair_b[data.vote_pair]
    other = a != b
    size = len(data.versions)
    counts: IntArray = np.bincount(a[other], minlength=size) + np.bincount(b[other], minlength=size)
    return counts


def _ratings(data: RatingsInput, resamples: int, seed: int) -> list[Rating]:
    counts = _comparisons(data)
    rated = np.flatnonzero(counts > 0)  # versions with a vote against another version
    if not len(rated):
        return []
    place = np.full(len(data.versions), -1, np.int64)
    place[rated] = np.arange(len(rated))
    p = _patterns(data)
    p = _Patterns(place[p.low], place[p.high], p.low_wins, p.high_wins, p.weights)
    size = len(rated)
    point = elo(bradley_terry(_wins(p, p.weights[None, :].astype(np.float64), size)))[0]
    intervals: list[tuple[float, float] | None] = [None] * size
    if np.isfinite(point).all() and resamples > 0:
        total = int(p.weights.sum())
        rng = np.random.default_rng(seed)
        found = []
        chunk = max(1, CELLS_PER_CHUNK // max(len(p.weights), 1))
        for start in range(0, resamples, chunk):
            drawn = rng.multinomial(total, p.weights / total, size=min(chunk, resamples - start))
            found.append(elo(bradley_terry(_wins(p, drawn.astype(np.float64), size))))
        spread = np.concatenate(found)
        spread = spread[np.isfinite(spread).all(axis=1)]  # resamples with no maximum
        if len(spread):
            low, high = np.percentile(spread, [2.5, 97.5], axis=0)
            intervals = [(float(lo), float(hi)) for lo, hi in zip(low, high, strict=True)]
    out = [
        Rating(
            agent_version=data.versions[v],
            rating=float(point[n]) if np.isfinite(point[n]) else None,
            ci95=intervals[n],
            comparisons=int(counts[v]),
        )
        for n, v in enumerate(rated)
    ]
    return sorted(out, key=lambda r: (-(r.rating or -math.inf), r.agent_version))


def pair_agreement(data: RatingsInput) -> PairAgreement:
    """Percent agreement and nominal alpha over the pairs with two or more votes."""
    votes = np.bincount(data.vote_pair, minlength=len(data.pair_a))
    multi = votes[data.vote_pair] >= 2
    units, values = data.vote_pair[multi], data.vote_choice[multi]
    pairs = int((votes >= 2).sum())
    if not pairs:
        return PairAgreement(pairs=0, percent=None, alpha=None)
    _, dense = np.unique(units, return_inverse=True)
    per_choice = np.zeros((pairs, len(CHOICES)), np.int64)
    np.add.at(per_choice, (dense, values), 1)
    m = per_choice.sum(axis=1)
    agreeing = (per_choice * (per_choice - 1)).sum(axis=1) / (m * (m - 1))
    alpha = alpha_with_interval(dense.astype(np.int64), values, len(CHOICES), "nominal",
                                resamples=0).alpha  # fmt: skip
    return PairAgreement(pairs=pairs, percent=float(agreeing.mean()), alpha=alpha)


def ratings_report(
    data: RatingsInput, *, resamples: int = RESAMPLES, seed: int = SEED
) -> RatingsReport:
    """Section 12's ratings and agreement of ``data`` (see the module)."""
    return RatingsReport(ratings=_ratings(data, resamples, seed), agreement=pair_agreement(data))
