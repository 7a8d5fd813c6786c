"""New lines before the corpora have them: the trajectories topic, read into the index.

The sink lets a quiet corpus's few lines wait (``RL_EXPORT_CORPUS_MAX_AGE_S``) so that
object writes do not grow with tenants; a new trace of a quiet project would then reach its
Label queue, stats and preview that much later. So every web instance reads the
``trajectories`` topic too (a :class:`~rl_export.web.tailing.Tail`, no consumer group),
turns each snapshot into the line each corpus will hold for it (:func:`corpus_lines`: the
sink's own decision, :meth:`~rl_export.formats.specs.CorpusSpec.line`, scrubbed as the
corpus is), and hands the lines of the corpora the index follows to the indexer
(:meth:`~rl_export.index.follower.Indexer.offer`), which ingests them after its next pass
over the corpus's chains: within the index's poll (1 s) of the snapshot. When the corpus
commits the same line, the index already holds it (a line ingested twice changes nothing;
a newer revision replaces an older one whichever came first), so the index never differs
from what the corpus will say.

A corpus followed for the first time also gets the lines of the last few minutes (the
sink's hold and shard age, and a minute more), kept in a buffer of at most
:data:`BUFFER_BYTES` (the oldest dropped first). Only deletions become tombstones here: a
trace that stops matching a corpus's filter leaves it when the corpus's tombstone is
committed, as before. Pure but for the clock; the tail is the I/O.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable, Sequence

from rl_export.formats.specs import CorpusSpec
from rl_export.index.queryindex import CorpusKey
from rl_export.model.records import SnapshotLines, decode_snapshot

log = logging.getLogger(__name__)

BUFFER_BYTES = 64 << 20
"""The lines kept for corpora followed later (all projects together)."""


def corpus_lines(snapshot: SnapshotLines, spec: CorpusSpec) -> bytes | None:
    """The line a corpus will hold for a snapshot: its row, a deleted trace's tombstone, or
    None (not in the corpus; a record it holds that stops matching leaves it when the sink
    commits the tombstone)."""
    line = spec.line(snapshot)
    if line is not None:
        if spec.redact:  # a corpus written scrubbed (never the default ones)
            line, _ = spec.scrub(line)
        return line
    if snapshot.deleted:
        return snapshot.tombstone_line(spec.source)
    return None


class FreshLines:
    """The trajectories topic's snapshots as corpus lines, offered to the index."""

    def __init__(
        self,
        specs: Sequence[CorpusSpec],
        offer: Callable[[CorpusKey, bytes], bool],
        *,
        keep_s: float,
        buffer_bytes: int = BUFFER_BYTES,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.specs = specs
        self.offer = offer  # the indexer's: True when it took the lines (the corpus is followed)
        self.keep_s = keep_s
        self.buffer_bytes = buffer_bytes
        self.clock = clock
        self._recent: deque[tuple[float, CorpusKey, bytes]] = deque()
        self._held = 0
        self.seen = 0  # snapshots read (for the tests and the metrics)

    def note(self, value: bytes | None) -> None:
        """One value of the trajectories topic (anything else on it is ignored)."""
        if value is None:
            return
        try:
            snapshot = SnapshotLines(decode_snapshot(value))
        except (ValueError, KeyError, TypeError):
            return  # the sink counts it; nothing for the index
        self.seen += 1
        now = self.clock()
        for spec in self.specs:
            line = corpus_lines(snapshot, spec)
            if line is None:
                continue
            key = CorpusKey(snapshot.org, snapshot.project, spec.name)
            self.offer(key, line)
            self._recent.append((now, key, line))
            self._held += len(line)
        self._drop_old(now)

    def recent(self, key: CorpusKey) -> bytes:
        """The buffered lines of a corpus, oldest first (for a corpus followed now)."""
        self._drop_old(self.clock())
        return b"".join(line for _, k, line in self._recent if k == key)

    def _drop_old(self, now: float) -> None:
        recent = self._recent
        while recent and (self._held > self.buffer_bytes or recent[0][0] < now - self.keep_s):
            _, _, line = recent.popleft()
            self._held -= len(line)
