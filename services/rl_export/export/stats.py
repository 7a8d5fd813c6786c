"""Summary statistics of a set of trajectory records (pure): the numbers ``rl-export stats``
prints and the API's ``GET stats`` returns, and the reward histogram the API adds.

``StatsAccumulator.add(record)`` for every record that passed the filters, then
``result()`` gives ``{records, avg_reward, pass_rate, human_labeled}``: ``avg_reward`` is the
mean over the records that have a reward and ``pass_rate`` the share of passed records among
those with a verdict (both null when none has one: the ``traces`` corpus); ``human_labeled``
counts records with at least one current human label. :func:`reward_histogram` counts
rewards in equal bins over 0..1 (the last bin includes 1.0).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any


def reward_histogram(rewards: Iterable[float], bins: int = 10) -> list[dict[str, Any]]:
    """``[{lo, hi, count}]`` over 0..1 in ``bins`` equal bins; a bin holds ``lo <= r < hi``,
    the last one ``lo <= r <= 1``."""
    if bins < 1:
        raise ValueError(f"bins must be at least 1, got {bins}")
    counts = [0] * bins
    for reward in rewards:
        counts[_bin(reward, bins)] += 1
    return _bins(counts)


def _bin(reward: float, bins: int) -> int:
    return min(max(int(reward * bins), 0), bins - 1)


def _bins(counts: list[int]) -> list[dict[str, Any]]:
    bins = len(counts)
    return [
        {"lo": round(n / bins, 10), "hi": round((n + 1) / bins, 10), "count": c}
        for n, c in enumerate(counts)
    ]


class StatsAccumulator:
    """Adds records up; :meth:`result` and :meth:`histogram` read the totals."""

    def __init__(self, bins: int = 10) -> None:
        self.records = 0
        self.rewarded = 0
        self.reward_sum = 0.0
        self.judged = 0
        self.passed = 0
        self.human_labeled = 0
        self._counts = [0] * bins

    def add(self, record: dict[str, Any]) -> None:
        self.records += 1
        reward = record.get("reward")
        if isinstance(reward, int | float) and not isinstance(reward, bool):
            self.rewarded += 1
            self.reward_sum += reward
            self._counts[_bin(reward, len(self._counts))] += 1
        passed = record.get("passed")
        if isinstance(passed, bool):
            self.judged += 1
            self.passed += passed
        if record.get("labels_count"):
            self.human_labeled += 1

    def result(self) -> dict[str, Any]:
        """``{records, avg_reward, pass_rate, human_labeled}``."""
        return {
            "records": self.records,
            "avg_reward": self.reward_sum / self.rewarded if self.rewarded else None,
            "pass_rate": self.passed / self.judged if self.judged else None,
            "human_labeled": self.human_labeled,
        }

    def histogram(self) -> list[dict[str, Any]]:
        """The rewards added so far as :func:`reward_histogram` bins."""
        return _bins(self._counts)
