"""``make profile``: the join and the sink in process, without Kafka: CPU time per event.

The bench (:mod:`tests.perf.bench`) measures whole workers against a real broker, on a
machine they share with it; its numbers move by 20 % between runs. This measures the two
stages' own Python in one process, on the same synthetic backlog (``--shape``), with CPU
time (``time.process_time``), so that one change to the hot path can be judged alone:

1. Generate the backlog and route it as Kafka would (topic by event type, partition by the
   configured partitioner); offsets per partition.
2. The join: :class:`~rl_export.stream.processor.JoinProcessor` over batches of
   ``join_batch_size`` events with the real table (RocksDB, in a temporary folder, or
   ``--state memory``) and an emitter that builds the real aiokafka record batches (the
   producer's own code, without a network).
3. The sink: every snapshot through :class:`~rl_export.corpora.partition.PartitionSink` into
   an in-memory store, with the default corpora.

It prints CPU µs per input event for each stage (best of ``--repeat`` passes), and with
``--cprofile N`` the N functions with the most own time. On a machine whose CPU time is
shared too (a VM, other jobs), count instructions instead: ``--stages none|join|all`` under
``valgrind --tool=callgrind`` gives each stage's count as the difference of two runs.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import pstats
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import orjson
from aiokafka.record.default_records import DefaultRecordBatchBuilder
from prometheus_client import CollectorRegistry

from rl_export.common.events import FAMILY_OF_TYPE, EventFamily, EventRejection
from rl_export.common.gctune import tune_gc
from rl_export.common.metrics import Metrics, SinkMetrics
from rl_export.common.partitioning import partition_for
from rl_export.common.records import HEADER_EVENT_MS, HEADER_RECORD_AT, Headers
from rl_export.common.settings import Settings
from rl_export.corpora.chain import SinkConfig
from rl_export.corpora.partition import PartitionSink
from rl_export.corpora.store import MemoryStore
from rl_export.local.synthetic import SHAPES, generate
from rl_export.stream.processor import InMessage, JoinProcessor
from rl_export.stream.produce import topic_for
from rl_export.stream.statestore import ChangelogTable


class BatchingEmitter:
    """Builds the record batches a producer would send; sends nothing.

    The snapshots are kept for the sink stage, with their headers' values.
    """

    def __init__(self, table: ChangelogTable, settings: Settings) -> None:
        self.table = table
        self.settings = settings
        self.snapshots: list[tuple[int, bytes, int | None, bytes | None]] = []
        self._out: dict[tuple[str, int], list[tuple[bytes | None, bytes | None, Any]]] = {}
        self.records = 0

    async def snapshot(
        self, key: bytes, value: bytes, event_ms: int | None, partition: int,
        headers: Headers,
    ) -> None:  # fmt: skip
        if event_ms:
            headers = [(HEADER_EVENT_MS, str(event_ms).encode()), *headers]
        self._out.setdefault(("trajectories", partition), []).append((key, value, headers))
        self.snapshots.append((partition, value, event_ms, dict(headers).get(HEADER_RECORD_AT)))

    async def forward(self, message: InMessage, key: bytes, partition: int) -> None:
        self._out.setdefault((message.topic, partition), []).append(
            (key, message.value, list(message.headers))
        )

    async def dead_letter(self, message: InMessage, rejection: EventRejection) -> None:
        self._out.setdefault(("dead", 0), []).append((message.key, message.value, []))

    async def flush(self, consumed: Mapping[tuple[str, int], int]) -> None:
        for partition, changes in self.table.take_changes().items():
            for key, state in changes.items():
                self._out.setdefault(("changelog", partition), []).append((key, state, []))
        out, self._out = self._out, {}
        for queued in out.values():
            builder = _builder()
            for k, v, h in queued:
                if builder.append(0, timestamp=None, key=k, value=v, headers=h) is None:
                    builder.build()
                    builder = _builder()
                self.records += 1
            builder.build()


def _builder() -> Any:
    """A record batch builder as the producer makes one (magic 2, no compression)."""
    return DefaultRecordBatchBuilder(
        magic=2, compression_type=0, is_transactional=0, producer_id=-1, producer_epoch=-1,
        base_sequence=-1, batch_size=1024 * 1024,
    )  # fmt: skip


def routed(settings: Settings, events: list[dict[str, Any]]) -> list[InMessage]:
    """The events as the join's consumer would hand them over (by partition, in order)."""
    offsets: dict[tuple[str, int], int] = defaultdict(int)
    out = []
    now_ms = int(time.time() * 1000)
    for event in events:
        topic = topic_for(settings, FAMILY_OF_TYPE[event["event_type"]])
        key = event["trace_id"].encode()
        partition = partition_for(key, settings.partitions, settings.partitioner)
        offset = offsets[(topic, partition)]
        offsets[(topic, partition)] += 1
        out.append(InMessage(topic, partition, offset, key, orjson.dumps(event), now_ms))
    return out


def batches(messages: list[InMessage], size: int) -> list[list[InMessage]]:
    return [messages[i : i + size] for i in range(0, len(messages), size)]


async def join_pass(
    settings: Settings, messages: list[InMessage], folder: Path
) -> tuple[float, BatchingEmitter]:
    table = ChangelogTable(
        settings.state_store, folder, cache_bytes=settings.state_cache_mib * 1024 * 1024
    )
    for partition in range(settings.partitions):
        table.open(partition)
    emitter = BatchingEmitter(table, settings)
    families = {topic_for(settings, f): f for f in EventFamily}
    processor = JoinProcessor(settings, table, emitter, Metrics(CollectorRegistry()), families)
    started = time.process_time()
    for batch in batches(messages, settings.join_batch_size):
        await processor.process(batch)
    elapsed = time.process_time() - started
    table.close_all()
    return elapsed, emitter


async def sink_pass(settings: Settings, emitter: BatchingEmitter) -> float:
    store = MemoryStore()
    config = SinkConfig(max_records=10**9, max_bytes=2**40, max_age_s=1e9)
    metrics = SinkMetrics(CollectorRegistry())
    parts = {
        p: PartitionSink(store, "trajectories", p, settings.corpora, config, metrics, "profile")
        for p in range(settings.partitions)
    }
    offsets: dict[int, int] = defaultdict(int)
    started = time.process_time()
    for partition, value, event_ms, record_at in emitter.snapshots:
        await parts[partition].handle(offsets[partition], value, event_ms, record_at)
        offsets[partition] += 1
    return time.process_time() - started


async def profile(args: argparse.Namespace) -> None:
    shape = SHAPES[args.shape]
    settings = Settings(partitions=8, state_store=f"{args.state}://")
    events = generate(args.traces, seed=args.seed, duplicate_rate=0.02, shape=shape)
    messages = routed(settings, events)
    tune_gc()  # as the worker and its join processes do
    size = sum(len(m.value) for m in messages)
    print(f"{args.shape}: {len(messages):,} events, {size / len(messages) / 1024:.2f} KiB avg, "
          f"state {args.state}, batches of {settings.join_batch_size}")  # fmt: skip
    joins, sinks = [], []
    profiler = cProfile.Profile() if args.cprofile else None
    if args.stages == "none":
        return
    for n in range(args.repeat):
        with tempfile.TemporaryDirectory(prefix="rl-export-profile-") as folder:
            if profiler is not None and n == args.repeat - 1:
                profiler.enable()
            join_s, emitter = await join_pass(settings, messages, Path(folder))
            sink_s = await sink_pass(settings, emitter) if args.stages == "all" else 0.0
            if profiler is not None and n == args.repeat - 1:
                profiler.disable()
        joins.append(join_s / len(messages) * 1e6)
        sinks.append(sink_s / len(messages) * 1e6)
    print(f"  join  {min(joins):6.1f} µs CPU per event (best of {args.repeat}; median "
          f"{statistics.median(joins):.1f}), {len(emitter.snapshots):,} snapshots, "
          f"{emitter.records:,} records produced")  # fmt: skip
    print(f"  sink  {min(sinks):6.1f} µs CPU per event (best of {args.repeat}; median "
          f"{statistics.median(sinks):.1f})")  # fmt: skip
    if profiler is not None:
        stats = pstats.Stats(profiler, stream=sys.stdout)
        stats.sort_stats("tottime").print_stats(args.cprofile)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="rl-export-profile", description=__doc__.split("\n")[0])
    parser.add_argument("--shape", default="standard", choices=sorted(SHAPES))
    parser.add_argument("--traces", type=int, default=6000)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--state", default="rocksdb", choices=["rocksdb", "memory"])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument(
        "--stages", default="all", choices=["none", "join", "all"],
        help="run nothing but the set-up, the join only, or the join and the sink",
    )  # fmt: skip
    parser.add_argument(
        "--cprofile", type=int, default=0, metavar="N",
        help="print the N functions with the most own time (last pass)",
    )  # fmt: skip
    asyncio.run(profile(parser.parse_args(argv)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
