"""The ceiling bench's replayed join does the real join's table and emitter work, no more."""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Mapping
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from rl_export.local.synthetic import SHAPES, generate
from rl_export.model.events import EventFamily, EventRejection
from rl_export.model.snapshots import Headers
from rl_export.runtime.metrics import Metrics
from rl_export.runtime.settings import Settings
from rl_export.stream.processor import CONVERSATION, InMessage, JoinProcessor, MemoryTable
from rl_export.stream.produce import topic_for
from tests.perf.ceiling import (
    OUTPUTS_ENV,
    SITE,
    Output,
    Outputs,
    Replay,
    record_outputs,
    replay_variant,
)
from tests.perf.profile import batches, routed


class Sent:
    """An emitter that keeps what it was given, batch by batch."""

    def __init__(self) -> None:
        self.batches: list[list[tuple[bytes, bytes, int | None, int, Headers]]] = [[]]

    async def snapshot(
        self, key: bytes, value: bytes, event_ms: int | None, partition: int,
        headers: Headers, *, task: int | None = None,
    ) -> None:  # fmt: skip
        self.batches[-1].append((key, value, event_ms, partition, list(headers)))

    async def forward(self, message: InMessage, key: bytes, partition: int) -> None:
        raise AssertionError("nothing is forwarded here")

    async def dead_letter(self, message: InMessage, rejection: EventRejection) -> None:
        return None

    async def flush(self, consumed: Mapping[tuple[str, int], int]) -> None:
        self.batches.append([])


class CountingTable(MemoryTable):
    """A table that counts its writes by kind: state, conversation, expiry index."""

    def __init__(self) -> None:
        super().__init__()
        self.writes: Counter[str] = Counter()

    @staticmethod
    def kind(key: bytes) -> str:
        return "conversation" if key.startswith(CONVERSATION) else "state"

    def put(self, key: bytes, value: bytes, at: InMessage) -> None:
        self.writes["put " + self.kind(key)] += 1
        super().put(key, value, at)

    def delete(self, key: bytes, at: InMessage) -> None:
        self.writes["delete " + self.kind(key)] += 1
        super().delete(key, at)

    def mark(self, key: bytes, value: bytes | None, at: InMessage) -> None:
        self.writes["mark"] += 1
        super().mark(key, value, at)


def processor(settings: Settings) -> tuple[JoinProcessor, CountingTable, Sent]:
    table, sent = CountingTable(), Sent()
    families = {topic_for(settings, f): f for f in EventFamily}
    made = JoinProcessor(settings, table, sent, Metrics(CollectorRegistry()), families)
    return made, table, sent


@pytest.mark.parametrize("shape", sorted(SHAPES))
async def test_the_replayed_join_writes_and_sends_what_the_real_one_does(shape: str) -> None:
    settings = Settings(partitions=4, state_store="memory://")
    events = generate(40, seed=3, duplicate_rate=0.1, shape=SHAPES[shape])
    events.append({**events[0], "event_type": "trace.deleted", "event_id": "deleted-0"})
    for key in ("agent_version", "scenario", "messages"):
        events[-1].pop(key, None)
    messages = routed(settings, events)
    now = time.time()
    outputs = await record_outputs(settings, messages, now)

    real, real_table, real_sent = processor(settings)
    replayed, replayed_table, replayed_sent = processor(settings)
    replay = Replay(outputs)
    for batch in batches(messages, 7):
        await real.process(batch, now=now)
        await replay.process(replayed, batch, now=now)

    assert replayed_sent.batches == real_sent.batches
    assert sum(len(b) for b in real_sent.batches) > 20
    assert replayed_table.data == real_table.data
    assert replayed_table.marks == real_table.marks
    assert replayed_table.writes == real_table.writes
    assert {"put conversation", "delete conversation", "mark"} <= set(real_table.writes)


async def test_a_trace_whose_events_in_a_batch_made_no_snapshot_sends_none() -> None:
    settings = Settings(partitions=4, state_store="memory://")
    message = routed(settings, generate(1, seed=1, shape=SHAPES["small"]))[0]
    replayed, _, sent = processor(settings)
    outputs: Outputs = {message.value: (Output(b"head", False, None, None, False, None),)}
    result = await Replay(outputs).process(replayed, [message])
    assert result.snapshots == {}
    assert sent.batches == [[], []]


def hooked(tmp_path: Path, env: dict[str, str]) -> str:
    """The module of ``JoinProcessor.process`` in a new Python with ``env`` added."""
    code = "import rl_export.stream.processor as p; print(p.JoinProcessor.process.__module__)"
    done = subprocess.run(
        [sys.executable, "-c", code], env={**os.environ, **env}, capture_output=True,
        text=True, check=True, cwd=tmp_path,
    )  # fmt: skip
    return done.stdout.strip()


def test_the_hook_replaces_the_join_only_where_the_variant_puts_it(tmp_path: Path) -> None:
    outputs = tmp_path / "outputs.pickle"
    outputs.write_bytes(pickle.dumps({}))
    variant = replay_variant(outputs)
    assert variant.env["PYTHONPATH"].split(os.pathsep)[0] == str(SITE)
    assert variant.env[OUTPUTS_ENV] == str(outputs.resolve())

    assert hooked(tmp_path, variant.env) == "tests.perf.ceiling"
    assert hooked(tmp_path, {"PYTHONPATH": str(SITE)}) == "rl_export.stream.processor"
    assert hooked(tmp_path, {}) == "rl_export.stream.processor"


async def recorded(traces: int, seed: int) -> tuple[Settings, list[InMessage], Outputs]:
    settings = Settings(partitions=4, state_store="memory://")
    messages = routed(settings, generate(traces, seed=seed, shape=SHAPES["small"]))
    return settings, messages, await record_outputs(settings, messages)


async def sent_one_by_one(
    settings: Settings, outputs: Outputs, *messages: InMessage
) -> list[list[bytes]]:
    """What the replay sends for ``messages``, each a batch of its own, in this order."""
    replayed, _, sent = processor(settings)
    replay = Replay(outputs)
    for message in messages:
        await replay.process(replayed, [message])
    return [[s[1] for s in batch] for batch in sent.batches[:-1]]


async def test_events_read_before_their_trace_send_nothing_until_it_comes() -> None:
    """The join reads its topics at their own paces: an event recorded after its trace may
    be read before it, and then waits; the trace's batch sends the newest snapshot."""
    settings, messages, outputs = await recorded(20, 2)
    pairs = [
        (trace, later)
        for i, trace in enumerate(messages)
        if trace.topic == settings.topic_traces
        for later in messages[i + 1 :]
        if later.key == trace.key and outputs[later.value][0].snapshot is not None
    ]
    trace, later = pairs[0]
    newest = outputs[later.value][0].snapshot
    assert newest is not None

    assert await sent_one_by_one(settings, outputs, later, trace) == [[], [newest.value]]


async def test_an_event_that_waited_when_recorded_sends_when_read_after_its_trace() -> None:
    settings, messages, outputs = await recorded(20, 2)
    waited = next(m for m in messages if outputs[m.value][0].waited)
    trace = next(m for m in messages if m.key == waited.key and m.topic == settings.topic_traces)
    snapshot = outputs[trace.value][0].snapshot
    assert snapshot is not None

    sent = await sent_one_by_one(settings, outputs, trace, waited)
    assert sent == [[snapshot.value], [snapshot.value]]


def test_the_outputs_recorded_from_the_command_load_in_another_process(tmp_path: Path) -> None:
    """Recorded by ``python -m``, they must not be pickled as ``__main__``'s classes."""
    subprocess.run(
        [sys.executable, "-m", "tests.perf.ceiling", "--shape", "small", "--traces", "3",
         "--record-only", "--out", str(tmp_path)],
        check=True, capture_output=True,
    )  # fmt: skip
    [path] = tmp_path.glob("ceiling-small-3-7-*.pickle")
    with path.open("rb") as f:
        outputs = pickle.load(f)
    assert outputs
    assert all(isinstance(made, Output) for each in outputs.values() for made in each)
