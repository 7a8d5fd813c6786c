"""The peers' join: one trace's merged state after one more of its events, and its check.

Every peer (Quix Streams, Kafka Streams: ``MergeJoin.java`` does the same) keeps one dict per
trace in its state store and, for each event of the trace, merges the event's fields over it
and counts the event under its type (``counts``). Nothing else: no validation, no dead
letters, no join rules, no rewards, no sink. That is the least a join of the three topics
does, so a peer's cost here is a floor under what it would cost to do the worker's work.

The check: once a peer has committed the end of every input topic, the last state it wrote
for each trace (read committed from its output topic) must count exactly the events of the
backlog, type by type, repeats included (a repeat is one more record in a topic, and only
the worker drops repeats). A trace whose counts differ, or with no state at all, is a
wrong join, and the run's time does not count. Standard library only: this module also runs
in the peers' virtualenv.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

PROBLEMS_SHOWN = 5


def merge(merged: dict[str, Any], event: Mapping[str, Any]) -> dict[str, Any]:
    """``merged`` after ``event``: its fields over the trace's, one more of its type counted.

    Changes ``merged`` in place (and returns it), as a state store's deserialised copy may be.
    """
    counts: dict[str, int] = merged.get("counts") or {}
    kind = str(event["event_type"])
    merged.update(event)
    counts[kind] = counts.get(kind, 0) + 1
    merged["counts"] = counts
    return merged


def expected_counts(events: Iterable[Mapping[str, Any]]) -> dict[str, dict[str, int]]:
    """Per trace, how many events of each type the backlog holds (repeats included)."""
    counts: dict[str, Counter[str]] = defaultdict(Counter)
    for event in events:
        counts[str(event["trace_id"])][str(event["event_type"])] += 1
    return {trace: dict(c) for trace, c in counts.items()}


@dataclass(frozen=True)
class Check:
    """How many traces a peer merged right, of how many, and the first problems found."""

    traces: int
    right: int
    wrong: int = 0
    problems: list[str] = field(default_factory=list)  # the first few of ``wrong``

    @property
    def ok(self) -> bool:
        return self.right == self.traces and self.wrong == 0

    def text(self) -> str:
        """``24,000 of 24,000 traces right``, and the first problems when some are wrong."""
        said = f"{self.right:,} of {self.traces:,} traces right"
        if self.ok:
            return said
        return f"{said}, {self.wrong:,} problems; the first: " + "; ".join(self.problems)


def check(
    expected: Mapping[str, Mapping[str, int]], merged: Mapping[str, Mapping[str, Any]]
) -> Check:
    """Compare each trace's last merged state with the backlog's counts.

    ``merged``: trace_id to the last state the peer wrote for it. A state for a trace the
    backlog does not hold is a problem too (a key mangled on the way).
    """
    problems: list[str] = []
    right = 0
    for trace, counts in expected.items():
        state = merged.get(trace)
        if state is None:
            problems.append(f"{trace}: no merged state")
            continue
        got = {str(k): v for k, v in (state.get("counts") or {}).items()}
        if got == dict(counts) and state.get("trace_id") == trace:
            right += 1
        else:
            problems.append(
                f"{trace}: counts {got} under trace_id {state.get('trace_id')!r}, "
                f"expected {dict(counts)}"
            )
    strangers = sorted(set(merged) - set(expected))
    problems += [f"{trace}: merged, but no such trace in the backlog" for trace in strangers]
    return Check(len(expected), right, len(problems), problems[:PROBLEMS_SHOWN])
