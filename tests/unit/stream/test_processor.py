"""The join worker without a broker: :meth:`JoinProcessor.process` over in-memory batches.

Each test builds a :class:`Harness` (settings with 4 partitions, a :class:`MemoryTable`, a
collecting emitter and a fresh metrics registry), feeds it batches of Kafka-like messages and
checks the snapshots, dead letters, table writes, metrics and expiry (DESIGN.md sections 2-3).
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from typing import Any

import orjson
import pytest
from prometheus_client import CollectorRegistry

from rl_export.model.events import EventFamily, EventRejection, RejectReason, format_utc
from rl_export.model.partitioning import partition_for
from rl_export.model.records import ERASED_REVISION
from rl_export.model.snapshots import Headers, decode_snapshot
from rl_export.runtime.metrics import Metrics
from rl_export.runtime.settings import Settings
from rl_export.stream.deadletters import dead_letter_headers
from rl_export.stream.join import TraceState
from rl_export.stream.processor import (
    BatchResult,
    InMessage,
    JoinProcessor,
    MemoryTable,
    conversation_key,
    expiry_mark_of,
)
from rl_export.stream.state import load_state
from tests.factories import RUBRIC, event

PARTITIONS = 4
NOW_DT = datetime(2026, 1, 2, tzinfo=UTC)
NOW = NOW_DT.timestamp()
TS_MS = int((NOW - 1.5) * 1000)  # Kafka timestamp of every message: 1.5 s before NOW
ORPHAN_S = 3600.0
TOMBSTONE_S = 7200.0


# --- builders --------------------------------------------------------------------------------


class CollectingEmitter:
    """An :class:`~rl_export.stream.processor.Emitter` that keeps what it is given."""

    def __init__(self) -> None:
        self.snapshots: list[tuple[bytes, bytes, int | None]] = []
        self.pair_snapshots: list[tuple[bytes, bytes, int]] = []
        self.forwards: list[tuple[InMessage, bytes, int]] = []
        self.dead_letters: list[tuple[InMessage, EventRejection]] = []
        self.flushes = 0
        self.consumed: list[dict[tuple[str, int], int]] = []

    async def snapshot(
        self, key: bytes, value: bytes, event_ms: int | None, partition: int,
        headers: Headers, *, task: int | None = None,
    ) -> None:  # fmt: skip
        if task is not None:  # a pair's snapshot, on its pair id's partition
            assert partition == partition_of(key.decode())
            self.pair_snapshots.append((key, value, task))
            return
        # A live snapshot says where its record is, or the sink would parse all of it.
        assert headers or decode_snapshot(value)["deleted"]
        self.snapshots.append((key, value, event_ms))

    async def forward(self, message: InMessage, key: bytes, partition: int) -> None:
        self.forwards.append((message, key, partition))

    async def dead_letter(self, message: InMessage, rejection: EventRejection) -> None:
        self.dead_letters.append((message, rejection))

    async def flush(self, consumed: Mapping[tuple[str, int], int]) -> None:
        self.flushes += 1
        self.consumed.append(dict(consumed))

    def revisions(self, trace_id: str) -> list[int]:
        key = trace_id.encode()
        return [decode_snapshot(v)["revision"] for k, v, _ in self.snapshots if k == key]


class CountingTable(MemoryTable):
    """A :class:`MemoryTable` that records every key written."""

    def __init__(self) -> None:
        super().__init__()
        self.puts: list[bytes] = []
        self.deletes: list[bytes] = []

    def put(self, key: bytes, value: bytes, at: InMessage) -> None:
        self.puts.append(key)
        super().put(key, value, at)

    def delete(self, key: bytes, at: InMessage) -> None:
        self.deletes.append(key)
        super().delete(key, at)


def partition_of(trace_id: str) -> int:
    return partition_for(trace_id.encode(), PARTITIONS)


def trace_ids_on(partition: int, count: int, prefix: str = "tr") -> list[str]:
    """The first ``count`` trace ids ``{prefix}-N`` that Kafka puts on ``partition``."""
    found = (f"{prefix}-{n}" for n in itertools.count())
    return list(itertools.islice((t for t in found if partition_of(t) == partition), count))


def at(offset_s: float) -> str:
    """An ``occurred_at`` ``offset_s`` seconds from the worker's clock ``NOW``."""
    return format_utc(NOW_DT + timedelta(seconds=offset_s))


class Harness:
    """A processor with its settings, table, emitter and metrics, and a message builder."""

    def __init__(self, table: CountingTable | None = None, **overrides: Any) -> None:
        values: dict[str, Any] = {
            "partitions": PARTITIONS,
            "orphan_retention_s": ORPHAN_S,
            "tombstone_retention_s": TOMBSTONE_S,
        }
        self.settings = Settings(**(values | overrides))
        self.table = table if table is not None else CountingTable()
        self.emitter = CollectingEmitter()
        self.registry = CollectorRegistry()
        self.families = {
            self.settings.topic_traces: EventFamily.TRACES,
            self.settings.topic_evaluations: EventFamily.EVALUATIONS,
            self.settings.topic_labels: EventFamily.LABELS,
        }
        self.processor = JoinProcessor(
            self.settings, self.table, self.emitter, Metrics(self.registry), self.families
        )
        self._offsets = itertools.count(100)

    def topic_of(self, event_type: str) -> str:
        family = event_type.split(".", 1)[0]
        return {
            "trace": self.settings.topic_traces,
            "evaluation": self.settings.topic_evaluations,
            "label": self.settings.topic_labels,
        }[family]

    def message(
        self,
        ev: dict[str, Any],
        *,
        topic: str | None = None,
        partition: int | None = None,
        key: bytes | None = None,
        value: bytes | None = None,
        timestamp_ms: int | None = TS_MS,
    ) -> InMessage:
        """A Kafka message carrying ``ev``, on its topic, keyed and partitioned correctly."""
        trace_id: str = ev["trace_id"]
        return InMessage(
            topic=topic or self.topic_of(ev["event_type"]),
            partition=partition_of(trace_id) if partition is None else partition,
            offset=next(self._offsets),
            key=trace_id.encode() if key is None else key,
            value=orjson.dumps(ev) if value is None else value,
            timestamp_ms=timestamp_ms,
        )

    async def run(self, *items: dict[str, Any] | InMessage, now: float = NOW) -> BatchResult:
        messages = [i if isinstance(i, InMessage) else self.message(i) for i in items]
        return await self.processor.process(messages, now=now)

    def metric(self, name: str, **labels: str) -> float | None:
        return self.registry.get_sample_value(name, labels)

    def state(self, trace_id: str) -> TraceState:
        key = trace_id.encode()
        conversation = self.table.data.get(conversation_key(key))
        head = self.table.data[key]
        return load_state(head, conversation)


def trace(event_id: str = "t-1", trace_id: str = "tr-1", **fields: Any) -> dict[str, Any]:
    return event("trace.completed", event_id, trace_id=trace_id, **fields)


def evaluation(event_id: str = "v-1", trace_id: str = "tr-1", **fields: Any) -> dict[str, Any]:
    return event("evaluation.finished", event_id, trace_id=trace_id, **fields)


def label(event_id: str = "l-1", trace_id: str = "tr-1", **fields: Any) -> dict[str, Any]:
    return event("label.submitted", event_id, trace_id=trace_id, **fields)


def headers_of(letter: tuple[InMessage, EventRejection]) -> dict[str, bytes]:
    return dict(dead_letter_headers(*letter))


def assert_dead_letter(
    h: Harness, letter: tuple[InMessage, EventRejection], source: InMessage, reason: RejectReason
) -> None:
    """The dead letter is ``source``'s original bytes, with where it came from and why."""
    sent, rejection = letter
    assert rejection.reason is reason
    assert sent.value == source.value
    assert sent.key == source.key
    assert headers_of(letter) == {
        "rl-export-reason": reason.value.encode(),
        "rl-export-detail": rejection.detail.encode(),
        "rl-export-source-topic": source.topic.encode(),
        "rl-export-source-partition": str(source.partition).encode(),
        "rl-export-source-offset": str(source.offset).encode(),
    }
    assert rejection.detail
    assert h.metric("rl_export_dead_letters_total", reason=reason.value) == 1


# --- joining a batch ---------------------------------------------------------------------------


async def test_one_batch_of_one_trace_emits_its_last_snapshot_and_writes_once() -> None:
    h = Harness()
    result = await h.run(trace(), evaluation(), label())

    assert h.emitter.revisions("tr-1") == [3]
    key, value, event_ms = h.emitter.snapshots[0]
    snapshot = decode_snapshot(value)
    assert (key, event_ms) == (b"tr-1", TS_MS)
    assert value == result.snapshots[b"tr-1"]
    assert snapshot["human"] == {"reward": 0.8, "passed": True}
    assert snapshot["evaluator"] == {"reward": 0.8, "passed": True}
    assert h.table.puts == [b"tr-1", conversation_key(b"tr-1")]  # the state, the conversation
    assert h.state("tr-1").revision == 3
    assert result.rejected == []
    assert h.emitter.dead_letters == []


async def test_two_batches_emit_two_snapshots_with_growing_revisions() -> None:
    h = Harness()
    await h.run(trace())
    await h.run(evaluation(), label())

    assert h.emitter.revisions("tr-1") == [1, 3]
    # The conversation is written when the trace arrives, not again for its label.
    assert h.table.puts == [b"tr-1", conversation_key(b"tr-1"), b"tr-1"]
    assert h.state("tr-1").revision == 3


async def test_two_traces_in_one_batch_emit_one_snapshot_each() -> None:
    h = Harness()
    result = await h.run(trace(), trace("t-2", "tr-2"), label(), label("l-2", "tr-2"))

    assert h.emitter.revisions("tr-1") == [2]
    assert h.emitter.revisions("tr-2") == [2]
    assert len(h.emitter.snapshots) == 2
    assert set(result.snapshots) == {b"tr-1", b"tr-2"}
    assert sorted(h.table.puts) == [b"tr-1", b"tr-2", b"\xfftr-1", b"\xfftr-2"]


async def test_events_before_their_trace_wait_and_emit_nothing() -> None:
    h = Harness()
    result = await h.run(label(), evaluation())

    assert h.emitter.snapshots == []
    assert result.snapshots == {}
    assert h.table.puts == [b"tr-1"]
    assert h.metric("rl_export_join_events_total", event_type="label.submitted",
                    outcome="pending") == 1  # fmt: skip

    await h.run(trace())
    assert h.emitter.revisions("tr-1") == [3]


# --- dead letters ------------------------------------------------------------------------------


def bad_json(h: Harness) -> InMessage:
    return h.message(label(), value=b'{"event_id": "l-bad", "event_type":')


def unknown_event_type(h: Harness) -> InMessage:
    return h.message(trace("t-bad") | {"event_type": "trace.exploded"})


def rubric_of_six(h: Harness) -> InMessage:
    return h.message(label("l-bad", rubric=RUBRIC | {"safety": 6}))


def score_above_one(h: Harness) -> InMessage:
    results = [{"evaluator": "judge", "score": 1.5, "passed": True, "reasoning": "ok"}]
    return h.message(evaluation("v-bad", results=results))


def unparseable_date(h: Harness) -> InMessage:
    return h.message(label("l-bad", at="yesterday at noon"))


def oversized(h: Harness) -> InMessage:
    messages = [{"role": "user", "content": "x" * 100} for _ in range(20)]
    return h.message(trace("t-big", messages=messages))


def future(h: Harness) -> InMessage:
    return h.message(label("l-bad", at=at(2 * 86400)))


def label_on_traces_topic(h: Harness) -> InMessage:
    return h.message(label("l-bad"), topic=h.settings.topic_traces)


def key_mismatch(h: Harness) -> InMessage:
    return h.message(label("l-bad"), key=b"tr-2")


@pytest.mark.parametrize(
    ("build", "reason"),
    [
        (bad_json, RejectReason.BAD_JSON),
        (unknown_event_type, RejectReason.UNKNOWN_EVENT_TYPE),
        (rubric_of_six, RejectReason.INVALID),
        (score_above_one, RejectReason.INVALID),
        (unparseable_date, RejectReason.INVALID),
        (oversized, RejectReason.OVERSIZED),
        (future, RejectReason.FUTURE),
        (label_on_traces_topic, RejectReason.WRONG_TOPIC),
        (key_mismatch, RejectReason.KEY_MISMATCH),
    ],
    ids=lambda v: getattr(v, "__name__", None),
)
async def test_a_bad_event_is_dead_lettered_and_the_stream_goes_on(
    build: Any, reason: RejectReason
) -> None:
    h = Harness(max_event_bytes=1024)
    bad = build(h)
    result = await h.run(bad, trace(), label())

    assert len(h.emitter.dead_letters) == 1
    letter = h.emitter.dead_letters[0]
    assert letter[0].value is bad.value  # the original bytes, untouched
    assert_dead_letter(h, letter, bad, reason)
    assert result.rejected == [letter]
    assert h.metric("rl_export_join_events_total", event_type="unknown", outcome="rejected") == 1
    # The good events after it were joined, and the bad one does not count in the revision.
    assert h.emitter.revisions("tr-1") == [2]
    assert h.state("tr-1").revision == 2


async def test_an_event_on_another_partition_is_forwarded_to_its_traces_not_joined_here() -> None:
    h = Harness()
    home = partition_of("tr-1")
    elsewhere = (home + 1) % PARTITIONS
    stray = h.message(label("l-stray"), partition=elsewhere)
    stray.key = None  # a client that ignores keys
    result = await h.run(trace(), stray)

    assert h.emitter.dead_letters == []
    assert result.rejected == []
    [(message, key, partition)] = h.emitter.forwards
    assert (message, key, partition) == (stray, b"tr-1", home)  # keyed even when sent without
    assert h.state("tr-1").revision == 1  # joined only where it lands, on its own partition
    assert h.metric("rl_export_join_events_total", event_type="label.submitted",
                    outcome="forwarded") == 1  # fmt: skip
    counted = {
        m: h.metric("rl_export_join_forwarded_total", matches=m)
        for m in ("murmur2", "crc32", "fnv1a", "none")
    }
    assert sum(v or 0 for v in counted.values()) == 1
    assert h.emitter.flushes == 1  # the forward goes out with the batch, before its commit

    # Forwarded, it arrives on its trace's partition and is joined like any event.
    await h.run(h.message(label("l-stray"), partition=home))
    assert h.state("tr-1").revision == 2
    assert h.emitter.revisions("tr-1") == [1, 2]


async def test_a_producer_with_another_partitioner_is_named_in_the_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    h = Harness()
    ids = [f"tr-{n}" for n in range(200)]
    misrouted = [
        h.message(trace(f"t-{t}", t), partition=partition_for(t.encode(), PARTITIONS, "crc32"))
        for t in ids
        if partition_for(t.encode(), PARTITIONS, "crc32") != partition_of(t)
    ]
    assert len(misrouted) > 100
    caplog.set_level("WARNING")
    await h.processor.process(misrouted, now=NOW)
    assert not [r for r in caplog.records if "forwarded" in r.message]  # not yet: once a minute
    await h.processor.process(misrouted[:1], now=NOW + 61)
    [warning] = [r.message for r in caplog.records if "forwarded" in r.message]
    assert f"{len(misrouted) + 1} events in the last 61s" in warning
    assert "RL_EXPORT_PARTITIONER=crc32 would route these events directly" in warning
    assert len(h.emitter.forwards) == len(misrouted) + 1
    assert h.metric("rl_export_join_forwarded_total", matches="crc32") == len(misrouted) + 1


async def test_an_early_event_of_another_org_is_dead_lettered_when_the_trace_arrives() -> None:
    h = Harness()
    early = h.message(label("l-evil", org="evil-corp"))
    await h.run(early)
    assert h.emitter.dead_letters == []  # pending: it cannot be checked yet

    result = await h.run(trace(), label())

    assert len(h.emitter.dead_letters) == 1
    letter = h.emitter.dead_letters[0]
    assert_dead_letter(h, letter, early, RejectReason.ORG_MISMATCH)
    assert result.rejected == [letter]
    # It never counts; the trace and the label after it do.
    assert h.emitter.revisions("tr-1") == [2]
    assert h.state("tr-1").labels.keys() == {"ana"}
    assert "l-evil" not in h.state("tr-1").seen


async def test_an_event_of_another_org_after_the_trace_is_dead_lettered() -> None:
    h = Harness()
    await h.run(trace())
    bad = h.message(label("l-evil", org="evil-corp"))
    result = await h.run(bad, label())

    assert len(h.emitter.dead_letters) == 1
    letter = h.emitter.dead_letters[0]
    assert letter[0].value is bad.value
    assert_dead_letter(h, letter, bad, RejectReason.ORG_MISMATCH)
    assert result.rejected == [letter]
    assert h.emitter.revisions("tr-1") == [1, 2]
    assert h.metric("rl_export_join_events_total", event_type="label.submitted",
                    outcome="rejected") == 1  # fmt: skip


# --- duplicates and deletion ---------------------------------------------------------------------


async def test_a_redelivered_event_re_emits_the_same_revision_and_rewrites_the_state() -> None:
    h = Harness()
    sent = h.message(label())
    await h.run(trace(), sent)
    stored = h.table.data[b"tr-1"]
    first = h.emitter.snapshots[-1]

    result = await h.run(sent)

    assert h.emitter.revisions("tr-1") == [2, 2]
    assert h.emitter.snapshots[-1][1] == first[1]  # the very same snapshot
    assert decode_snapshot(result.snapshots[b"tr-1"])["revision"] == 2
    # Both rewritten, in case the first writes were lost.
    assert h.table.puts == [b"tr-1", conversation_key(b"tr-1")] * 2
    assert h.table.data[b"tr-1"] == stored
    assert h.metric("rl_export_join_events_total", event_type="label.submitted",
                    outcome="duplicate") == 1  # fmt: skip
    assert h.metric("rl_export_join_events_total", event_type="label.submitted",
                    outcome="accepted") == 1  # fmt: skip


async def test_a_deletion_removes_the_conversation_and_a_redelivery_removes_it_again() -> None:
    h = Harness()
    await h.run(trace(), label())
    assert conversation_key(b"tr-1") in h.table.data
    deletion = h.message(event("trace.deleted", "d-1"))

    await h.run(deletion)
    assert conversation_key(b"tr-1") not in h.table.data
    assert h.state("tr-1").deleted

    h.table.deletes.clear()
    await h.run(deletion)  # the first delete may not have reached the changelog
    assert h.table.deletes == [conversation_key(b"tr-1")]


@pytest.mark.parametrize("layout", ["v2 with its conversation", "v2 head"])
async def test_a_state_of_an_older_version_is_read_and_rewritten(layout: str) -> None:
    """A table written by an earlier version (state v2, the conversation inline or under
    its own key) still loads, and the next write is the current version."""
    h = Harness()
    await h.run(trace())
    key = b"tr-1"
    state = h.state("tr-1")
    conversation = h.table.data.pop(conversation_key(key))
    if layout == "v2 head":
        h.table.data[key] = version_2(state).partition(b"\n")[0]
        h.table.data[conversation_key(key)] = conversation
    else:
        h.table.data[key] = version_2(state)

    await h.run(label())

    assert h.state("tr-1").revision == 2
    assert h.table.data[key].startswith(b"\x03")
    assert h.table.data[conversation_key(key)] == conversation
    first, last = (decode_snapshot(v)["messages"] for _, v, _ in h.emitter.snapshots)
    assert last == first


async def test_a_deletion_of_a_trace_the_join_never_saw_emits_its_tombstone_at_once() -> None:
    """Backfilled by replay (or expired, or another run's): the join has no trace for it."""
    h = Harness()
    done = await h.run(event("trace.deleted", "d-1", trace_id="tr-9"))
    assert [decode_snapshot(v) for v in done.snapshots.values()] == [
        {"trace_id": "tr-9", "org": "acme", "project": "bot", "revision": ERASED_REVISION,
         "deleted": True}]  # fmt: skip
    later = await h.run(trace("t-9", "tr-9"))  # the trace, re-sent: it stays deleted
    assert [decode_snapshot(v)["deleted"] for v in later.snapshots.values()] == [True]
    assert h.state("tr-9").deleted


async def test_a_deleted_trace_emits_one_tombstone_then_nothing() -> None:
    h = Harness()
    await h.run(trace(), label())
    await h.run(event("trace.deleted", "d-1"))
    later = await h.run(evaluation(), label("l-2", labeler="bob"))

    tombstones = [s for _, v, _ in h.emitter.snapshots if (s := decode_snapshot(v))["deleted"]]
    assert tombstones == [{"trace_id": "tr-1", "org": "acme", "project": "bot",
                           "revision": ERASED_REVISION, "deleted": True}]  # fmt: skip
    assert len(h.emitter.snapshots) == 2  # the live snapshot, then the tombstone; nothing after
    assert later.snapshots == {}
    state = h.state("tr-1")
    assert state.revision == 5  # later events count, but change nothing
    assert state.trace is None
    assert state.labels == {}
    assert state.evaluation is None
    assert h.metric("rl_export_join_events_total", event_type="label.submitted",
                    outcome="ignored") == 1  # fmt: skip


# --- metrics -----------------------------------------------------------------------------------


async def test_metrics_count_snapshots_table_keys_latency_and_batch_sizes() -> None:
    h = Harness()
    no_timestamp = h.message(trace("t-2", "tr-2"), timestamp_ms=None)
    await h.run(trace(), no_timestamp, label("l-3", "tr-3"))  # tr-3 is an orphan

    assert h.metric("rl_export_join_snapshots_total") == 2
    # Three states and two conversations (the orphan has none yet).
    assert h.metric("rl_export_join_table_keys") == len(h.table) == 5
    assert h.metric("rl_export_join_latency_seconds_count") == 1  # only tr-1 had a timestamp
    assert h.metric("rl_export_join_latency_seconds_sum") == pytest.approx(1.5)
    assert h.metric("rl_export_join_batch_events_count") == 1
    assert h.metric("rl_export_join_batch_events_sum") == 3

    await h.run(label(), label("l-2", "tr-2"))

    assert h.metric("rl_export_join_snapshots_total") == 4
    assert h.metric("rl_export_join_table_keys") == len(h.table) == 5
    assert h.metric("rl_export_join_latency_seconds_count") == 3
    assert h.metric("rl_export_join_batch_events_count") == 2
    assert h.metric("rl_export_join_batch_events_sum") == 5


# --- expiry ------------------------------------------------------------------------------------

P = 0
ORPHAN, OTHER, THIRD = trace_ids_on(P, 3)
ELSEWHERE = trace_ids_on((P + 1) % PARTITIONS, 1)[0]


async def test_an_orphan_expires_when_its_partition_moves_past_the_retention() -> None:
    h = Harness()
    await h.run(label(trace_id=ORPHAN))
    assert ORPHAN.encode() in h.table.data

    result = await h.run(trace(trace_id=OTHER), now=NOW + ORPHAN_S + 1)

    assert result.expired == [(ORPHAN.encode(), "orphan")]
    assert ORPHAN.encode() not in h.table.data
    assert OTHER.encode() in h.table.data
    assert h.metric("rl_export_join_expired_total", kind="orphan") == 1
    assert h.metric("rl_export_join_table_keys") == len(h.table) == 2  # OTHER's two keys


async def test_an_orphan_does_not_expire_before_its_retention() -> None:
    h = Harness()
    await h.run(label(trace_id=ORPHAN))
    result = await h.run(trace(trace_id=OTHER), now=NOW + ORPHAN_S - 1)

    assert result.expired == []
    assert ORPHAN.encode() in h.table.data


async def test_an_orphan_is_not_expired_by_another_partitions_batch() -> None:
    h = Harness()
    await h.run(label(trace_id=ORPHAN))

    elsewhere = await h.run(trace(trace_id=ELSEWHERE), now=NOW + ORPHAN_S + 1)
    assert elsewhere.expired == []
    assert ORPHAN.encode() in h.table.data
    assert h.metric("rl_export_join_expired_total", kind="orphan") is None

    here = await h.run(trace(trace_id=OTHER), now=NOW + ORPHAN_S + 2)
    assert here.expired == [(ORPHAN.encode(), "orphan")]


async def test_a_tombstone_expires_after_its_own_retention() -> None:
    h = Harness()
    await h.run(trace(trace_id=ORPHAN), event("trace.deleted", "d-1", trace_id=ORPHAN))

    # Past the orphan retention but not the tombstone's: kept.
    kept = await h.run(trace(trace_id=OTHER), now=NOW + ORPHAN_S + 1)
    assert kept.expired == []
    assert h.state(ORPHAN).deleted

    result = await h.run(trace(trace_id=THIRD), now=NOW + TOMBSTONE_S + 1)
    assert result.expired == [(ORPHAN.encode(), "tombstone")]
    assert ORPHAN.encode() not in h.table.data
    assert h.metric("rl_export_join_expired_total", kind="tombstone") == 1
    assert h.metric("rl_export_join_expired_total", kind="orphan") is None


async def test_an_orphan_whose_trace_arrived_in_time_is_kept() -> None:
    h = Harness()
    await h.run(label(trace_id=ORPHAN))
    await h.run(trace(trace_id=ORPHAN), now=NOW + 10)

    result = await h.run(trace(trace_id=OTHER), now=NOW + ORPHAN_S + 1)

    assert result.expired == []
    assert h.state(ORPHAN).revision == 2
    assert h.metric("rl_export_join_expired_total", kind="orphan") is None


async def test_rebuild_expiry_lets_a_fresh_processor_expire_stored_states() -> None:
    first = Harness()
    await first.run(
        label(trace_id=ORPHAN),
        trace(trace_id=OTHER),
        event("trace.deleted", "d-1", trace_id=OTHER),
        trace(trace_id=THIRD),  # live: never expires
    )

    h = Harness(table=first.table)
    assert len(h.processor.rebuild_expiry(h.table.items())) == 2

    result = await h.run(label(trace_id=ELSEWHERE), now=NOW + TOMBSTONE_S + 1)
    assert result.expired == []  # another partition

    result = await h.run(label(trace_id=THIRD), now=NOW + TOMBSTONE_S + 1)
    assert sorted(result.expired) == sorted(
        [(ORPHAN.encode(), "orphan"), (OTHER.encode(), "tombstone")]
    )
    assert set(h.table.data) == {THIRD.encode(), conversation_key(THIRD.encode()),
                                 ELSEWHERE.encode()}  # fmt: skip
    assert h.metric("rl_export_join_expired_total", kind="orphan") == 1
    assert h.metric("rl_export_join_expired_total", kind="tombstone") == 1


async def test_the_table_keeps_an_expiry_index_of_what_may_expire() -> None:
    h = Harness()
    await h.run(
        label(trace_id=ORPHAN),
        trace(trace_id=OTHER),
        event("trace.deleted", "d-1", trace_id=OTHER),
        trace(trace_id=THIRD),  # live: never expires
    )
    assert set(h.table.marks) == {ORPHAN.encode(), OTHER.encode()}
    assert h.table.marks[ORPHAN.encode()].startswith(b"orphan ")
    assert h.table.marks[OTHER.encode()].startswith(b"tombstone ")
    # A restore reads the same from a stored state's head alone.
    for key, value in h.table.data.items():
        assert expiry_mark_of(key, value) == h.table.marks.get(key)

    await h.run(trace(trace_id=ORPHAN), now=NOW + 10)  # its trace came: no longer an orphan
    assert set(h.table.marks) == {OTHER.encode()}

    # A fresh processor loads the index instead of reading every state, and expires.
    fresh = Harness(table=h.table)
    assert fresh.processor.load_expiry(h.table.marks.items(), partition_of(OTHER)) == 1
    result = await fresh.run(label(trace_id=THIRD), now=NOW + TOMBSTONE_S + 1)
    assert result.expired == [(OTHER.encode(), "tombstone")]
    assert h.table.marks == {}


async def test_every_batch_is_flushed_before_it_is_acked() -> None:
    h = Harness()
    await h.processor.process([h.message(event("trace.completed", "t-1"))], now=NOW)
    await h.processor.process([h.message(event("label.skipped", "s-1"))], now=NOW)
    assert h.emitter.flushes == 2


def version_2(st: TraceState) -> bytes:
    """A state as version 2 of the table wrote it: one JSON object, the messages after it on
    a second line (the layout ``load_state`` must go on reading)."""
    assert st.trace is not None
    evaluation = None
    if st.evaluation is not None:
        view = st.evaluation.view.value()
        evaluation = [list(st.evaluation.key), st.evaluation.evaluation_id, view["results"],
                      view["report"]]  # fmt: skip
    head = {
        "v": 2, "id": st.trace_id, "org": st.org, "project": st.project,
        "seen": sorted(st.seen), "pending": [], "first_pending_at": st.first_pending_at,
        "trace": [list(st.trace.key), st.trace.agent_version, st.trace.scenario,
                  st.trace.attachments.value()],
        "evaluation": evaluation,
        "labels": {k: [list(v.key), None if v.rubric is None else list(v.rubric)]
                   for k, v in sorted(st.labels.items())},
        "skipped_by": sorted(st.skipped_by), "updated_at": st.updated_at,
        "deleted_at": st.deleted_at, "deleted_revision": st.deleted_revision,
    }  # fmt: skip
    return orjson.dumps(head) + b"\n" + st.trace.messages.data
