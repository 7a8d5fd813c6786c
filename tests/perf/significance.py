"""Whether two sets of bench runs differ, as benchstat judges it.

On this machine single catch-ups of the same code differ by up to a factor of 1.5, more than
most steps a change makes: a ratio of two medians means something only with a test of the
runs behind it. benchstat's: the two-sided Mann-Whitney U test, exact (it assumes no
distribution, and counts how many of the runs' orders are as extreme as the one seen), and
a ratio whose p is 0.05 or more is printed as ``~``. Three runs of each can never show a
difference (their smallest p is 0.1); four can (0.029), when every run of one beats every
run of the other.
"""

from __future__ import annotations

import statistics

SIGNIFICANT_P = 0.05
"""benchstat's threshold: a ratio whose p is at or above it is no difference shown."""


def compare(control: list[float], tried: list[float]) -> dict[str, float]:
    """``tried`` against ``control`` (one number per run): the ratio of their medians and
    the two-sided p of the Mann-Whitney U test."""
    from scipy.stats import mannwhitneyu  # a dev tool's dependency: imported where used

    p = mannwhitneyu(tried, control, alternative="two-sided", method="exact").pvalue
    return {"ratio": statistics.median(tried) / statistics.median(control), "p": float(p)}


def verdict(comparison: dict[str, float]) -> str:
    """``1.23 (p=0.008)``, or ``~ (p=0.310)`` when the runs show no difference."""
    shown = comparison["p"] < SIGNIFICANT_P
    ratio = f"{comparison['ratio']:.2f}" if shown else "~"
    return f"{ratio} (p={comparison['p']:.3f})"
