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
   an in-memory store, with the default corpora, in polls of ``--poll`` snapshots; after each
   poll the partitions due by the default bounds (records, bytes, the buffer shared by all
   the partitions: :func:`~rl_export.corpora.sink.flushed_early`; not the age, which CPU
   time does not see) commit their shards, index sidecars and manifest entries, as the
   worker's sink does. The split (``sink``) and the commits (``commit``) are timed apart.

It prints CPU µs per input event for each stage (best of ``--repeat`` passes), and with
``--cprofile N`` the N functions with the most own time. With ``--baseline CHECKOUT`` it
runs another checkout's code the same way in a child process (its ``services`` first on
``PYTHONPATH``), the two interleaved, pass by pass, and prints each stage beside it. On a
machine whose CPU time is shared too (a VM, other jobs), count instructions instead:
``--stages none|join|all`` under ``valgrind --tool=callgrind`` gives each stage's count as
the difference of two runs.
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

from rl_export.model.events import FAMILY_OF_TYPE, EventFamily, EventRejection
from rl_export.model.partitioning import partition_for
from rl_export.model.snapshots import HEADER_EVENT_MS, HEADER_RECORD_AT, Headers
from rl_export.runtime.gctune import tune_gc
from rl_export.runtime.metrics import Metrics, SinkMetrics
from rl_export.runtime.settings import Settings

try:
    from rl_export.corpora.chain import SinkConfig
    from rl_export.corpora.partition import PartitionSink
except ImportError:  # a baseline checkout from before the sink's split (c3f8bca)
    from rl_export.corpora.sink import PartitionSink, SinkConfig  # type: ignore[attr-defined]
from rl_export.corpora.sink import flushed_early
from rl_export.corpora.store import MemoryStore
from rl_export.local.synthetic import SHAPES, generate
from rl_export.stream.processor import InMessage, JoinProcessor
from rl_export.stream.produce import topic_for
from rl_export.stream.statestore import ChangelogTable

ROOT = Path(__file__).resolve().parents[2]  # this checkout


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
        headers: Headers, *, task: int | None = None,
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


async def sink_pass(
    settings: Settings, emitter: BatchingEmitter, poll: int
) -> tuple[float, float, int]:
    """The sink over the join's snapshots: CPU seconds splitting them into the corpora's
    pending lines, CPU seconds committing them (shards, index sidecars, manifest entries),
    and the objects written."""
    store = MemoryStore()
    config = SinkConfig(
        max_records=settings.shard_max_records, max_bytes=settings.shard_max_bytes,
        max_age_s=1e9, buffer_bytes=settings.sink_buffer_mib * 1024 * 1024,
    )  # fmt: skip
    metrics = SinkMetrics(CollectorRegistry())
    parts = {
        p: PartitionSink(store, "trajectories", p, settings.corpora, config, metrics, "profile")
        for p in range(settings.partitions)
    }
    offsets: dict[int, int] = defaultdict(int)
    split = commit = 0.0
    snapshots = emitter.snapshots
    for start in range(0, len(snapshots), poll):
        started = time.process_time()
        for partition, value, event_ms, record_at in snapshots[start : start + poll]:
            await parts[partition].handle(offsets[partition], value, event_ms, record_at)
            offsets[partition] += 1
        flushing = time.process_time()
        split += flushing - started
        due = [p for p in parts.values() if p.due(0.0)]
        waiting = [p for p in parts.values() if p.pending_records and p not in due]
        due += flushed_early(waiting, config.buffer_bytes, 0.0)
        await asyncio.gather(*(p.flush() for p in due))
        commit += time.process_time() - flushing
    flushing = time.process_time()
    await asyncio.gather(*(p.flush() for p in parts.values() if p.pending_records))
    commit += time.process_time() - flushing
    return split, commit, len(store.objects)


# The stages timed apart with ``--detail``: (label, module, attribute), each wrapped in a
# per-thread CPU timer (a sidecar is built in a worker thread). What a checkout lacks (the
# sidecars before 35cf61a) is left out; the sink's modules as they were before c3f8bca too.
DETAIL: list[tuple[str, str, str]] = [
    ("join: decode and check", "rl_export.stream.processor", "read_event"),
    ("join: decode and check", "rl_export.stream.processor", "JoinProcessor._decode"),
    ("join: merge", "rl_export.stream.processor", "merge"),
    ("join: native read and merge", "rl_export.stream.processor", "JoinProcessor._merge_native"),
    ("join: prefetch (multi-get)", "rl_export.stream.processor", "JoinProcessor._prefetch"),
    ("join: state read", "rl_export.stream.processor", "JoinProcessor._read"),
    ("join: state write", "rl_export.stream.processor", "JoinProcessor._write"),
    ("join: snapshot encode", "rl_export.stream.processor", "encode_current"),
    ("join: snapshot encode", "rl_export.stream.processor", "JoinProcessor._encode"),
    ("join: produce (record batches)", __name__, "BatchingEmitter.flush"),
    ("sink split: sidecar rows", "rl_export.corpora.chain", "ChainWriter._index_row"),
    ("sink commit: shard encode", "rl_export.corpora.chain", "encode_lines"),
    ("sink commit: shard encode", "rl_export.corpora.sink", "encode_lines"),
    ("sink commit: sidecar build", "rl_export.corpora.sidecar", "build_sidecar"),
]


def instrument() -> dict[str, float]:
    """Wrap the :data:`DETAIL` functions in CPU timers; the seconds they add up to, by label."""
    import importlib
    import inspect

    spent: dict[str, float] = {}
    inside: set[str] = set()  # the labels being timed now (synchronous steps)
    for label, module_name, attribute in DETAIL:
        try:
            owner: Any = importlib.import_module(module_name)
        except ImportError:
            continue
        *path, name = attribute.split(".")
        for part in path:
            owner = getattr(owner, part, None)
        function = getattr(owner, name, None) if owner is not None else None
        if function is None:
            continue
        spent.setdefault(label, 0.0)

        def timed(*args: Any, _f: Any = function, _label: str = label, **kwargs: Any) -> Any:
            if _label in inside:  # a step of the same label within: timed once, outside
                return _f(*args, **kwargs)
            inside.add(_label)
            started = time.thread_time()
            try:
                return _f(*args, **kwargs)
            finally:
                spent[_label] += time.thread_time() - started
                inside.discard(_label)

        async def timed_async(
            *args: Any, _f: Any = function, _label: str = label, **kwargs: Any
        ) -> Any:
            started = time.thread_time()
            try:
                return await _f(*args, **kwargs)
            finally:  # the coroutine's own time and what it awaited in this thread
                spent[_label] += time.thread_time() - started

        setattr(owner, name, timed_async if inspect.iscoroutinefunction(function) else timed)
    return spent


async def measure(args: argparse.Namespace) -> dict[str, Any]:
    """``--repeat`` passes of this checkout's code: CPU µs per event of each stage, every pass."""
    shape = SHAPES[args.shape]
    settings = Settings(partitions=8, state_store=f"{args.state}://")
    events = generate(args.traces, seed=args.seed, duplicate_rate=0.02, shape=shape)
    messages = routed(settings, events)
    tune_gc()  # as the worker and its join processes do
    size = sum(len(m.value) for m in messages)
    result: dict[str, Any] = {
        "events": len(messages), "avg_event_kib": size / len(messages) / 1024,
        "join": [], "sink": [], "commit": [], "detail": {},
    }  # fmt: skip
    if args.stages == "none":
        return result
    profiler = cProfile.Profile() if args.cprofile else None
    spent = instrument() if args.detail else None
    per_event = 1e6 / len(messages)
    for n in range(args.repeat):
        with tempfile.TemporaryDirectory(prefix="rl-export-profile-") as folder:
            if profiler is not None and n == args.repeat - 1:
                profiler.enable()
            join_s, emitter = await join_pass(settings, messages, Path(folder))
            split_s, commit_s, objects = (
                await sink_pass(settings, emitter, args.poll)
                if args.stages == "all"
                else (0.0, 0.0, 0)
            )
            if profiler is not None and n == args.repeat - 1:
                profiler.disable()
        result["join"].append(join_s * per_event)
        result["sink"].append(split_s * per_event)
        result["commit"].append(commit_s * per_event)
        result.update(snapshots=len(emitter.snapshots), records=emitter.records, objects=objects)
    if spent is not None:
        result["detail"] = {k: v * per_event / args.repeat for k, v in spent.items()}
    if profiler is not None:
        stats = pstats.Stats(profiler, stream=sys.stderr)
        stats.sort_stats("tottime").print_stats(args.cprofile)
    return result


def child_pass(args: argparse.Namespace, checkout: Path) -> dict[str, Any]:
    """One pass of a checkout's code, by this harness, in a fresh child process (each pass
    of either side alike: no pass inherits another's heap)."""
    import json
    import os
    import subprocess

    env = dict(os.environ, PYTHONPATH=f"{checkout / 'services'}{os.pathsep}{ROOT}")
    argv = [
        sys.executable, "-m", "tests.perf.profile", "--json", "--repeat", "1",
        "--shape", args.shape, "--traces", str(args.traces), "--seed", str(args.seed),
        "--state", args.state, "--stages", args.stages, "--poll", str(args.poll),
        *(["--detail"] if args.detail else []),
    ]  # fmt: skip
    done = subprocess.run(argv, env=env, cwd=ROOT, capture_output=True, check=False)
    if done.returncode != 0:
        sys.exit(f"a pass of {checkout} failed:\n{done.stderr.decode(errors='replace')}")
    found: dict[str, Any] = json.loads(done.stdout.decode().splitlines()[-1])
    return found


def _best(values: list[float]) -> str:
    if not values:
        return "-"
    return f"{min(values):6.1f} (median {statistics.median(values):5.1f})"


def report(args: argparse.Namespace, ours: dict[str, Any], base: dict[str, Any] | None) -> None:
    print(f"{args.shape}: {ours['events']:,} events, {ours['avg_event_kib']:.2f} KiB avg, "
          f"state {args.state}; {ours.get('snapshots', 0):,} snapshots, "
          f"{ours.get('records', 0):,} records produced, {ours.get('objects', 0):,} objects "
          f"written; CPU µs per event, best of {len(ours['join'])}")  # fmt: skip
    rows = [("join", "join (decode to produce)"), ("sink", "sink: split into corpora"),
            ("commit", "sink: shards, sidecars, commits")]  # fmt: skip
    width = 34
    head = f"  {'stage':<{width}} {'this code':>22}"
    if base is not None:
        head += f" {'baseline (' + args.baseline.name + ')':>22} {'ratio':>6}"
    print(head)
    total_ours, total_base = 0.0, 0.0
    for key, label in rows:
        line = f"  {label:<{width}} {_best(ours[key]):>22}"
        total_ours += min(ours[key]) if ours[key] else 0.0
        if base is not None:
            line += f" {_best(base[key]):>22}"
            if base[key] and min(base[key]) > 0:
                line += f" {min(ours[key]) / min(base[key]):6.2f}"
            total_base += min(base[key]) if base[key] else 0.0
        print(line)
    line = f"  {'total':<{width}} {total_ours:>6.1f}{'':>16}"
    if base is not None and total_base:
        line += f" {total_base:>6.1f}{'':>16} {total_ours / total_base:6.2f}"
    print(line)
    if ours["detail"]:
        print("  of which (timed apart, mean of the passes):")
        labels = list(dict.fromkeys([*ours["detail"], *((base or {}).get("detail") or {})]))
        for label in labels:
            line = f"    {label:<{width - 2}} {ours['detail'].get(label, 0.0):>6.1f}{'':>16}"
            if base is not None:
                line += f" {base['detail'].get(label, 0.0):>6.1f}"
            print(line)


async def profile(args: argparse.Namespace) -> None:
    if args.json:
        print(orjson.dumps(await measure(args)).decode())
        return
    if args.baseline is None:
        report(args, await measure(args), None)
        return
    # Interleaved: a pass of the baseline, a pass of this code, and so on, each in a process
    # of its own.
    ours: dict[str, Any] = {}
    base: dict[str, Any] = {}
    repeat, args.repeat = args.repeat, 1
    for _ in range(repeat):
        for into, got in ((base, child_pass(args, args.baseline)), (ours, child_pass(args, ROOT))):
            for key, value in got.items():
                if isinstance(value, list):
                    into.setdefault(key, []).extend(value)
                elif key == "detail":
                    detail = into.setdefault("detail", {})
                    for label, spent in value.items():
                        detail[label] = detail.get(label, 0.0) + spent / repeat
                else:
                    into[key] = value
    args.repeat = repeat
    report(args, ours, base)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="rl-export-profile", description=__doc__.split("\n")[0])
    parser.add_argument("--shape", default="standard", choices=sorted(SHAPES))
    parser.add_argument("--traces", type=int, default=6000)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--state", default="rocksdb", choices=["rocksdb", "memory"])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument(
        "--poll", type=int, default=5000, metavar="N",
        help="snapshots the sink takes between looks at its bounds (a consumer's poll)",
    )  # fmt: skip
    parser.add_argument(
        "--stages", default="all", choices=["none", "join", "all"],
        help="run nothing but the set-up, the join only, or the join and the sink",
    )  # fmt: skip
    parser.add_argument(
        "--detail", action="store_true",
        help="time the steps of each stage apart too (their timers cost a little)",
    )  # fmt: skip
    parser.add_argument(
        "--baseline", type=Path, metavar="CHECKOUT",
        help="another checkout (a git worktree) run the same way, interleaved, side by side",
    )  # fmt: skip
    parser.add_argument("--json", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument(
        "--cprofile", type=int, default=0, metavar="N",
        help="print the N functions with the most own time (last pass)",
    )  # fmt: skip
    args = parser.parse_args(argv)
    if args.repeat < 1 or args.poll < 1 or args.traces < 1:
        parser.error("--repeat, --poll and --traces must be at least 1")
    if args.baseline is not None and not (args.baseline / "services" / "rl_export").is_dir():
        parser.error(f"--baseline: {args.baseline} is not a checkout (no services/rl_export)")
    asyncio.run(profile(args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
