"""The partition sink: everything the sink does for one ``trajectories`` partition.

A :class:`PartitionSink` turns each record of its partition into a snapshot, once, and hands
it to the :class:`~rl_export.corpora.chain.ChainWriter` of every corpus of the snapshot's
``(org, project)`` (step 2 of :mod:`rl_export.corpora.sink`); it says when its pending
records are due, and flushes every writer's commit together (step 3 (a) and (b)), returning
the Kafka offset then safe to commit. The stream's consumer loop and the offline ``replay``
(:mod:`rl_export.corpora.replay`) drive it the same way.

No record stops a partition: a record that is no snapshot, a snapshot whose org or project
cannot name a folder of the store (``..``, ``a/b``, 300 characters), and one a corpus cannot
render are skipped, logged (where, never what) and counted
(``rl_export_sink_bad_snapshots_total``); the records behind them go on. Only the store's
own failures are tried again.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from rl_export.corpora.chain import ChainWriter, PendingTotals, SinkConfig
from rl_export.corpora.commits import Commit
from rl_export.corpora.feed import Feed, commit_message
from rl_export.corpora.layout import CorpusRef
from rl_export.corpora.pairlines import PairLines, pair_lines
from rl_export.corpora.store import ObjectStore
from rl_export.formats.specs import SAFE_NAME, CorpusSpec
from rl_export.model.pairs import COMPARISONS
from rl_export.model.snapshots import SnapshotLines, decode_snapshot
from rl_export.runtime.metrics import SinkMetrics

log = logging.getLogger(__name__)


def seed_source(specs: Sequence[CorpusSpec]) -> CorpusSpec | None:
    """The corpus new corpora are backfilled from: the first that holds every trace's latest
    snapshot (no reward source, ``trajectory`` format, no filter), ``traces`` by default."""
    for spec in specs:
        if spec.source is None and spec.format == "trajectory" and spec.everything:
            return spec
    return None


@dataclass
class PartitionSink:
    """Everything the sink does for one ``trajectories`` partition."""

    store: ObjectStore
    topic: str
    partition: int
    specs: Sequence[CorpusSpec]
    config: SinkConfig
    metrics: SinkMetrics
    writer: str
    writers: dict[tuple[str, str, str], ChainWriter] = field(default_factory=dict)
    last_offset: int = -1
    first_pending_at: float | None = None  # of its oldest line not held back (monotonic)
    held_until: float | None = None  # quiet writers held back: when the first is due
    committed: int = -1  # the Kafka offset last committed for this partition
    retry_after: float = 0.0  # a flush the store refused: not tried early before this
    feed: Feed | None = None  # the change feed, told of every commit (rl_export.corpora.feed)
    first_offset: int = -1  # of the first record handled: commits from there are announced
    totals: PendingTotals = field(default_factory=PendingTotals, init=False)
    # The writers of each (org, project), one per spec in order: one lookup per record; a
    # trace's snapshots go to the first, a pair's to the second (the comparisons corpora).
    _project_writers: dict[tuple[str, str], tuple[tuple[ChainWriter, ...], ...]] = field(
        default_factory=dict, init=False, repr=False
    )
    # Projects whose org or project cannot name a folder: their snapshots are skipped.
    _unnamable: set[tuple[str, str]] = field(default_factory=set, init=False, repr=False)

    def idle_offset(self) -> int | None:
        """With nothing pending, the offset after the last record read, if not yet committed.

        Records that wrote nothing (repeats, not ready, skipped) must still move the group
        offset, or a partition whose tail is all repeats would lag forever.
        """
        if self.last_offset < 0:  # nothing read yet (made to seed its new chains)
            return None
        if self.pending_records or self.last_offset + 1 <= self.committed:
            return None
        return self.last_offset + 1

    def _writer(self, org: str, project: str, spec: CorpusSpec) -> ChainWriter:
        key = (org, project, spec.name)
        writer = self.writers.get(key)
        if writer is None:
            ref = CorpusRef(org, project, spec.name)
            seed = seed_source(self.specs)
            # Pair records are not in the traces' history: a comparisons corpus starts empty.
            seeded = seed is not None and seed is not spec and spec.source != COMPARISONS
            writer = ChainWriter(
                self.store, ref, spec, topic=self.topic, partition=self.partition,
                config=self.config, metrics=self.metrics, writer=self.writer,
                totals=self.totals,
                seed=CorpusRef(org, project, seed.name) if seed is not None and seeded else None,
                on_commit=None if self.feed is None else self._announce,
                announce_from=lambda: self.first_offset if self.first_offset >= 0 else (
                    self.last_offset + 1),
            )  # fmt: skip
            self.writers[key] = writer
        return writer

    def _announce(self, ref: CorpusRef, commit: Commit) -> None:
        if self.feed is not None:
            self.feed.announce(ref, commit_message(ref, commit))

    def _writers_of(self, org: str, project: str, pair: bool = False) -> tuple[ChainWriter, ...]:
        writers = self._project_writers.get((org, project))
        if writers is None:
            if SAFE_NAME.match(org) and SAFE_NAME.match(project):
                made = [self._writer(org, project, spec) for spec in self.specs]
                writers = (tuple(w for w in made if w.spec.source != COMPARISONS),
                           tuple(w for w in made if w.spec.source == COMPARISONS))  # fmt: skip
            else:  # checked once per project, not per record
                writers = ((), ())
                self._unnamable.add((org, project))
            self._project_writers[(org, project)] = writers
        return writers[pair]

    def _skip(self, offset: int, why: str) -> None:
        self.metrics.bad_snapshots.inc()
        log.error("%s-%d@%d: %s; skipped", self.topic, self.partition, offset, why)

    async def seed_new_chains(self) -> list[CorpusRef]:
        """Seed this partition's chain of every corpus that has none yet, in every project
        whose seed corpus has history on the partition: what a corpus added to the specs
        gets at once, without waiting for an event of each project (step 0 of
        :mod:`rl_export.corpora.sink`). Return the corpora seeded (or found empty)."""
        seed = seed_source(self.specs)
        if seed is None or len(self.specs) == 1:
            return []
        stream = f"{self.topic}-{self.partition}"  # as CorpusRef.stream names it
        done: list[CorpusRef] = []
        for org in await self.store.folders(""):
            if org.startswith("_"):  # _claims/, _labeling/, ...: not an org's corpora
                continue
            for project in await self.store.folders(f"{org}/"):
                corpora = set(await self.store.folders(f"{org}/{project}/"))
                history = CorpusRef(org, project, seed.name)
                if seed.name not in corpora or stream not in await self.store.folders(
                    history.manifest_root()
                ):
                    continue
                for writer in self._writers_of(org, project):  # (pair records: no history)
                    if writer.state is not None or writer.spec is seed:
                        continue
                    if writer.spec.name in corpora and stream in await self.store.folders(
                        writer.ref.manifest_root()
                    ):
                        continue  # its chain exists: loaded when an event comes, as ever
                    await writer.loaded()  # a new chain: seeded from the history
                    done.append(writer.ref)
        return done

    async def handle(
        self, offset: int, value: bytes, event_ms: int | None, record_at: bytes | None = None
    ) -> None:
        """Step 2 for one record of the partition (``record_at``: the snapshot's header).

        The snapshot's lines are shared by the corpora: encoded at most once, and not at all
        for a snapshot in the record layout, whose value holds them.
        """
        self.last_offset = max(self.last_offset, offset)
        if self.first_offset < 0:
            self.first_offset = offset
        lines = None if record_at is None else SnapshotLines.from_record(value, record_at)
        if lines is None:
            try:
                lines = pair_lines(value) or SnapshotLines(decode_snapshot(value))
            except ValueError as exc:
                self._skip(offset, f"not a snapshot ({exc})")
                return
            except Exception as exc:  # a value our decoding does not survive
                self._skip(offset, f"not a snapshot ({type(exc).__name__})")
                return
        writers = self._writers_of(lines.org, lines.project, type(lines) is PairLines)
        if not writers and (lines.org, lines.project) in self._unnamable:
            self._skip(offset, "its org or project cannot name a folder")
            return
        refused: list[str] | None = None  # made only when a corpus refuses it (per record)
        for writer in writers:
            if writer.state is None:
                await writer.loaded()  # a store error propagates: the partition is read again
            try:
                writer.add(offset, lines, event_ms)
            except Exception as exc:  # a snapshot this corpus cannot render: never a stop
                refused = [*(refused or []), f"{writer.ref.root} ({type(exc).__name__})"]
        if refused:
            self._skip(offset, f"{', '.join(refused)} cannot take it")
        if self.first_pending_at is None and self.totals.records:
            self.first_pending_at = time.monotonic()

    @property
    def pending_records(self) -> int:
        return self.totals.records

    @property
    def pending_bytes(self) -> int:
        return self.totals.bytes

    def due(self, now: float) -> bool:
        records = self.totals.records
        if not records:
            return False
        # The deadline as ``retry_after`` and the callers compute it: ``now - first`` can
        # round below the bound at the very moment ``first + bound``.
        aged = (self.first_pending_at is not None and now >= (
            self.first_pending_at + self.config.max_age_s
        )) or (self.held_until is not None and now >= self.held_until)  # fmt: skip
        return (
            aged or records >= self.config.max_records or self.totals.bytes >= self.config.max_bytes
        )

    async def flush(self, *, everything: bool = True) -> int | None:
        """Steps 3 (a) and (b) for every writer; return the Kafka offset now safe to commit.

        The writers' chains are independent, so they commit concurrently (a store round trip
        or an fsync each, not one after another). Every commit finishes before the first
        error is raised: a writer is never committing twice at once.

        Not ``everything`` (a flush because the partition's age bound passed), with quiet
        chains held (``quiet_max_age_s``): a writer whose few lines may wait more is left
        pending, and the offset safe to commit is then its first line's (read again after a
        restart, the chains that committed skip it). The partition's clock then starts at
        its next line, or at the first held writer's own bound.
        """
        now = time.monotonic()
        holding = not everything and self.config.quiet_max_age_s > 0
        held = (
            {w for w in self.writers.values() if w.pending and w.quiet(now)} if holding else set()
        )
        results = await asyncio.gather(
            *(w.commit(self.last_offset) for w in self.writers.values()
              if w.pending and w not in held),
            return_exceptions=True,
        )  # fmt: skip
        for result in results:
            if isinstance(result, BaseException):
                raise result
        self.first_pending_at = None
        if self.config.crash_at == "after_commit":
            os.kill(os.getpid(), signal.SIGKILL)
        if held:
            for writer in held:
                writer.waited = True
            self.held_until = min(w.first_pending_at for w in held) + self.config.quiet_max_age_s
            return min(w.pending[0].offset for w in held)
        self.held_until = None
        return self.last_offset + 1 if self.last_offset >= 0 else None
