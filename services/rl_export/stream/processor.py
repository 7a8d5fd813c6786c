"""The join's batch processor: decode, check, merge, write and emit a batch; no Kafka in here.

Runs steps 2-4 and 6 of the join's flow (:mod:`rl_export.stream.loop` has the whole flow)
over a list of messages, with the table and the emitter behind small protocols, so unit
tests and ``replay`` run it without a broker.
"""

from __future__ import annotations

import heapq
import logging
import time
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Protocol

from rl_export.model.codec import RawJson
from rl_export.model.events import EventFamily, EventRejection, micros
from rl_export.model.eventview import EventView, read_event
from rl_export.model.partitioning import partition_function
from rl_export.model.snapshots import HEADER_RECORD_AT, Headers
from rl_export.runtime.metrics import Metrics
from rl_export.runtime.settings import Settings
from rl_export.stream import comparisons, native
from rl_export.stream.comparisons import Effects
from rl_export.stream.humans import versions_of
from rl_export.stream.join import JoinConfig, TraceState, encode_current, expired, merge
from rl_export.stream.native import NativeEvent, NativeState
from rl_export.stream.routing import MisrouteLog
from rl_export.stream.rubriccheck import RubricCheck, RubricSource, VersionKey
from rl_export.stream.state import dump_state_parts, expiry_since, load_state

log = logging.getLogger(__name__)

_VOID_TYPE = b'"event_type":"pair.void"'  # as comparisons.notice encodes it


@dataclass(slots=True)
class InMessage:
    """What the join needs of one Kafka message; ``handle`` is the transport's own event.

    Not frozen: a frozen dataclass costs five times as much to create, and this is one per
    event.
    """

    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes
    timestamp_ms: int | None = None
    handle: Any = None
    headers: Sequence[tuple[str, bytes]] = ()


class StateTable(Protocol):
    """The join's state, keyed by ``trace_id`` bytes; ``at`` says which message is current.

    ``mark`` keeps the table's *expiry index* beside the states (:func:`expiry_mark`: why
    and since when a state may expire; None removes it), written with them, so a restart
    reads the index instead of every state.
    """

    def get(self, key: bytes, at: InMessage) -> bytes | None: ...
    def prefetch(self, keys: Mapping[int, Iterable[bytes]]) -> None: ...
    def put(self, key: bytes, value: bytes, at: InMessage) -> None: ...
    def delete(self, key: bytes, at: InMessage) -> None: ...
    def mark(self, key: bytes, value: bytes | None, at: InMessage) -> None: ...
    def items(self) -> Iterable[tuple[bytes, bytes]]: ...
    def __len__(self) -> int: ...


class Emitter(Protocol):
    """Where snapshots, forwards and dead letters go; ``flush`` returns once they are delivered.

    ``forward`` sends an input event on to its trace's partition of the same topic, where
    the join takes it as it takes any event (a comparison's mirror or notice too:
    :mod:`rl_export.stream.comparisons`); ``headers`` go with the snapshot's value
    (:func:`rl_export.model.snapshots.encode_snapshot`). A snapshot goes to ``partition`` of
    ``trajectories``, sent by the join partition ``task`` (None: the same partition; a pair
    snapshot goes to its pair id's partition).
    ``flush`` gets the input offsets the batch covers (``(topic, partition) -> next
    offset``); an emitter that can commits them atomically with what it sends.
    """

    async def snapshot(
        self, key: bytes, value: bytes, event_ms: int | None, partition: int,
        headers: Headers, *, task: int | None = None,
    ) -> None: ...  # fmt: skip
    async def forward(self, message: InMessage, key: bytes, partition: int) -> None: ...
    async def dead_letter(self, message: InMessage, rejection: EventRejection) -> None: ...
    async def flush(self, consumed: Mapping[tuple[str, int], int]) -> None: ...


class MemoryTable:
    """A dict-backed :class:`StateTable` for unit tests and ``replay``."""

    def __init__(self) -> None:
        self.data: dict[bytes, bytes] = {}
        self.marks: dict[bytes, bytes] = {}

    def mark(self, key: bytes, value: bytes | None, at: InMessage) -> None:
        if value is None:
            self.marks.pop(key, None)
        else:
            self.marks[key] = value

    def get(self, key: bytes, at: InMessage) -> bytes | None:
        return self.data.get(key)

    def prefetch(self, keys: Mapping[int, Iterable[bytes]]) -> None:
        """A dict has nothing to gain from reading keys together."""

    def put(self, key: bytes, value: bytes, at: InMessage) -> None:
        self.data[key] = value

    def delete(self, key: bytes, at: InMessage) -> None:
        self.data.pop(key, None)

    def items(self) -> Iterable[tuple[bytes, bytes]]:
        return list(self.data.items())

    def __len__(self) -> int:
        return len(self.data)


def consumed_offsets(messages: Iterable[InMessage]) -> dict[tuple[str, int], int]:
    """The input offsets a batch covers: per (topic, partition), the offset after its last."""
    out: dict[tuple[str, int], int] = {}
    for m in messages:
        where = (m.topic, m.partition)
        if m.offset + 1 > out.get(where, 0):
            out[where] = m.offset + 1
    return out


@dataclass
class BatchResult:
    """What one batch did (for tests and logs)."""

    snapshots: dict[bytes, bytes] = field(default_factory=dict)  # trace id -> the value sent
    rejected: list[tuple[InMessage, EventRejection]] = field(default_factory=list)
    expired: list[tuple[bytes, str]] = field(default_factory=list)


CONVERSATION = b"\xff"
"""Prefix of the table key that holds a trace's conversation (``CONVERSATION + trace_id``).

A state is written for every event of its trace, its conversation (most of its bytes) only
when it changes: the table and its changelog hold them under two keys. No UTF-8
``trace_id`` starts with the byte 0xFF, so the two kinds of key never meet.
"""


def conversation_key(key: bytes) -> bytes:
    return CONVERSATION + key


def expiry_mark(state: TraceState) -> bytes | None:
    """The expiry index's entry for a state: why and since when it may expire, or None.

    ``tombstone <deleted_at>`` or ``orphan <first_pending_at>``: the times, not deadlines,
    so that changing a retention setting applies to states already stored.
    """
    if state.deleted and state.deleted_at is not None:
        return f"tombstone {state.deleted_at!r}".encode()
    if state.is_orphan and state.first_pending_at is not None:
        return f"orphan {state.first_pending_at!r}".encode()
    return None


def expiry_mark_of(key: bytes, value: bytes) -> bytes | None:
    """:func:`expiry_mark` of a stored state (a conversation key has none), from its head."""
    if key.startswith(CONVERSATION):
        return None
    since = expiry_since(value)
    return None if since is None else f"{since[0]} {since[1]!r}".encode()


@dataclass(slots=True)
class _Touched:
    state: Any  # a TraceState, or a native state (rl_export.stream.native)
    last: InMessage
    conversation: bytes | None  # as the table holds it
    mark: bytes | None = None  # the expiry index's entry as the table holds it
    emit: bool = False
    repeated: bool = False  # a redelivered event: rewrite everything, the first write may be lost
    event_ms: int | None = None
    pairs: set[str] | None = None  # owned pairs whose snapshot is due, by other trace


class JoinProcessor:
    """Runs steps 2-4 and 6 of the flow above over a batch; no Kafka in here."""

    def __init__(
        self,
        settings: Settings,
        table: StateTable,
        emitter: Emitter,
        metrics: Metrics,
        families: dict[str, EventFamily],
        *,
        rubrics: RubricSource | None = None,
    ) -> None:
        self.settings = settings
        self.table = table
        self.emitter = emitter
        self.metrics = metrics
        self.families = families
        self.config = JoinConfig(human_pass_threshold=settings.human_pass_threshold)
        self.rubrics = RubricCheck(rubrics, self.config.rubrics)
        # partition -> heap of (deadline, trace_id): states that may expire then.
        self._expiry: dict[int, list[tuple[float, bytes]]] = {}
        self._partitions: dict[str, int] = {}
        self._hash = partition_function(settings.partitioner)
        self._misroutes = MisrouteLog(settings.partitioner, settings.partitions)
        # The native core (None: the Python rules only), and each topic's family code.
        self.native = native.join_core(settings)
        self._codes = {topic: native.FAMILY_CODES[family] for topic, family in families.items()}

    def _partition_of(self, trace_id: str) -> int:
        """murmur2 in Python costs microseconds: remember recent traces' partitions."""
        partition = self._partitions.get(trace_id)
        if partition is None:
            if len(self._partitions) >= 100_000:
                self._partitions.clear()
            partition = self._partitions[trace_id] = self._hash(
                trace_id.encode(), self.settings.partitions
            )
        return partition

    def _check(self, message: InMessage, now: datetime) -> EventView | EventRejection:
        """The decoded event, or why it goes to the dead-letter topic (the Python path)."""
        return read_event(
            message.value,
            max_bytes=self.settings.max_event_bytes,
            now=now,
            future_tolerance_s=self.settings.future_tolerance_s,
            key=message.key,
            family=self.families.get(message.topic),
        )

    async def process(self, messages: list[InMessage], now: float | None = None) -> BatchResult:
        """Decode, merge and emit a batch; write each touched state once."""
        clock = time.time() if now is None else now
        wall = datetime.fromtimestamp(clock, UTC)
        result = BatchResult()
        touched: dict[bytes, _Touched] = {}
        outcomes: Counter[tuple[str, str]] = Counter()
        self.metrics.batch_size.observe(len(messages))

        checked = self._decode(messages, wall)  # step 2
        await self._check_answers(checked)  # rubric versions past 0 (not the core's)
        self._prefetch(messages, checked)
        natively = 0
        for message, decoded in zip(messages, checked, strict=True):  # step 3
            if isinstance(decoded, EventRejection):
                result.rejected.append((message, decoded))
                outcomes["unknown", "rejected"] += 1
                continue
            native_event = type(decoded) is NativeEvent
            key = decoded.key if native_event else decoded.trace_id.encode()
            home = self._partition_of(decoded.trace_id)
            if message.partition >= 0 and message.partition != home:
                # Another partitioner, or a producer that ignores keys: the trace's state and
                # its other events are on ``home``. Forward it there; it is joined there, and
                # acknowledged before this batch's offsets are committed.
                await self.emitter.forward(message, key, home)
                matches = self._misroutes.note(key, message.partition, clock)
                self.metrics.forwarded.labels(matches).inc()
                outcomes[decoded.event_type, "forwarded"] += 1
                continue
            entry = touched.get(key)
            if native_event:
                if self._merge_native(key, message, decoded, entry, touched, outcomes, clock):
                    natively += 1
                    continue
                view = self._check(message, wall)  # not the core's: the Python path
                if isinstance(view, EventRejection):
                    result.rejected.append((message, view))
                    outcomes["unknown", "rejected"] += 1
                    continue
            else:
                view = decoded
            conversation = stored_mark = None
            if entry is not None:
                if type(entry.state) is NativeState:  # its trace goes the Python way now
                    entry.state = load_state(*entry.state.dump())
                state: TraceState | None = entry.state
            else:
                state, conversation = self._read(key, message)
                # Before the merge, which may change the state in place.
                stored_mark = None if state is None else expiry_mark(state)
            merged = merge(
                state, view, message, now=clock, config=self.config, build_snapshot=False
            )
            outcomes[view.event_type, merged.outcome] += 1
            if entry is None:
                entry = touched[key] = _Touched(merged.state, message, conversation, stored_mark)
            else:
                entry.state, entry.last = merged.state, message
            for item, rejection in merged.rejected:
                origin = InMessage(item.topic, item.partition, item.offset, key, item.value)
                result.rejected.append((origin, rejection))
            if merged.outcome == "duplicate":
                entry.repeated = True
            if merged.emits:
                entry.emit = True
                entry.event_ms = message.timestamp_ms
            if merged.effects is not None:
                await self._owed(message, entry, merged.effects)

        await self._load_versions(touched.values())
        latencies: list[float] = []
        for key, entry in touched.items():  # step 4: one table write per trace
            held = entry.state
            if type(held) is NativeState:  # its bytes, mark and snapshot in one call
                head, conversation, mark, encoded = held.finish(entry.emit)
                self._write(key, entry, head, conversation)
                if encoded is None and entry.emit:  # not the core's to encode (rare)
                    encoded = encode_current(load_state(head, conversation), self.config)
            else:
                self._write(key, entry, *dump_state_parts(held))
                mark = expiry_mark(held)
                encoded = encode_current(held, self.config) if entry.emit else None
            if mark != entry.mark:
                self.table.mark(key, mark, entry.last)
            if mark is not None:
                self._schedule(key, mark, entry.last.partition)
            if entry.emit:  # the last snapshot of the batch: revisions may skip numbers
                assert encoded is not None  # emits only once the trace exists or is deleted
                value, headers = encoded
                if type(headers) is not list:  # the core's: the record-at header's value
                    headers = [] if headers is None else [(HEADER_RECORD_AT, headers)]
                result.snapshots[key] = value
                # trajectories is co-partitioned with the inputs: the same partition.
                await self.emitter.snapshot(
                    key, value, entry.event_ms, entry.last.partition, headers
                )
                if entry.event_ms is not None:
                    latencies.append(max(0.0, clock - entry.event_ms / 1000))
            if entry.pairs:
                await self._pair_snapshots(entry)
        self.metrics.latency.observe_many(latencies)
        self.metrics.snapshots.inc(len(result.snapshots))
        for message, rejection in result.rejected:
            await self.emitter.dead_letter(message, rejection)
            self.metrics.rejected.labels(rejection.reason.value).inc()
        for (event_type, outcome), count in outcomes.items():
            self.metrics.events.labels(event_type, outcome).inc(count)
        if natively:
            self.metrics.core_events.labels("native").inc(natively)
        if len(messages) > natively:
            self.metrics.core_events.labels("python").inc(len(messages) - natively)
        result.expired = self._expire(messages, clock)  # step 6
        warning = self._misroutes.report(clock)
        if warning is not None:
            log.warning("%s", warning)
        await self.emitter.flush(consumed_offsets(messages))  # delivered before it is acked
        self.metrics.table_keys.set(len(self.table))
        return result

    async def _owed(self, message: InMessage, entry: _Touched, effects: Effects) -> None:
        """What pair events ask (:mod:`rl_export.stream.comparisons`): their mirrors and
        notices forwarded to the other traces' partitions of the labels topic, by this
        partition's task (committed with its offsets); the owned pairs' snapshots noted."""
        topic = self.settings.topic_labels
        for target, value in effects.sends:
            key = target.encode()
            origin = InMessage(topic, message.partition, message.offset, key, value)
            await self.emitter.forward(origin, key, self._partition_of(target))
            kind = comparisons.VOID if _VOID_TYPE in value else "mirror"
            self.metrics.pair_sends.labels(kind).inc()
        if effects.pairs:
            entry.pairs = (entry.pairs or set()) | effects.pairs

    async def _pair_snapshots(self, entry: _Touched) -> None:
        """Step 4 for the pairs a trace owns: each changed one's snapshot, on its pair id's
        partition of ``trajectories`` (where replay places it too), sent by this task."""
        for other in sorted(entry.pairs or ()):
            pid, value = comparisons.pair_snapshot(entry.state, other)
            await self.emitter.snapshot(pid.encode(), value, entry.event_ms,
                                        self._partition_of(pid), [],
                                        task=entry.last.partition)  # fmt: skip
        self.metrics.snapshots.inc(len(entry.pairs or ()))

    async def _check_answers(self, checked: list[Any]) -> None:
        """Labels of rubric versions other than 0, and adjudications, checked against their
        version (read from the store once, :mod:`rl_export.stream.rubriccheck`); one that
        does not fit becomes its rejection. Version-0 labels were checked by the decoder."""
        answered = [
            n for n, d in enumerate(checked) if type(d) is EventView and d.answers is not None
        ]
        if not answered:
            return
        await self.rubrics.load(
            (v.org, v.project, v.rubric_version)
            for v in (checked[n] for n in answered) if type(v) is EventView
        )  # fmt: skip
        for n in answered:
            view = checked[n]
            assert type(view) is EventView
            rejection = self.rubrics.check(view)
            if rejection is not None:
                checked[n] = rejection

    async def _load_versions(self, touched: Iterable[_Touched]) -> None:
        """The rubric versions the snapshots about to be built score labels with."""
        wanted: set[VersionKey] = set()
        for entry in touched:
            st = entry.state
            if type(st) is NativeState:  # the core's: version-0 rating labels only
                continue
            if entry.emit and st.org is not None and st.project is not None:
                for version in versions_of(st.labels, st.adjudication):
                    wanted.add((st.org, st.project, version))
        if wanted:
            self.rubrics.note_missing(await self.rubrics.load(wanted))

    def _prefetch(self, messages: list[InMessage], checked: list[Any]) -> None:
        """Ask the table for the batch's states and conversations at once, before the merge.

        One RocksDB multi-get per partition costs about half as much per key as a get each
        (a cold key: 6 against 11 µs). The conversation's key is asked for every trace, even
        one that may have none: a key that is not there costs about a microsecond.
        """
        wanted: dict[int, list[bytes]] = {}
        seen: set[str] = set()
        partition_of = self._partition_of
        for message, decoded in zip(messages, checked, strict=True):
            if isinstance(decoded, EventRejection):
                continue
            trace_id = decoded.trace_id
            if trace_id in seen:
                continue
            seen.add(trace_id)
            partition = message.partition
            if partition >= 0 and partition != partition_of(trace_id):
                continue  # forwarded, not joined here
            key = decoded.key if type(decoded) is NativeEvent else trace_id.encode()
            keys = wanted.get(partition)
            if keys is None:
                keys = wanted[partition] = []
            keys += (key, CONVERSATION + key)
        self.table.prefetch(wanted)

    def _read(self, key: bytes, at: InMessage) -> tuple[TraceState | None, bytes | None]:
        """A trace's state from the table, and its conversation as the table holds it."""
        stored = self.table.get(key, at)
        state = None if stored is None else load_state(stored)
        if state is None or state.trace is None or state.trace.messages.data:
            return state, None  # no trace yet, or an older state with its conversation inline
        conversation = self.table.get(conversation_key(key), at)
        if conversation is None:
            raise ValueError(f"the join table has no conversation for {key!r}")
        state.trace.messages = RawJson(conversation)
        return state, conversation

    def _write(self, key: bytes, entry: _Touched, head: bytes, conversation: bytes) -> None:
        """Write the state (its two parts); the conversation only when it changed, or
        after a redelivery."""
        self.table.put(key, head, entry.last)
        if entry.repeated or conversation != (entry.conversation or b""):
            if conversation:
                self.table.put(conversation_key(key), conversation, entry.last)
            else:
                self.table.delete(conversation_key(key), entry.last)

    def _decode(self, messages: list[InMessage], wall: datetime) -> list[Any]:
        """Step 2 for a batch: each event natively when the core takes it, else the Python
        way (an :class:`EventView` or the rejection)."""
        core = self.native
        if core is None:
            return [self._check(message, wall) for message in messages]
        decode, codes, now_us = core.decode, self._codes, micros(wall)
        return [
            decode(m.value, m.key, codes.get(m.topic, 0), now_us) or self._check(m, wall)
            for m in messages
        ]

    def _merge_native(  # noqa: PLR0917 - once per event: positional arguments are cheaper
        self, key: bytes, message: InMessage, event: Any, entry: _Touched | None,
        touched: dict[bytes, _Touched], outcomes: Counter[tuple[str, str]], clock: float,
    ) -> bool:  # fmt: skip
        """Step 3 in the native core; False when it is not the core's (nothing changed)."""
        if entry is not None:
            state = entry.state
            if type(state) is not NativeState:
                return False  # the trace went the Python way earlier in this batch
        else:
            stored = self.table.get(key, message)
            conversation = None
            if stored is None:
                state = self.native.new_state(event.trace_id)
            else:
                state = self.native.load(stored)
                if state is None:
                    return False  # a state the core does not fully know
                if state.wants_conversation:
                    conversation = self.table.get(conversation_key(key), message)
                    if conversation is None:
                        raise ValueError(f"the join table has no conversation for {key!r}")
                    state.set_conversation(conversation)
            stored_mark = None if stored is None else state.mark()
        code = state.merge(event, clock, message)
        if code < 0:
            return False
        outcome = native.OUTCOMES[code & 3]
        outcomes[event.event_type, outcome] += 1
        if entry is None:
            entry = touched[key] = _Touched(state, message, conversation, stored_mark)
        else:
            entry.last = message
        if outcome == "duplicate":
            entry.repeated = True
        if code & native.EMITS:
            entry.emit = True
            entry.event_ms = message.timestamp_ms
        return True

    def _deadline(self, mark: bytes) -> float | None:
        """When a state with this expiry mark may expire, under the current retentions."""
        kind, _, since = mark.partition(b" ")
        try:
            start = float(since)
        except ValueError:
            return None
        if kind == b"tombstone":
            return start + self.settings.tombstone_retention_s
        if kind == b"orphan":
            return start + self.settings.orphan_retention_s
        return None

    def _schedule(self, key: bytes, mark: bytes, partition: int) -> None:
        deadline = self._deadline(mark)
        if deadline is not None:
            heapq.heappush(self._expiry.setdefault(partition, []), (deadline, key))

    def load_expiry(self, marks: Iterable[tuple[bytes, bytes]], partition: int) -> int:
        """Replace a partition's expiry index with the table's (its marks); return how many."""
        self._expiry.pop(partition, None)
        count = 0
        for key, mark in marks:
            self._schedule(key, mark, partition)
            count += 1
        return count

    def rebuild_expiry(
        self, items: Iterable[tuple[bytes, bytes]], partition: int | None = None
    ) -> dict[bytes, bytes]:
        """Rebuild the expiry index from a scan of every state; return the marks found.

        For a table written before it kept its index (a one-time scan). With ``partition``,
        ``items`` are that partition's and only its index is replaced.
        """
        if partition is None:
            self._expiry.clear()
        else:
            self._expiry.pop(partition, None)
        marks = {}
        for key, value in items:
            mark = expiry_mark_of(key, value)
            if mark is not None:
                where = self._hash(key, self.settings.partitions)
                self._schedule(key, mark, where if partition is None else partition)
                marks[key] = mark
        return marks

    def forget_partition(self, partition: int) -> None:
        """Drop the expiry index of a partition this worker no longer owns."""
        self._expiry.pop(partition, None)

    def _expire(self, messages: list[InMessage], now: float) -> list[tuple[bytes, str]]:
        dropped: list[tuple[bytes, str]] = []
        at_partition = {m.partition: m for m in messages}
        for partition, at in at_partition.items():
            heap = self._expiry.get(partition)
            while heap and heap[0][0] <= now:
                _, key = heapq.heappop(heap)
                stored = self.table.get(key, at)
                if stored is None:
                    continue
                kind = expired(
                    load_state(stored),
                    now,
                    self.settings.orphan_retention_s,
                    self.settings.tombstone_retention_s,
                )
                if kind is not None:  # the state may have moved on since it was indexed
                    self.table.delete(key, at)
                    self.table.delete(conversation_key(key), at)
                    self.table.mark(key, None, at)
                    self.metrics.expired.labels(kind).inc()
                    dropped.append((key, kind))
        return dropped
