"""New lines before the corpora have them: the trajectories topic, read into the index.

The sink lets a quiet corpus's few lines wait (``RL_EXPORT_CORPUS_MAX_AGE_S``) so that
object writes do not grow with tenants; a new trace of a quiet project would then reach its
Label queue, stats and preview that much later. So every web instance reads the
``trajectories`` topic too (a :class:`~rl_export.web.tailing.Tail`, no consumer group),
turns each snapshot into the line each corpus will hold for it (:func:`corpus_lines`: the
sink's own decision, :meth:`~rl_export.formats.specs.CorpusSpec.line`, scrubbed as the
corpus is), and hands the lines of the corpora the index follows to the indexer
(:meth:`~rl_export.index.follower.Indexer.offer`), which ingests them at once (after its
first pass over the corpus's chains). A direct export reads them too, as a virtual chain
(:class:`FreshStore`). When the corpus
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

import hashlib
import logging
import time
from collections import deque
from collections.abc import Callable, Sequence

from rl_export.corpora.commits import Commit
from rl_export.corpora.layout import SCHEMA_VERSION, CorpusRef, utc_now
from rl_export.corpora.pairlines import PairLines, pair_lines
from rl_export.corpora.store import ObjectStore
from rl_export.corpora.wrapped import StoreWrapper
from rl_export.formats.specs import CorpusSpec
from rl_export.index.queryindex import CorpusKey
from rl_export.model.pairs import COMPARISONS
from rl_export.model.snapshots import SnapshotLines, decode_snapshot

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
            snapshot = pair_lines(value) or SnapshotLines(decode_snapshot(value))
        except (ValueError, KeyError, TypeError):
            return  # the sink counts it; nothing for the index
        self.seen += 1
        now = self.clock()
        pair = type(snapshot) is PairLines  # as the sink routes it: to comparisons corpora only
        for spec in self.specs:
            if (spec.source == COMPARISONS) != pair:
                continue
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


FRESH_TOPIC = "fresh"
"""The virtual chain ``fresh-0`` a direct export reads fresh lines from (:class:`FreshStore`)."""


class FreshStore(StoreWrapper):
    """The store as a direct export reads it: one corpus gets a virtual chain, ``fresh-0``,
    of one commit holding the lines the web service has from the trajectories topic (the
    corpus's lines of the last few minutes), so an export has a new trace within a second
    or two of its event, as the queue and the stats do. The latest view reads that chain
    first (its name sorts first), and a line the corpus also holds is the same line: the
    view keeps one. Only the export of the latest state uses it: a pinned version's, and
    an export job's (which writes a manifest that must make the same bytes again), do not.
    """

    def __init__(self, inner: ObjectStore, ref: CorpusRef, lines: bytes) -> None:
        super().__init__(inner)
        self.ref = ref
        self.stream = f"{FRESH_TOPIC}-0"
        self.key = ref.manifest_key(self.stream, 0)
        count = lines.count(b"\n")
        self.commit = Commit(
            topic=FRESH_TOPIC, partition=0, from_offset=0, last_offset=max(count - 1, 0),
            shard=ref.relative(self.key), records=count, bytes=len(lines),
            sha256=hashlib.sha256(lines).hexdigest(), compression="none",
            schema_version=SCHEMA_VERSION, min_updated_at=None, max_updated_at=None,
            writer="web", created_at=utc_now(), inline=lines.decode(),
        ).to_json()  # fmt: skip

    async def folders(self, prefix: str) -> list[str]:
        found = await self.inner.folders(prefix)
        if prefix == self.ref.manifest_root():
            found = sorted({*found, self.stream})
        return found

    async def get(self, key: str) -> bytes:
        return self.commit if key == self.key else await self.inner.get(key)

    async def list(self, prefix: str = "", start_after: str = "") -> list[str]:
        keys = await self.inner.list(prefix, start_after)
        if self.key.startswith(prefix) and self.key > start_after:
            keys = sorted({*keys, self.key})
        return keys
