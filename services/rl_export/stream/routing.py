"""What to say about events that arrive on another partition than their trace's.

The join forwards such an event to its trace's partition (nothing valid is lost whatever
the producer does), but every forward is an extra hop, and a whole producer misrouting
usually means its client hashes keys another way than ``RL_EXPORT_PARTITIONER`` says.
:class:`MisrouteLog` finds which partitioner the misrouted traffic matches, for the
``rl_export_join_forwarded_total{matches}`` metric and for one warning a minute that names the
setting that would route these events directly. Pure: the clock is passed in.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from rl_export.model.partitioning import Partitioner, matching

NO_MATCH = "none"
"""The ``matches`` label of a forward no known partitioner explains (random partitions)."""


@dataclass
class MisrouteLog:
    """Counts forwards by the partitioners that would have routed them where they arrived."""

    partitioner: Partitioner
    partitions: int
    interval_s: float = 60.0
    _since: float | None = None
    _count: int = 0
    _matches: Counter[str] = field(default_factory=Counter)

    def note(self, key: bytes, arrived_on: int, now: float) -> str:
        """Record one forward; return the partitioner it matches (``none`` if no one does).

        Any two partitioners agree on about one key in ``partitions`` by chance; a key that
        more than one explains counts for each, and the label names the first.
        """
        if self._since is None:
            self._since = now
        names: list[str] = [*matching(key, arrived_on, self.partitions)] or [NO_MATCH]
        self._count += 1
        self._matches.update(names)
        return names[0]

    def report(self, now: float) -> str | None:
        """The warning to log, once per interval while forwards happen; None otherwise."""
        if self._since is None or now - self._since < self.interval_s:
            return None
        count, matches, seconds = self._count, self._matches, now - self._since
        self._since, self._count, self._matches = None, 0, Counter()
        head = (
            f"{count} events in the last {seconds:.0f}s arrived on another partition than "
            f"their trace's under RL_EXPORT_PARTITIONER={self.partitioner} and were forwarded "
            "to it (nothing is lost, but each costs an extra hop)"
        )
        best, hits = matches.most_common(1)[0]
        # A partitioner explains the traffic when it explains nearly every forward; one that
        # matches only by chance explains about 1 / partitions of them.
        if best != NO_MATCH and hits >= 0.9 * count:
            return f"{head}; RL_EXPORT_PARTITIONER={best} would route these events directly"
        return (
            f"{head}; they match no one partitioner: a producer that picks partitions at "
            "random or ignores keys? Key every event by trace_id with a consistent partitioner"
        )
