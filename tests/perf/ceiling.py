"""``make bench-ceiling``: how fast one worker could be if the join's own work cost nothing.

The bench (:mod:`tests.perf.bench`) says how fast a worker is. This says how much of
that any speed-up of the join's rules could change (a native core, say), by running
:mod:`tests.perf.bench_ab` with two variants on one backlog:

1. the defaults;
2. the join *replayed*. Before the rounds, the real :class:`JoinProcessor` runs over the
   backlog in this process, one event at a time in the order it was produced, and keeps
   what each event left behind (:class:`Output`: the state's head as written, the
   conversation when it changed, the snapshot when one was due, whether it waited for its
   trace). In the worker's join processes, :meth:`Replay.process` then stands in for
   :meth:`JoinProcessor.process`. Per batch it looks each event's output up by the event's
   bytes (and how often they came: a repeat has the same bytes), asks the table for the
   batch's keys (the same multi-get), reads each touched trace's state and conversation,
   writes them back, sends a snapshot where the join would in the order it read the events
   (:class:`Replay`), and flushes (the changelog, the transaction, the offsets).

So the table (states, conversations, the expiry index), the changelog, the producer, the
transactions, the consumer, the sink, the store and the broker are the real ones. What
costs nothing is decoding and checking the events, merging them, loading and dumping states
and encoding snapshots, and with them the expiry heap and the per-outcome counters. Left
out, as they do not happen on the bench's traffic: dead letters and forwarding (the bench's
producer routes every event to its trace's partition). What is written is what the join
wrote in the order produced: for events read before their trace, the join's state also
holds their bytes, and the replay's heads are about a tenth smaller then. The outputs are
recorded again when the code that makes them changes (:func:`recording_digest`).

The hook reaches the join processes through ``sitecustomize`` (``ceiling_site/``, put first
on the worker's ``PYTHONPATH`` by the second variant, which inherits it to its join
processes), with the outputs' file in ``CEILING_REPLAY_OUTPUTS``. The outputs are pickled
(this tool writes and reads them, under ``var/bench/``) and each join process holds all of
them: its peak RSS is not the real one's, nor is the worker's (its process imports the
benches too). The events/s and CPU per event are the numbers.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import os
import pickle
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

from prometheus_client import CollectorRegistry

from rl_export.local.synthetic import SHAPES, generate
from rl_export.model.events import EventFamily, EventRejection
from rl_export.model.snapshots import Headers
from rl_export.runtime.metrics import Metrics
from rl_export.runtime.settings import Settings
from rl_export.stream.processor import (
    CONVERSATION,
    BatchResult,
    InMessage,
    JoinProcessor,
    MemoryTable,
    consumed_offsets,
)
from rl_export.stream.produce import topic_for
from rl_export.stream.state import load_state
from tests.perf.bench import log
from tests.perf.bench_ab import Variant, add_round_arguments, run_and_print, traces_asked
from tests.perf.profile import routed

OUTPUTS_ENV = "CEILING_REPLAY_OUTPUTS"
SITE = Path(__file__).with_name("ceiling_site")
ROOT = Path(__file__).resolve().parents[2]
"""The checkout: the hook imports :mod:`tests.perf.ceiling` from it, whatever the worker's
working directory."""


class Snapshot(NamedTuple):
    value: bytes
    headers: Headers
    revision: int


class Output(NamedTuple):
    """What one event left behind in the real join (run one event at a time)."""

    head: bytes | None  # the state as the table holds it, None if the event left none
    conversation_changed: bool
    conversation: bytes | None  # the conversation after the event (None: none)
    snapshot: Snapshot | None  # None: the event made no snapshot due
    waited: bool  # it came before its trace and waited for it (no snapshot then)
    mark: bytes | None  # the trace's entry in the table's expiry index after it (None: none)


Outputs = dict[bytes, tuple[Output, ...]]
"""An event's bytes -> what it left behind, each time it came (a repeat has the same bytes)."""


class _Capture:
    """An emitter that keeps the last snapshot and sends nothing."""

    def __init__(self) -> None:
        self.last: tuple[bytes, Headers] | None = None

    async def snapshot(
        self, key: bytes, value: bytes, event_ms: int | None, partition: int,
        headers: Headers, *, task: int | None = None,
    ) -> None:  # fmt: skip
        self.last = (value, list(headers))

    def take(self) -> tuple[bytes, Headers] | None:
        """The snapshot sent since the last call, if one was."""
        last, self.last = self.last, None
        return last

    async def forward(self, message: InMessage, key: bytes, partition: int) -> None:
        raise AssertionError("the outputs are recorded with every event on its home partition")

    async def dead_letter(self, message: InMessage, rejection: EventRejection) -> None:
        return None

    async def flush(self, consumed: Mapping[tuple[str, int], int]) -> None:
        return None


def _arrived(head: bytes | None) -> bool:
    """Whether a stored state's trace has come (or it was deleted): events no longer wait."""
    if head is None:
        return False
    state = load_state(head)
    return state.trace is not None or state.deleted


def _revision(head: bytes) -> int:
    state = load_state(head)
    return state.deleted_revision if state.deleted else state.revision


async def record_outputs(
    settings: Settings, messages: list[InMessage], now: float | None = None
) -> Outputs:
    """Run the real join over ``messages`` one at a time; what each left behind.

    ``now`` is the join's clock for all of them (default: the time of the call).
    """
    clock = time.time() if now is None else now
    table = MemoryTable()
    emitter = _Capture()
    families = {topic_for(settings, f): f for f in EventFamily}
    processor = JoinProcessor(settings, table, emitter, Metrics(CollectorRegistry()), families)
    outputs: Outputs = {}
    for message in messages:
        assert message.key is not None
        before = table.data.get(CONVERSATION + message.key)
        waited = message.topic != settings.topic_traces and not _arrived(
            table.data.get(message.key)
        )
        await processor.process([message], now=clock)
        head = table.data.get(message.key)
        after = table.data.get(CONVERSATION + message.key)
        sent, snapshot = emitter.take(), None
        if sent is not None and head is not None:
            snapshot = Snapshot(*sent, _revision(head))
        made = Output(head, after != before, after, snapshot, waited, table.marks.get(message.key))
        outputs[message.value] = (*outputs.get(message.value, ()), made)
    return outputs


@dataclass(slots=True)
class _Touched:
    """A trace a batch touches: its last event and output, and what any of its events did."""

    last: InMessage
    out: Output
    conversation_changed: bool = False
    repeated: bool = False
    may_emit: bool = False


class Replay:
    """The replayed join's memory: the outputs, how often each event came, the traces that
    have come, and each trace's newest snapshot.

    The join reads its three topics at their own paces, so it reads many events in another
    order than they were recorded in (produced). Whether a snapshot is due follows the order
    read, as in the join: none for a trace before its ``trace.completed`` was read (its
    events wait), one for every batch that touches it after, except for an event that made
    none when recorded for another reason than waiting (rejected, or after a deletion). The
    snapshot sent is the newest recorded so far, so the sink gets as many records as the
    real join would send it, not always the same ones.
    """

    def __init__(self, outputs: Outputs) -> None:
        self.outputs = outputs
        self.times: dict[bytes, int] = {}
        self.arrived: set[bytes] = set()
        self.marks: dict[bytes, bytes | None] = {}
        self.newest: dict[bytes, Snapshot] = {}

    async def process(
        self, processor: JoinProcessor, messages: list[InMessage], now: float | None = None
    ) -> BatchResult:
        """One batch, as :meth:`JoinProcessor.process` does it but for the join's own work."""
        table, emitter, metrics = processor.table, processor.emitter, processor.metrics
        metrics.batch_size.observe(len(messages))
        traces = processor.settings.topic_traces
        touched: dict[bytes, _Touched] = {}
        wanted: dict[int, list[bytes]] = {}
        for message in messages:
            key = message.key
            assert key is not None
            times = self.times.get(message.value, 0)
            self.times[message.value] = times + 1
            made = self.outputs[message.value]
            out = made[min(times, len(made) - 1)]  # read again after a rebalance: the last
            if message.topic == traces:
                self.arrived.add(key)
            entry = touched.get(key)
            if entry is None:
                wanted.setdefault(message.partition, []).extend((key, CONVERSATION + key))
                entry = touched[key] = _Touched(message, out)
            entry.last, entry.out = message, out
            entry.conversation_changed |= out.conversation_changed
            entry.repeated |= times > 0  # the join rewrites the conversation after a repeat
            entry.may_emit |= out.snapshot is not None or out.waited
            if out.snapshot is not None:
                newest = self.newest.get(key)
                if newest is None or out.snapshot.revision > newest.revision:
                    self.newest[key] = out.snapshot
        table.prefetch(wanted)
        result = BatchResult()
        for key, entry in touched.items():
            last, out = entry.last, entry.out
            table.get(key, last)
            table.get(CONVERSATION + key, last)
            if out.head is not None:
                table.put(key, out.head, last)
            if entry.conversation_changed or entry.repeated:
                if out.conversation is None:
                    table.delete(CONVERSATION + key, last)
                else:
                    table.put(CONVERSATION + key, out.conversation, last)
            if out.mark != self.marks.get(key):  # as the join: what the index holds, or not
                table.mark(key, out.mark, last)
                self.marks[key] = out.mark
            snapshot = self.newest.get(key)
            if entry.may_emit and key in self.arrived and snapshot is not None:
                result.snapshots[key] = snapshot.value
                await emitter.snapshot(
                    key, snapshot.value, last.timestamp_ms, last.partition, snapshot.headers
                )
        metrics.snapshots.inc(len(result.snapshots))
        await emitter.flush(consumed_offsets(messages))
        metrics.table_keys.set(len(table))
        return result


def install(path: Path) -> None:
    """Make every :class:`JoinProcessor` of this process replay ``path``'s outputs.

    The outputs are loaded when the first processor is made (before its worker is ready),
    not at the first batch, so loading them is not timed.
    """
    replays: list[Replay] = []
    make = JoinProcessor.__init__

    def init(self: JoinProcessor, *args: Any, **kwargs: Any) -> None:
        make(self, *args, **kwargs)
        if not replays:
            with path.open("rb") as f:
                replays.append(Replay(pickle.load(f)))  # this tool's own file

    async def process(
        self: JoinProcessor, messages: list[InMessage], now: float | None = None
    ) -> BatchResult:
        return await replays[0].process(self, messages, now)

    setattr(JoinProcessor, "__init__", init)  # noqa: B010 - a method replaced on purpose
    setattr(JoinProcessor, "process", process)  # noqa: B010


RECORDED_BY = (
    *(f"services/rl_export/{name}" for name in (
        "stream/join.py", "stream/state.py", "stream/processor.py", "model/records.py",
        "model/eventview.py", "model/events.py", "model/codec.py", "local/synthetic.py",
    )),
    "tests/perf/ceiling.py",
)  # fmt: skip
"""The files whose code decides the outputs (relative to the checkout): a change to any of
them records the outputs again."""


def recording_digest() -> str:
    """A digest of :data:`RECORDED_BY`'s sources, for the outputs' file name."""
    digest = hashlib.sha256()
    for name in RECORDED_BY:
        digest.update((ROOT / name).read_bytes())
    return digest.hexdigest()[:12]


async def outputs_file(shape: str, traces: int, seed: int, folder: Path) -> Path:
    """The outputs of the bench's backlog for these arguments and this code, recorded once
    and kept."""
    path = folder / f"ceiling-{shape}-{traces}-{seed}-{recording_digest()}.pickle"
    if path.exists():
        log(f"replay: the join's outputs from {path}")
        return path
    settings = Settings(partitions=8, state_store="memory://")
    events = generate(traces, seed=seed, duplicate_rate=0.02, shape=SHAPES[shape])
    log(f"replay: recording the join's outputs for {len(events):,} events, one at a time")
    outputs = await record_outputs(settings, routed(settings, events))
    _write(outputs, path)
    return path


def _write(outputs: Outputs, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_suffix(".partial")
    with partial.open("wb") as f:
        pickle.dump(outputs, f, protocol=pickle.HIGHEST_PROTOCOL)
    partial.replace(path)


def replay_variant(path: Path) -> Variant:
    """The second variant: the hook first on the worker's path, the outputs named."""
    search = [str(SITE), str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])]
    return Variant(
        "the join replayed: its own work costs nothing",
        env={"PYTHONPATH": os.pathsep.join(search), OUTPUTS_ENV: str(path.resolve())},
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="rl-export-bench-ceiling", description=__doc__.split("\n")[0]
    )
    add_round_arguments(parser)
    parser.add_argument(
        "--record-only", action="store_true",
        help="record the join's outputs (kept in --out for later runs) and stop",
    )  # fmt: skip
    args = parser.parse_args(argv)
    traces = traces_asked(parser, args)
    path = asyncio.run(outputs_file(args.shape, traces, args.seed, args.out))
    if args.record_only:
        print(f"the join's outputs: {path}")
        return 0
    run_and_print([Variant(""), replay_variant(path)], args, traces, "ceiling")
    return 0


if __name__ == "__main__":
    # The outputs must be pickled as this module's classes, not as __main__'s, which the
    # join processes that load them are not.
    from tests.perf.ceiling import main as ceiling_main

    sys.exit(ceiling_main())
