"""The join's native core gives what the Python rules give, byte for byte, or leaves it to them.

Two processors, one with the native core (``RL_EXPORT_JOIN_NATIVE=on``) and one with the
Python rules only (``off``), take the same generated event sequences, in the same batches,
at the same clocks: ordinary traffic, and hostile traffic (unicode and escapes, huge and odd
numbers, duplicates, events out of order and before their trace, another org, deletions,
orphans that expire, wrong topics and keys, future clocks, fields of a later schema, broken
JSON). Everything they produce must be the same: every byte of the table (states,
conversations, the expiry index), every snapshot's value and headers, every dead letter with
its reason and detail, every forward and every expired state. And the core must have taken
most of the ordinary traffic, so that these comparisons are of the core, not of the Python
rules twice.
"""

from __future__ import annotations

import asyncio
import random
from typing import Any

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry

from rl_export.local.synthetic import SHAPES, generate
from rl_export.model import snapshots
from rl_export.model.codec import dumps
from rl_export.model.errors import ConfigError
from rl_export.model.events import EventFamily, EventRejection
from rl_export.model.partitioning import partition_for
from rl_export.model.snapshots import HEADER_RECORD_AT, Headers, SnapshotLines
from rl_export.runtime.metrics import Metrics
from rl_export.runtime.settings import Settings
from rl_export.stream import native
from rl_export.stream.processor import InMessage, JoinProcessor, MemoryTable
from tests.factories import event
from tests.unit.corpora.test_records_unchanged import special_events
from tests.unit.model.test_eventview import evaluations, traces

pytestmark = pytest.mark.skipif(
    not native.available(), reason="the native core is not built here (make install needs cargo)"
)

rl_export_native: Any = pytest.importorskip("rl_export_native") if native.available() else None

NOW = 1_770_000_000.25  # 2026-02-02T02:40:00.25Z: after the events' times
PARTITIONS = 2


class Recorder:
    """An emitter that keeps everything, in order."""

    def __init__(self) -> None:
        self.sent: list[tuple[Any, ...]] = []

    async def snapshot(
        self, key: bytes, value: bytes, event_ms: int | None, partition: int, headers: Headers
    ) -> None:
        self.sent.append(("snapshot", key, value, event_ms, partition, headers))

    async def forward(self, message: InMessage, key: bytes, partition: int) -> None:
        self.sent.append(("forward", message.value, message.offset, key, partition))

    async def dead_letter(self, message: InMessage, rejection: EventRejection) -> None:
        self.sent.append(
            ("dead", message.topic, message.partition, message.offset, message.key,
             message.value, rejection.reason, rejection.detail)
        )  # fmt: skip

    async def flush(self, consumed: Any) -> None:
        self.sent.append(("flush", sorted(consumed.items())))


class Side:
    """One processor (native on or off) with its table and what it emitted."""

    def __init__(self, mode: str, **overrides: Any) -> None:
        values: dict[str, Any] = {
            "partitions": PARTITIONS,
            "orphan_retention_s": 50.0,
            "tombstone_retention_s": 30.0,
            "join_native": mode,
        }
        self.settings = Settings(**(values | overrides))
        self.table = MemoryTable()
        self.emitter = Recorder()
        self.registry = CollectorRegistry()
        families = {
            self.settings.topic_traces: EventFamily.TRACES,
            self.settings.topic_evaluations: EventFamily.EVALUATIONS,
            self.settings.topic_labels: EventFamily.LABELS,
        }
        self.processor = JoinProcessor(
            self.settings, self.table, self.emitter, Metrics(self.registry), families
        )
        self.expired: list[Any] = []

    async def run(self, batch: list[InMessage], now: float) -> None:
        copies = [InMessage(m.topic, m.partition, m.offset, m.key, m.value, m.timestamp_ms)
                  for m in batch]  # fmt: skip
        result = await self.processor.process(copies, now=now)
        self.expired.append(result.expired)

    def count(self, core: str) -> float:
        value = self.registry.get_sample_value("rl_export_join_core_events_total", {"core": core})
        return value or 0.0


def topic_of(settings: Settings, value: dict[str, Any]) -> str:
    family = str(value.get("event_type")).split(".", 1)[0]
    return {
        "trace": settings.topic_traces,
        "evaluation": settings.topic_evaluations,
        "label": settings.topic_labels,
    }.get(family, settings.topic_labels)


def both_sides(
    items: list[tuple[Any, dict[str, Any]]], batches: list[int], clocks: list[float]
) -> tuple[Side, Side]:
    """Run ``items`` (an event, and how it travels: its bytes if not the event's, its topic,
    partition and key if not its own) through both."""
    on, off = Side("on"), Side("off")
    messages = []
    for offset, (value, how) in enumerate(items):
        raw = how.get("raw") or orjson.dumps(value)
        trace_id = value.get("trace_id")
        key = how.get("key", trace_id.encode() if isinstance(trace_id, str) else None)
        partition = how.get("partition")
        if partition is None:
            partition = (
                partition_for(trace_id.encode(), PARTITIONS, on.settings.partitioner)
                if isinstance(trace_id, str) else 0
            )  # fmt: skip
        topic = how.get("topic") or topic_of(on.settings, value)
        messages.append(InMessage(topic, partition, offset, key, raw, how.get("ts", 1_000)))

    async def go() -> None:
        start = 0
        for size, clock in zip(batches, clocks, strict=False):
            batch = messages[start : start + size]
            start += size
            for side in (on, off):
                await side.run(batch, clock)
        for side in (on, off):  # the rest, and a late batch that lets everything expire
            await side.run(messages[start:], clocks[-1] + 1)
            await side.run([], clocks[-1] + 1000)

    asyncio.run(go())
    return on, off


def assert_same(on: Side, off: Side) -> None:
    assert on.table.data == off.table.data
    assert on.table.marks == off.table.marks
    assert on.emitter.sent == off.emitter.sent
    assert on.expired == off.expired


# --- the writers: floats and strings as orjson and codec.dumps write them ------------------


@settings(max_examples=2000, deadline=None)
@given(st.floats(allow_nan=False, allow_infinity=False))
def test_floats_are_written_as_orjson_writes_them(value: float) -> None:
    assert rl_export_native.format_float(value).encode() == orjson.dumps(value)


@pytest.mark.parametrize(
    "value",
    [0.0, -0.0, 1.0, 0.1, 1e15, 1e16, 1e-5, 1e-6, 2.5e-5, 123456789012345.67, 5e-324,
     1.7976931348623157e308, 0.30000000000000004, 1767225600.123456, 1e21, 1e22],
)  # fmt: skip
def test_float_edges_are_written_as_orjson_writes_them(value: float) -> None:
    assert rl_export_native.format_float(value).encode() == orjson.dumps(value)


@settings(max_examples=2000, deadline=None)
@given(st.one_of(st.floats(allow_nan=False, allow_infinity=False), st.floats(1e9, 3e9)))
def test_expiry_times_are_written_as_repr_writes_them(value: float) -> None:
    assert rl_export_native.format_repr(value) == repr(value)


@settings(max_examples=500, deadline=None)
@given(st.text(alphabet=st.characters(exclude_categories=["Cs"])))
def test_strings_are_written_as_codec_dumps_writes_them(value: str) -> None:
    assert rl_export_native.format_string(value).encode() == dumps(value)


# --- generated traffic ---------------------------------------------------------------------

TRACES = ["tr-a", "tr-b", "tr-\u00e9\u2028", "tr-c"]
TIMES = [
    "2026-01-01T00:00:00Z", "2026-01-01T00:00:00Z", "2026-01-01T00:00:01.5Z",
    "2026-01-01T01:00:00.123456789+02:00", "2026-01-01T00:00:01.000001Z",
    "2025-12-31T23:59:59-01:30", "2026-01-01T00:00:03Z", "2026-01-01T00:00:02Z",
]  # fmt: skip
ODD_TIMES = [
    "2026-01-01T00:00:00z", "2026-01-01 00:00:02Z", "2026-02-30T00:00:00Z",
    "1890-06-01T00:00:00Z", "2026-02-04T00:00:00Z",  # ahead of the clock beyond the tolerance
]  # fmt: skip
KEYS = {
    "trace.completed": ("agent_version", "scenario", "messages", "spans", "metadata",
                        "attachments"),
    "evaluation.finished": ("evaluation_id", "results", "report"),
}  # fmt: skip
_text = st.text(
    alphabet=st.sampled_from(["a", "Z", " ", "\u00e9", "\u2028", "\u2029", "\U0001f600", '"',
                              "\\", "\n", "\x00", "\x1f", "/", "\u4e2d"]),
    max_size=6,
)  # fmt: skip
_odd = st.one_of(
    st.none(), st.booleans(), _text, st.integers(-(2**63), 2**63 - 1),
    st.floats(allow_nan=False, allow_infinity=False), st.lists(st.integers(0, 3), max_size=2),
    st.dictionaries(_text, st.integers(-(2**63), 2**64 - 1), max_size=2),
)  # fmt: skip


def rarely(draw: Any) -> bool:
    """One time in eight: the hostile choices, each rare, so most events are ordinary (not 0:
    hypothesis draws its simplest value, 0, far more often than one time in eight)."""
    return draw(st.integers(0, 7)) == 7


@st.composite
def an_event(draw: Any) -> dict[str, Any]:
    kind = draw(st.sampled_from([
        "trace.completed", "trace.completed", "evaluation.finished", "label.submitted",
        "label.submitted", "label.skipped", "label.retracted", "trace.deleted",
    ]))  # fmt: skip
    fields: dict[str, Any] = {
        "trace_id": draw(st.sampled_from(TRACES)),
        "org": "globex" if rarely(draw) else "acme",
        "project": "other" if rarely(draw) else "bot",
    }
    event_id = draw(st.sampled_from(["e1", "e2", "e3", "e4", "e5", "e6", "\u00e9", "e\u2028"]))
    at = draw(st.sampled_from(ODD_TIMES if rarely(draw) else TIMES))
    if kind in KEYS:  # the fields of the type, with unknown ones nested at every level
        base = draw(traces() if kind == "trace.completed" else evaluations())
        fields |= {k: v for k, v in base.items() if k in KEYS[kind]}
        if kind == "trace.completed" and draw(st.booleans()):
            fields["metadata"] = draw(st.dictionaries(_text, _odd, max_size=3))
    elif kind.startswith("label."):
        fields["labeler"] = "" if rarely(draw) else draw(st.sampled_from(["ana", "bo", "\u00e9"]))
        if kind == "label.submitted":
            fields["rubric"] = {
                k: draw(st.integers(1, 5))
                for k in ("correctness", "helpfulness", "efficiency", "safety")
            }
            if rarely(draw):
                fields["rubric"]["safety"] = draw(st.sampled_from([0, 6, 3.0, True, None]))
            if draw(st.booleans()):
                fields["comment"] = draw(st.one_of(st.none(), _text))
    value = event(kind, event_id, at, **fields)
    if rarely(draw):  # a field of a later schema: the Python rules' to judge
        value[draw(st.sampled_from(["rubric_version", "kind", "zz"]))] = draw(_odd)
    return value


@st.composite
def hostile_bytes(draw: Any, value: dict[str, Any]) -> bytes:
    """An event's bytes, maybe written unusually or broken."""
    raw = orjson.dumps(value)
    how = draw(st.sampled_from(["plain"] * 12 + [
        "indent", "escaped", "slash", "surrogates", "lone", "duplicate", "nan", "huge",
        "truncated", "latin1", "float-int", "exp",
    ]))  # fmt: skip
    if how == "indent":
        return orjson.dumps(value, option=orjson.OPT_INDENT_2)
    if how == "escaped":  # every non-ASCII character as \\u escapes
        import json

        return json.dumps(value).encode()
    if how == "slash":
        return raw.replace(b"/", b"\\/")
    if how == "surrogates":
        return raw.replace("\U0001f600".encode(), b"\\ud83d\\ude00")
    if how == "lone":
        return raw.replace(b'"e', b'"\\ud83de', 1)
    if how == "duplicate":
        return raw[:-1] + b',"org":"acme"}'
    if how == "nan":
        return raw[:-1] + b',"x":NaN}'
    if how == "huge":
        return raw[:-1] + b',"x":12345678901234567890123}'
    if how == "truncated":
        return raw[: draw(st.integers(0, max(0, len(raw) - 1)))]
    if how == "latin1":
        return raw.replace("\u00e9".encode(), b"\xe9")
    if how == "float-int":
        return raw.replace(b'"score":1.0', b'"score":1').replace(b'"size":1', b'"size":1.0')
    if how == "exp":
        return raw.replace(b'"score":0.5', b'"score":5E-1').replace(b":1,", b":1e0,")
    return raw


@st.composite
def traffic(draw: Any) -> tuple[list[tuple[Any, dict[str, Any]]], list[int], list[float]]:
    events = draw(st.lists(an_event(), min_size=1, max_size=14))
    items: list[tuple[Any, dict[str, Any]]] = []
    for value in events:
        how: dict[str, Any] = {}
        if rarely(draw):
            where = draw(st.sampled_from(["topic", "key", "nokey", "partition"]))
            if where == "topic":
                how["topic"] = draw(st.sampled_from(["rl.traces", "rl.labels", "elsewhere"]))
            elif where == "key":
                how["key"] = b"tr-other"
            elif where == "nokey":
                how["key"] = None
            else:
                how["partition"] = draw(st.integers(-1, PARTITIONS - 1))
        how["raw"] = draw(hostile_bytes(value))
        items.append((value, how))
        if rarely(draw):  # a redelivery
            items.append(items[-1])
    batches = draw(st.lists(st.integers(1, 6), min_size=1, max_size=5))
    clock = NOW - 86_400 * 40 if rarely(draw) else draw(st.sampled_from([NOW, int(NOW)]))
    clocks = [clock + 20 * n + draw(st.sampled_from([0, 0.5, 7])) for n in range(len(batches))]
    return items, batches, clocks


@settings(
    max_examples=400, deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)  # fmt: skip
@given(traffic())
def test_generated_traffic_gives_the_same_bytes_natively_and_in_python(
    case: tuple[list[tuple[Any, dict[str, Any]]], list[int], list[float]],
) -> None:
    on, off = both_sides(*case)
    assert_same(on, off)
    assert off.count("native") == 0


def test_ordinary_traffic_is_the_cores_and_gives_the_same_bytes() -> None:
    """The bench's shapes and the special events, in batches, redeliveries included: the
    same bytes, nearly every event native (a test of the core, not of Python twice)."""
    small = generate(60, seed=6, shape=SHAPES["small"], duplicate_rate=0.05)
    values = (
        generate(60, seed=5, shape=SHAPES["standard"], duplicate_rate=0.05)
        + [v | {"trace_id": "small-" + v["trace_id"]} for v in small]  # other traces
        + special_events()
    )
    rng = random.Random(9)
    items = [(v, {}) for v in values]
    sizes = [rng.randint(1, 40) for _ in range(len(items))]
    clocks = [NOW + n for n in range(len(sizes))]
    on, off = both_sides(items, sizes, clocks)
    assert_same(on, off)
    assert on.count("native") >= 0.99 * len(items)
    assert any(s[0] == "snapshot" and s[5] for s in on.emitter.sent)  # record-at headers


def test_events_and_states_the_core_does_not_know_go_the_python_way() -> None:
    """A field of a later schema, at the top or in the rubric, is not the core's; neither is
    a state that keeps more than the core writes. Both give the Python rules' bytes."""
    labels = [
        event("trace.completed", "t"),
        event("label.submitted", "l1", labeler="ana") | {"rubric_version": 2},
        event("label.submitted", "l2", labeler="bo", rubric={
            "correctness": 4, "helpfulness": 3, "efficiency": 5, "safety": 4, "tone": 2}),
        event("label.submitted", "l3", labeler="cy"),
    ]  # fmt: skip
    on, off = both_sides([(v, {}) for v in labels], [3, 1], [NOW, NOW + 1])
    assert_same(on, off)
    # The trace and, in the next batch, the plain label: the state the Python rules wrote
    # after the two labels of a later schema is of the shape the core knows.
    assert on.count("native") == 2
    assert on.count("python") == 2

    core = rl_export_native.Core(1 << 20, 86_400.0, 0.7, 1)
    head, _ = off.table.data[b"tr-1"], None
    assert core.load(head) is not None
    length = int.from_bytes(head[1:5], "little")
    items = orjson.loads(head[5 : 5 + length])
    segments = head[5 + length :]
    for grown in ([*items, []], [*items[:7], [[*items[7][0], "x", 1]], *items[8:]]):
        data = orjson.dumps(grown)
        assert core.load(b"\x03" + len(data).to_bytes(4, "little") + data + segments) is None


def test_on_without_the_extension_refuses_to_start(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(native, "_extension", None)
    monkeypatch.setattr(native, "_MISSING", "No module named 'rl_export_native'")
    with pytest.raises(ConfigError, match="RL_EXPORT_JOIN_NATIVE: is on, but"):
        native.join_core(Settings(join_native="on"))
    assert native.join_core(Settings(join_native="auto")) is None
    assert "does not import" in native.describe(Settings(join_native="auto"))
    assert native.describe(Settings(join_native="off")).endswith("RL_EXPORT_JOIN_NATIVE=off)")


def test_the_worker_says_which_rules_run() -> None:
    assert native.describe(Settings(join_native="on")).startswith("join: native core")
    assert native.join_core(Settings(join_native="off")) is None


# --- the sink's reading of the record layout ------------------------------------------------


def _read(value: bytes, header: bytes, *, core: bool) -> Any:
    """What ``SnapshotLines.from_record`` makes of a value, with the core's reader or not."""
    kept = snapshots._read_record
    snapshots._read_record = rl_export_native.read_record if core else None
    try:
        lines = SnapshotLines.from_record(value, header)
    finally:
        snapshots._read_record = kept
    if lines is None:
        return None
    ready = [lines.line(s) for s in (None, "human", "evaluator") if lines.ready(s)]
    return (lines.trace_id, lines.org, lines.project, lines.revision, lines.deleted,
            lines.human, lines.evaluator, lines.updated_at, lines._parts, lines._record_at,
            ready, lines.fields())  # fmt: skip


@pytest.fixture(scope="module")
def join_values() -> list[tuple[bytes, bytes]]:
    """Snapshot values and record-at headers as the join writes them."""
    values = generate(40, seed=8, shape=SHAPES["standard"]) + special_events()
    on, _ = both_sides([(v, {}) for v in values], [25] * 20, [NOW + n for n in range(20)])
    return [(s[2], dict(s[5])[HEADER_RECORD_AT]) for s in on.emitter.sent
            if s[0] == "snapshot" and s[5]]  # fmt: skip


def test_the_sinks_native_reading_of_the_join_values_is_the_pythons(
    join_values: list[tuple[bytes, bytes]],
) -> None:
    assert len(join_values) > 20
    for value, header in join_values:
        assert rl_export_native.read_record(value, header) is not None  # the core's to read
        native = _read(value, header, core=True)
        assert native is not None
        assert native == _read(value, header, core=False)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_the_sinks_native_reading_of_odd_values_is_the_pythons(
    join_values: list[tuple[bytes, bytes]], data: Any
) -> None:
    value, header = data.draw(st.sampled_from(join_values))
    numbers = header.split(b",")
    how = data.draw(st.sampled_from(["header", "number", "value", "cut", "splice"]))
    if how == "header":
        header = data.draw(st.sampled_from([
            b",".join(numbers[:4]), b",".join(numbers[:5]), header + b",7", b"", b"x",
            header.replace(b",", b", "), b"1_0," + header, b"-" + header,
        ]))  # fmt: skip
    elif how == "number":
        n = data.draw(st.integers(0, len(numbers) - 1))
        numbers[n] = str(int(numbers[n]) + data.draw(st.integers(-20, 20))).encode()
        header = b",".join(numbers)
    elif how == "value":
        old = data.draw(
            st.sampled_from(
                [
                    b'"deleted":false',
                    b'"human":',
                    b'"passed":',
                    b"null",
                    b'"updated_at":"',
                    b'"revision":',
                    b'"org":',
                ]
            )
        )
        new = data.draw(st.sampled_from([b"", b" ", b'"x":1,', b"1", b'"\\u00e9"', b"[]"]))
        value = value.replace(old, old + new, 1)
    elif how == "cut":
        value = value[: data.draw(st.integers(0, len(value)))]
    else:
        at = data.draw(st.integers(0, len(value)))
        value = value[:at] + data.draw(st.sampled_from([b",", b"}", b'"', b"\xff"])) + value[at:]
    assert _read(value, header, core=True) == _read(value, header, core=False)
