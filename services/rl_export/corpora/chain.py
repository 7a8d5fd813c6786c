"""The chain writer: one corpus's records for one ``trajectories`` partition, appended to its
manifest chain exactly once.

This is the exactly-once heart of the sink (:mod:`rl_export.corpora.sink`, whose docstring
numbers the steps) and of the backfill (:mod:`rl_export.corpora.backfill` seeds a new chain
through :meth:`ChainWriter.load`). A :class:`ChainWriter` decides what its corpus writes for
each snapshot (step 2: repeats and revisions the corpus already holds are dropped), buffers
the lines, and commits them in a fixed order (step 3 (a) the data object, named by its
content hash, then (b) the create-only commit; a commit of few lines holds them itself, and
(a) writes nothing); a writer that loses the create-only race reloads its chain and keeps
only what the winner did not cover (step 4).
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import orjson

from rl_export.corpora.backfill import seed_chain
from rl_export.corpora.chainstate import ChainState, load_chain_state
from rl_export.corpora.commits import Commit, encode_lines
from rl_export.corpora.erasures import record_erasures
from rl_export.corpora.layout import SCHEMA_VERSION, Compression, CorpusRef, utc_now
from rl_export.corpora.store import ObjectStore
from rl_export.formats.specs import CorpusSpec
from rl_export.model.errors import ObjectExistsError
from rl_export.model.partitioning import Partitioner, partition_for
from rl_export.model.snapshots import SnapshotLines
from rl_export.runtime.metrics import SinkMetrics

log = logging.getLogger(__name__)


def writer_id() -> str:
    """Who writes: host, pid and a random suffix (a restarted process is a new writer)."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


@dataclass(frozen=True)
class SinkConfig:
    """The sink's bounds and options."""

    max_records: int = 10_000
    max_bytes: int = 64 * 1024 * 1024
    max_age_s: float = 10.0
    # A quiet chain (fewer than ``quiet_records`` pending lines) is left pending when its
    # partition commits, until its oldest line is ``quiet_max_age_s`` old (0: never held).
    quiet_max_age_s: float = 0.0
    quiet_records: int = 8
    # What all the partitions may hold together (the bounds above are each partition's).
    buffer_bytes: int = 32 * 1024 * 1024
    compression: Compression = "none"
    # A commit whose shard is at most this many bytes (uncompressed, no sidecar) holds its
    # lines itself: one object, not a data object and a commit (0: never).
    inline_max_bytes: int = 0
    sidecars: bool = False  # index sidecars beside uncompressed trajectory shards (costly)
    partitions: int = 8
    partitioner: Partitioner = "murmur2"  # how trace_id maps to a trajectories partition
    crash_at: str = ""  # fault injection for tests: "after_data", "after_commit"


@dataclass(slots=True)
class Pending:
    """A line waiting for the next commit, with what re-checking it after a lost race needs.

    Not the snapshot: the decision a corpus makes for a snapshot depends only on whether it
    holds a record for it (``deleted`` says it holds none: the line is a tombstone), the
    trace and the revision; the line for that decision never changes.
    """

    offset: int
    trace_id: str
    revision: int
    deleted: bool  # the line is a tombstone
    erased: bool  # the trace itself is deleted (trace.deleted)
    line: bytes  # the record as its JSON Lines line, encoded once
    updated_at: str | None  # the record's, for the commit (a tombstone has none)
    event_ms: int | None
    index: tuple[Any, ...] | None = None  # its index sidecar row, when the corpus has sidecars
    new: bool = False  # a record of a trace the corpus did not hold (the feed's new_records)


@dataclass(slots=True)
class PendingTotals:
    """Records and bytes pending in all the writers of a partition.

    The writers keep it current as their pending lists change, so the sink can check its
    bounds after every record without summing over every writer.
    """

    records: int = 0
    bytes: int = 0


class ChainWriter:
    """Appends one corpus's records for one topic partition to its chain."""

    def __init__(
        self,
        store: ObjectStore,
        ref: CorpusRef,
        spec: CorpusSpec,
        *,
        topic: str,
        partition: int,
        config: SinkConfig,
        metrics: SinkMetrics,
        writer: str,
        totals: PendingTotals | None = None,
        seed: CorpusRef | None = None,
        on_commit: Callable[[CorpusRef, Commit], None] | None = None,
        announce_from: Callable[[], int] | None = None,
    ) -> None:
        self.store = store
        # The change feed (rl_export.corpora.feed): told of every commit this writer makes,
        # and, when the chain loads, of its commits from ``announce_from()`` on (records
        # read again after a crash: their commits' announcements may not have gone out).
        self.on_commit = on_commit
        self.announce_from = announce_from
        self.seed = seed  # the corpus a new chain is seeded from (backfill), if any
        self.ref = ref
        self.spec = spec
        self.topic = topic
        self.partition = partition
        self.stream = ref.stream(topic, partition)
        self.config = config
        self.metrics = metrics
        self.writer = writer
        self.totals = PendingTotals() if totals is None else totals
        self.state: ChainState | None = None
        self.pending: list[Pending] = []
        self.pending_bytes = 0
        self.first_pending_at = 0.0  # monotonic: when its oldest pending line came
        self.waited = False  # its pending lines were held past a partition's commit (quiet)
        self.commits = 0  # made since its corpus was last compacted (Sink.tail_commits)
        # Index sidecars need the lines' byte offsets: uncompressed trajectory shards only.
        self.sidecars = (
            config.sidecars and config.compression == "none" and spec.format == "trajectory"
            and spec.source != "comparisons"  # pair records: nothing the index reads
        )  # fmt: skip

    def _belongs(self, trace_id: str) -> bool:
        config = self.config
        return partition_for(trace_id.encode(), config.partitions, config.partitioner) == (
            self.partition
        )

    async def load(self) -> ChainState:
        """The chain's head and holdings from the store; a new chain is seeded first
        (:mod:`rl_export.corpora.backfill`)."""
        if self.state is None:
            state = await load_chain_state(
                self.store,
                self.ref,
                self.stream,
                belongs=self._belongs,
                partitioning=(self.config.partitioner, self.config.partitions),
            )
            if state.head == 0 and self.seed is not None and not self.pending:
                state = await seed_chain(
                    self.store, self.ref, self.spec, self.seed, state, stream=self.stream,
                    belongs=self._belongs,
                    keep=lambda st, t, r, d: self._keep(st, t, r, deleted=d, erased=False),
                    compression=self.config.compression, writer=self.writer,
                    metrics=self.metrics,
                )  # fmt: skip
            self.state = state
            if self.on_commit is not None and self.announce_from is not None:
                start = self.announce_from()
                for commit in state.commits:
                    if commit.last_offset >= start:
                        self.on_commit(self.ref, commit)
            state.commits = []
        return self.state

    async def loaded(self) -> ChainState:
        """The chain's state, loaded from the store if it is not yet (or no longer) known."""
        if self.state is not None:
            return self.state
        if self.pending:
            # A lost race whose reload failed: what is pending must be checked against the
            # reloaded chain as well, not committed after it unchecked.
            return await self._after_losing()
        return await self.load()

    def add(self, offset: int, snapshot: SnapshotLines, event_ms: int | None) -> None:
        """Step 2: decide what this corpus writes for a snapshot, and buffer it.

        The chain must be :meth:`loaded`. (Not a coroutine that awaits it: this runs for every
        corpus and record, and the chain is loaded once.)
        """
        state = self.state
        if state is None:
            raise RuntimeError(f"{self.ref.root} {self.stream}: the chain is not loaded")
        if offset < state.head:
            return  # already in a committed shard
        spec, source = self.spec, self.spec.source
        holds = spec.holds(snapshot)
        erased = snapshot.deleted
        line = None
        if holds and spec.format != "trajectory":  # a row only if the format has one
            line = spec.held_line(snapshot, self._left_out)
            holds = line is not None
        held = state.held.get(snapshot.trace_id)
        if self._keep(state, snapshot.trace_id, snapshot.revision, deleted=not holds,
                      erased=erased):  # fmt: skip
            if line is None:
                line = snapshot.line(source) if holds else snapshot.tombstone_line(source)
            if holds and spec.redact:  # a corpus written scrubbed (never the default ones)
                line, counts = spec.scrub(line)
                for kind, n in counts.items():
                    self.metrics.redactions.labels(kind).inc(n)
            updated_at = snapshot.updated_at if holds else None
            self._append(
                Pending(
                    offset, snapshot.trace_id, snapshot.revision, not holds, erased, line,
                    updated_at, event_ms, self._index_row(snapshot, line, holds),
                    new=holds and (held is None or bool(held & 1)),
                )
            )  # fmt: skip

    def _left_out(self, reason: str) -> None:
        """A row the corpus's chat template cannot render: counted by its kind of reason."""
        kind = "raises" if reason.startswith("raises:") else reason.replace(" ", "_")
        self.metrics.left_out.labels(self.spec.name, kind).inc()

    def _index_row(self, snapshot: SnapshotLines, line: bytes, holds: bool) -> Any:
        """The line's sidecar row: from the snapshot's fields (read once for all the corpora,
        the row too: corpora differ only in reward and passed), but for a scrubbed line, whose
        fields may differ from the snapshot's, and a tombstone. None (no sidecar for this
        shard) when the fields are not what a record holds: never an error in the sink."""
        if not self.sidecars:
            return None
        from rl_export.corpora import sidecar  # pyarrow: imported only where sidecars are made

        try:
            if not holds or self.spec.redact:
                return sidecar.index_row(orjson.loads(line))
            if snapshot.memo is None:
                snapshot.memo = sidecar.index_row(snapshot.fields())
            source = self.spec.source
            row: tuple[Any, ...] = snapshot.memo
            return (*row[:3], snapshot.value(source, "reward"), snapshot.value(source, "passed"),
                    *row[5:])  # fmt: skip
        except Exception as exc:  # a record that passed the join's checks: not expected
            log.warning("%s %s: no index sidecar row (%s)", self.ref.root, self.stream, exc)
            return None

    def _keep(
        self, state: ChainState, trace_id: str, revision: int, *, deleted: bool, erased: bool
    ) -> bool:
        """Whether a record (or, ``deleted``, no record) at a revision changes what the corpus
        holds; if so, hold it.

        A revision the corpus holds, or an older one, is a repeat. No record where the corpus
        holds none, or only a tombstone, changes nothing; where it holds a record, no record
        means a tombstone. A deleted trace (``erased``) gets its tombstone even where the
        corpus holds nothing: an older revision replayed later, on another chain, must find
        the deletion and not bring the trace back. A record of a trace the erasure log names
        is never written again (:class:`~rl_export.corpora.chainstate.ChainState`).
        """
        if not deleted and trace_id in state.erased:
            self.metrics.repeats.inc()
            return False
        code = state.held.get(trace_id)  # revision * 2 + deleted (ChainState)
        if code is not None and revision <= code >> 1:
            self.metrics.repeats.inc()
            return False
        if deleted and not erased and (code is None or code & 1):
            return False  # nothing held: nothing to hide
        state.hold(trace_id, revision, deleted)
        return True

    def _append(self, pending: Pending) -> None:
        if not self.pending:
            self.first_pending_at = time.monotonic()
        self.pending.append(pending)
        size = len(pending.line)
        self.pending_bytes += size
        self.totals.records += 1
        self.totals.bytes += size

    def _take_pending(self) -> list[Pending]:
        """Empty the pending list, returning what it held."""
        taken = self.pending
        self.totals.records -= len(taken)
        self.totals.bytes -= self.pending_bytes
        self.pending, self.pending_bytes = [], 0
        return taken

    def quiet(self, now: float) -> bool:
        """Whether the pending lines may wait past their partition's commit: few, no
        deletion among them, the oldest younger than the quiet age bound."""
        config = self.config
        return (
            len(self.pending) < config.quiet_records
            and now < self.first_pending_at + config.quiet_max_age_s
            and not any(p.erased for p in self.pending)
        )

    async def commit(self, last_offset: int) -> None:
        """Step 3 (a) and (b): data object, then the create-only commit; retry after a loss."""
        while self.pending:
            if self.state is None:  # a lost race invalidated it (perhaps a failed reload)
                await self._after_losing()
                continue
            state = self.state
            shard = encode_lines(
                [p.line for p in self.pending],
                [p.updated_at for p in self.pending if p.updated_at],
                self.config.compression,
            )
            # The sidecar's rows and line lengths, of the very lines just encoded.
            rows = [p.index for p in self.pending if p.index is not None]
            lengths = [len(p.line) for p in self.pending]
            started = time.monotonic()
            commit_key = self.ref.manifest_key(self.stream, state.head)
            inline = (
                len(shard.data) <= self.config.inline_max_bytes
                and shard.compression == "none" and not (self.sidecars and rows)
            )  # fmt: skip
            if inline:  # (a): the commit holds the lines; nothing to write before it
                data_key = commit_key
            else:
                data_key = self.ref.data_key(self.stream, state.head, shard.sha256,
                                             shard.compression)  # fmt: skip
                await self.store.put(data_key, shard.data)
            erased = [(p.offset, p.trace_id, p.revision) for p in self.pending if p.erased]
            if erased:  # before the commit that holds their tombstones: see erasures.py
                await record_erasures(
                    self.store, self.ref.org, self.ref.project, self.stream, erased
                )
            if self.config.crash_at == "after_data":
                os.kill(os.getpid(), signal.SIGKILL)
            index = None
            if self.sidecars and not inline and len(rows) == len(lengths):
                from rl_export.corpora import sidecar

                index = await sidecar.write_sidecar(
                    self.store, data_key, rows, lengths, shard.sha256, relative=self.ref.relative
                )
            commit = Commit(
                topic=self.topic,
                partition=self.partition,
                from_offset=state.head,
                last_offset=last_offset,
                shard=self.ref.relative(data_key),
                records=shard.records,
                bytes=len(shard.data),
                sha256=shard.sha256,
                compression=shard.compression,
                schema_version=SCHEMA_VERSION,
                min_updated_at=shard.min_updated_at,
                max_updated_at=shard.max_updated_at,
                writer=self.writer,
                created_at=utc_now(),
                index=index,
                new_records=sum(1 for p in self.pending if p.new),
                inline=shard.data.decode() if inline else None,
            )
            try:
                await self.store.put_if_absent(commit_key, commit.to_json())
            except ObjectExistsError:
                self.metrics.conflicts.inc()
                self.state = None  # reloaded, and pending re-checked, at the top of the loop
                continue
            now = time.time()
            self.metrics.commit_latency.observe(time.monotonic() - started)
            self.metrics.commits.labels(self.spec.name).inc()
            self.metrics.records.labels(self.spec.name).inc(shard.records)
            self.metrics.bytes.labels(self.spec.name).inc(len(shard.data))
            # Lines that waited as a quiet chain's have a histogram of their own: they are
            # late by design (the web shows them meanwhile), the others by fault.
            histogram = self.metrics.quiet_freshness if self.waited else self.metrics.freshness
            histogram.observe_many(
                [max(0.0, now - p.event_ms / 1000) for p in self.pending if p.event_ms is not None]
            )
            self.waited = False
            state.head = last_offset + 1
            self._take_pending()
            self.commits += 1
            if self.on_commit is not None:
                self.on_commit(self.ref, commit)

    async def _after_losing(self) -> ChainState:
        """Another writer created our commit first: take its chain, keep what it left.

        The chain is reloaded before anything pending is let go: if the reload fails, the
        pending records stay, ``state`` stays None, and the next flush (or record) starts
        here again. What is kept goes through the same checks as in :meth:`add`, against the
        reloaded holdings.
        """
        state = await self.load()  # raises before anything pending is let go
        waiting = self._take_pending()
        log.warning(
            "%s %s: lost a commit race; chain head is now %d", self.ref.root, self.stream,
            state.head,
        )  # fmt: skip
        for p in waiting:
            if p.offset >= state.head and self._keep(
                state, p.trace_id, p.revision, deleted=p.deleted, erased=p.erased
            ):
                self._append(p)
        return state
