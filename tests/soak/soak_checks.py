"""The soak's verdicts, pure: corpora against the fold, dead letters against what was meant.

:mod:`tests.soak.soak` reads the topics and the store; these functions only compare,
so their rules are unit-tested with made-up inputs.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from typing import Any

Source = tuple[str, int, int]
"""Where an input record is: (topic, partition, offset)."""


def compare_corpus(
    where: str, want: Mapping[str, dict[str, Any]], got: Mapping[str, dict[str, Any]]
) -> list[str]:
    """Differences between a corpus's expected and actual latest view (trace -> record)."""
    out = []
    for trace_id in sorted(set(want) - set(got)):
        out.append(f"{where}: {trace_id} missing (revision {want[trace_id]['revision']})")
    for trace_id in sorted(set(got) - set(want)):
        out.append(f"{where}: {trace_id} should not be there (revision "
                   f"{got[trace_id].get('revision')})")  # fmt: skip
    for trace_id in sorted(set(want) & set(got)):
        a, b = want[trace_id], got[trace_id]
        if a != b:
            keys = sorted(k for k in set(a) | set(b) if a.get(k) != b.get(k))
            out.append(f"{where}: {trace_id} differs in {', '.join(keys)} (revision "
                       f"{b.get('revision')}, expected {a.get('revision')})")  # fmt: skip
    return out


def check_dead_letters(
    meant: Mapping[Source, str], letters: Iterable[tuple[Source, str]]
) -> tuple[list[str], Counter[str]]:
    """Every record ``meant`` for the dead-letter topic is there once, with its reason, and
    no other record is. ``letters``: (source, reason) of each dead letter. Returns the
    differences and the count of dead letters per reason."""
    differences = []
    seen: Counter[Source] = Counter()
    reasons: Counter[str] = Counter()
    for source, reason in letters:
        reasons[reason] += 1
        seen[source] += 1
        if source not in meant:
            differences.append(f"dead letter of a valid record {source}: {reason}")
        elif meant[source] != reason:
            differences.append(
                f"dead letter {source} says {reason}, it was meant to be {meant[source]}"
            )
    for source, count in sorted(seen.items()):
        if count > 1 and source in meant:
            differences.append(f"dead letter {source} is there {count} times")
    for source in sorted(set(meant) - set(seen)):
        differences.append(f"no dead letter for {source} ({meant[source]})")
    return differences, reasons
