"""``make bench``: one worker against a bare consumer on the same backlog, side by side.

1. Start the local Kafka broker and produce a backlog per traffic shape (``--shapes``, see
   :data:`rl_export.local.synthetic.SHAPES`): ``standard`` (one org/project, 1.3 KiB
   events: multi-turn conversations with tool calls, evaluations with reports, a few labels)
   and ``small`` (three org/projects, 0.7 KiB events, label-heavy); shuffled, 2 % repeats.
   What a worker costs grows with events, what a bare consumer costs with bytes: one shape
   alone would hide that.
2. Baseline: a bare aiokafka consumer that parses every event with orjson and writes JSONL,
   timed from its first record to its last (joining its group is reported apart): with
   ``getmany``'s ``max_records`` at its default (the reference of the worker's ratio), and
   tuned (``max_poll_records=5000``).
3. One ``rl-export worker`` (join processes and sink, RocksDB table) catches up on the same
   backlog, timed from the moment it is ready (joined both groups, table restored) to the
   moment the last trajectory is visible in the store: the ``created_at`` of the last commit,
   once both its groups have committed the end of every topic.
4. With ``--baseline CHECKOUT`` (``make bench BASELINE=...``), the same worker run from
   another checkout's code (this Python, the checkout's ``services`` first on
   ``PYTHONPATH``), or with ``--baseline-python`` another checkout's Python (for example
   ``../before/.venv/bin/python``): before and after, measured by the same harness, each
   with its ratio to the bare consumer and its time to ready.
5. Two workers on the same backlog: the scaling.
   Before step 2, untimed catch-ups of one worker warm the broker up, until its JIT
   compiler threads use less than half a second in one (``--warm-up``, at most 8):
   :func:`warm_up`.
   Steps 2 to 5 run ``--runs`` times (3), interleaved, each catch-up with fresh groups,
   output topics and store; the medians are reported, and every run. The machine is
   shared with the broker, and single runs differ by up to 20 %.
6. Freshness under a steady load: event to visible in a corpus, p50/p99.

Results are printed and written as JSON to ``var/bench/<time>.json`` to compare runs.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import orjson
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.errors import KafkaError

from rl_export.local.broker import LocalKafka
from rl_export.local.process import tail
from rl_export.local.synthetic import SHAPES, STANDARD, Shape, generate, trace_events
from rl_export.model.events import FAMILY_OF_TYPE
from rl_export.model.partitioning import kafka_partitioner
from rl_export.runtime.net import free_port
from rl_export.runtime.settings import Settings, env_name
from rl_export.stream.produce import topic_for
from rl_export.stream.topics import ensure_service_topics
from tests.harness.reads import unread
from tests.harness.usage import (
    busy_share,
    compiler_cpu,
    cpu_seconds,
    machine_cpu,
    peak_rss_parts_mib,
    worker_cpu,
)
from tests.perf.significance import compare, verdict

logging.getLogger("aiokafka").setLevel(logging.ERROR)  # retries while leaders settle

# Traces per shape: about 104,000 and 110,000 events.
DEFAULT_TRACES = {"standard": 36_000, "small": 24_000}
MIB = 1024 * 1024


def log(message: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {message}", flush=True)


async def produce(settings: Settings, events: list[dict[str, Any]]) -> float:
    await ensure_service_topics(settings)
    producer = AIOKafkaProducer(
        bootstrap_servers=settings.kafka_bootstrap,
        linger_ms=20,
        max_batch_size=512 * 1024,
        partitioner=kafka_partitioner(settings.partitioner),
    )
    await producer.start()
    started = time.perf_counter()
    try:
        futures = []
        for event in events:
            topic = topic_for(settings, FAMILY_OF_TYPE[event["event_type"]])
            futures.append(
                await producer.send(topic, orjson.dumps(event), key=event["trace_id"].encode())
            )
        for fut in futures:
            await fut
    finally:
        await producer.stop()
    return time.perf_counter() - started


async def bare_consumer(
    settings: Settings, total: int, out: Path, run: int = 0, max_poll_records: int | None = 5000
) -> dict[str, float]:
    """The baseline: consume, parse with orjson, write JSONL; no join, no state.

    Timed from its first record to its last; ``join_seconds`` is the time before the first
    record (joining the group, the first fetch), reported apart. ``max_poll_records`` None:
    aiokafka's default (``getmany`` returns what it has fetched).
    """
    tuned = {} if max_poll_records is None else {"max_poll_records": max_poll_records}
    consumer = AIOKafkaConsumer(
        *settings.input_topics,
        bootstrap_servers=settings.kafka_bootstrap,
        group_id=f"bench-bare-{os.getpid()}-{run}-{max_poll_records}-{settings.topic_traces}",
        auto_offset_reset="earliest",
        enable_auto_commit=False,
        **tuned,
    )
    started = time.perf_counter()
    await consumer.start()
    seen = 0
    first: float | None = None
    try:
        with open(out, "wb") as fh:
            while seen < total:
                batch = await consumer.getmany(timeout_ms=500)
                if batch and first is None:
                    first = time.perf_counter()
                for records in batch.values():
                    for r in records:
                        fh.write(orjson.dumps(orjson.loads(r.value)) + b"\n")
                    seen += len(records)
    finally:
        await consumer.stop()
    done = time.perf_counter()
    assert first is not None
    return {"seconds": done - first, "join_seconds": first - started}


async def lag(settings: Settings, group: str, topics: list[str]) -> int:
    """Messages not yet committed by ``group`` on ``topics``."""
    admin = AIOKafkaAdminClient(bootstrap_servers=settings.kafka_bootstrap)
    consumer = AIOKafkaConsumer(bootstrap_servers=settings.kafka_bootstrap)
    await admin.start()
    await consumer.start()
    try:
        tps = [TopicPartition(t, p) for t in topics for p in range(settings.partitions)]
        ends = await consumer.end_offsets(tps)
        try:
            committed = await admin.list_consumer_group_offsets(group)
        except KafkaError:  # the group does not exist yet
            return sum(ends.values())
        total = 0
        for tp in tps:
            done = committed.get(tp)
            total += ends[tp] - (done.offset if done is not None and done.offset >= 0 else 0)
        return total
    finally:
        await consumer.stop()
        await admin.close()


async def left(settings: Settings) -> int:
    """Records either group has not committed past, read (exact, markers aside)."""
    bootstrap = settings.kafka_bootstrap
    join = await unread(bootstrap, settings.app_id, settings.input_topics)
    sink = await unread(bootstrap, settings.sink_group, [settings.topic_trajectories])
    return len(join) + len(sink)


async def first_output_at(settings: Settings) -> float | None:
    """When the worker's first snapshot was produced (its Kafka timestamp, in seconds).

    A worker's join may take its first batches before the whole worker is ready (its other
    join process and its sink still joining their groups); the clock starts at the earlier
    of the two.
    """
    consumer = AIOKafkaConsumer(bootstrap_servers=settings.kafka_bootstrap)
    await consumer.start()
    try:
        tps = [TopicPartition(settings.topic_trajectories, p) for p in range(settings.partitions)]
        consumer.assign(tps)
        ends = await consumer.end_offsets(tps)
        await consumer.seek_to_beginning(*tps)
        waiting = {tp for tp in tps if ends[tp] > 0}
        first: list[int] = []
        while waiting:
            fetched = await consumer.getmany(*waiting, timeout_ms=2000, max_records=1)
            if not fetched:
                break
            for tp, records in fetched.items():
                if records:
                    first.append(records[0].timestamp)
                    waiting.discard(tp)
        return min(first) / 1000 if first else None
    finally:
        await consumer.stop()


def last_commit_at(store: Path) -> float:
    """When the last commit in a local store was created (seconds since the epoch)."""
    latest = 0.0
    for path in store.rglob("_manifest/*/*.json"):
        created = orjson.loads(path.read_bytes())["created_at"]
        latest = max(latest, datetime.fromisoformat(created).timestamp())
    return latest


def worker_env(
    settings: Settings, port: int, data_dir: Path, extra: Mapping[str, str] | None = None
) -> dict[str, str]:
    """The environment of a bench worker: only what differs from the defaults, and ``extra``.

    A worker of another checkout (``--baseline-python``) may not know every setting this one
    has; the defaults it does not know are the defaults it has.
    """
    env = {k: v for k, v in os.environ.items() if not k.startswith("RL_EXPORT_")}
    env.update(extra or {})
    dumped = settings.model_dump(mode="json", exclude_defaults=True)
    for name, value in dumped.items():
        env[env_name(name)] = value if isinstance(value, str) else json.dumps(value)
    env[env_name("worker_web_port")] = str(port)
    env[env_name("data_dir")] = str(data_dir)
    return env


def start_worker(
    settings: Settings, data_dir: Path, python: str = sys.executable,
    env: Mapping[str, str] | None = None,
) -> tuple[subprocess.Popen[bytes], int]:  # fmt: skip
    port = free_port()
    data_dir.mkdir(parents=True, exist_ok=True)
    with open(data_dir / "worker.log", "wb") as log_file:  # the child keeps its own handle
        proc = subprocess.Popen(
            [python, "-m", "rl_export.cli", "worker"],
            env=worker_env(settings, port, data_dir, env),
            stdout=log_file,
            stderr=subprocess.STDOUT,
        )
    return proc, port


def metrics(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        return str(response.read().decode())


def histogram(text: str, name: str) -> list[tuple[float, float]]:
    """(upper bound, cumulative count) of a histogram in Prometheus text."""
    out = []
    for line in text.splitlines():
        if line.startswith(f"{name}_bucket{{"):
            le = line.split('le="', 1)[1].split('"', 1)[0]
            out.append((float("inf") if le == "+Inf" else float(le), float(line.rsplit(" ", 1)[1])))
    return out


def quantile(
    before: list[tuple[float, float]], after: list[tuple[float, float]], q: float
) -> float:
    """A quantile of the observations made between two histogram readings (interpolated)."""
    base = dict(before)
    counts = [(le, c - base.get(le, 0.0)) for le, c in after]
    total = counts[-1][1] if counts else 0
    if total <= 0:
        return float("nan")
    rank, previous_le, previous_c = q * total, 0.0, 0.0
    for le, c in counts:
        if c >= rank:
            if le == float("inf"):
                return previous_le
            span = c - previous_c
            return previous_le + (le - previous_le) * ((rank - previous_c) / span if span else 0)
        previous_le, previous_c = le, c
    return previous_le


WARM_COMPILE_S = 0.5
"""The broker is warm once its JIT compiled for less than this during a whole catch-up."""


async def warm_up(settings: Settings, work: Path, broker_pid: int, most: int) -> list[float]:
    """Untimed catch-ups of one worker until the broker's JIT has settled (``most`` at most).

    A broker started for the bench is a young JVM: its compiler threads compile Kafka's hot
    paths for the first several catch-ups (4.9, 2.0, 4.0, 2.4, 1.8, 0.8, 0.3 s of CPU in
    seven exactly-once catch-ups of the small shape), on the same two cores as the worker.
    A broker in service is warm, and the transactions' paths are the last to be compiled,
    so a cold broker charges exactly once more than it costs. Returns the compiler threads'
    CPU seconds in each warm-up catch-up.
    """
    compiled: list[float] = []
    for i in range(most):
        tag = f"{settings.topic_trajectories}-warm-{i}"
        before = compiler_cpu(broker_pid)
        log(f"broker warm-up {i + 1} (at most {most}): one worker catching up, untimed")
        await catch_up(fresh(settings, tag, work / f"store-{tag}"), 1, work / tag)
        compiled.append(compiler_cpu(broker_pid) - before)
        shutil.rmtree(work / tag, ignore_errors=True)
        shutil.rmtree(work / f"store-{tag}", ignore_errors=True)
        if compiled[-1] < WARM_COMPILE_S:
            break
    return compiled


def ready(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=1) as response:
            return bool(response.status == 200)
    except OSError:
        return False


def _check_running(procs: list[tuple[subprocess.Popen[bytes], int]], data_dir: Path) -> None:
    for i, (proc, _) in enumerate(procs):
        if proc.poll() is not None:
            log_path = data_dir / f"w{i}" / "worker.log"
            raise RuntimeError(
                f"worker {i} exited early with code {proc.returncode}; the end of {log_path}:\n"
                + tail(log_path, 30)
            )


async def catch_up(
    settings: Settings, workers: int, data_dir: Path, python: str = sys.executable,
    broker_pid: int | None = None, *, env: Mapping[str, str] | None = None,
) -> dict[str, Any]:  # fmt: skip
    """Run ``workers`` workers until the last trajectory is visible in the store; time it.

    The clock starts when every worker is ready (joined both groups, state restored), so
    process start-up (imports, group joins) is reported apart, or at the first snapshot if
    that came earlier; it stops at the creation of the last commit, found once both groups
    have committed the end of every topic. CPU time is counted over the same span, per kind
    of process (join processes, the worker's own process with the sink, the broker), and
    the share of the machine's cores that was busy (``machine_busy``: near 1, the catch-up
    was bound by the machine's CPU, whoever used it).
    """
    launched = time.perf_counter()
    procs = [start_worker(settings, data_dir / f"w{i}", python, env) for i in range(workers)]
    try:
        while not all(ready(port) for _, port in procs):
            await asyncio.sleep(0.05)
            _check_running(procs, data_dir)
        started, started_wall = time.perf_counter(), time.time()
        cpu_before = [worker_cpu(p.pid) for p, _ in procs]
        broker_before = cpu_seconds(broker_pid) if broker_pid else 0.0
        machine_before = machine_cpu()
        while True:
            await asyncio.sleep(0.25)
            _check_running(procs, data_dir)
            join_lag = await lag(settings, settings.app_id, list(settings.input_topics))
            sink_lag = await lag(settings, settings.sink_group, [settings.topic_trajectories])
            # A partition written in transactions ends with a commit marker past the last
            # record a consumer can commit: at most one per partition. Then read what is left.
            markers = settings.partitions
            if join_lag <= markers and sink_lag <= markers and not await left(settings):
                break
        polled = time.perf_counter() - started
        machine_busy = busy_share(machine_before, machine_cpu())
        cpu_after = [worker_cpu(p.pid) for p, _ in procs]
        broker_cpu = (cpu_seconds(broker_pid) - broker_before) if broker_pid else 0.0
        first = await first_output_at(settings)
        if first is not None and first < started_wall:
            polled += started_wall - first
            started_wall = first
        visible = last_commit_at(Path(settings.store_url)) - started_wall
        rss_parts = [peak_rss_parts_mib(p.pid) for p, _ in procs]
        text = "".join(metrics(port) for _, port in procs)
    finally:
        for proc, _ in procs:
            proc.terminate()
        for proc, _ in procs:
            proc.wait(60)
    return {
        "workers": workers,
        # The last commit can only be earlier than the poll that saw both lags at zero.
        "seconds": visible if 0 < visible <= polled else polled,
        "start_seconds": started - launched,
        "machine_busy": machine_busy,
        # The sum of each process's peak, per worker (shared library pages count in each).
        "peak_rss_mib": [sum(parts) for parts in rss_parts],
        "peak_rss_parts_mib": rss_parts,
        "metrics": text,
        "cpu_seconds": {
            "join": sum(a["join"] - b["join"] for a, b in zip(cpu_after, cpu_before, strict=True)),
            "worker": sum(
                a["worker"] - b["worker"] for a, b in zip(cpu_after, cpu_before, strict=True)
            ),
            "broker": broker_cpu,
        },
    }


async def steady(settings: Settings, data_dir: Path, rate: float, seconds: float) -> dict[str, Any]:
    """Freshness under a steady load: publish ``rate`` events/s, read the sink's histogram."""
    proc, port = start_worker(settings, data_dir)
    try:
        while True:  # ready? (a poll: the worker is another process)
            if ready(port):
                break
            await asyncio.sleep(0.5)
        await asyncio.sleep(3)
        before = histogram(metrics(port), "rl_export_sink_freshness_seconds")
        join_before = histogram(metrics(port), "rl_export_join_latency_seconds")
        rng = random.Random(99)
        producer = AIOKafkaProducer(
            bootstrap_servers=settings.kafka_bootstrap,
            linger_ms=5,
            partitioner=kafka_partitioner(settings.partitioner),
        )
        await producer.start()
        sent, index, started = 0, 10_000_000, time.perf_counter()
        try:
            while time.perf_counter() - started < seconds:
                completed = datetime.now(UTC) - timedelta(hours=6)
                for event in trace_events(rng, index, completed):
                    topic = topic_for(settings, FAMILY_OF_TYPE[event["event_type"]])
                    await producer.send(topic, orjson.dumps(event), key=event["trace_id"].encode())
                    sent += 1
                index += 1
                ahead = sent / rate - (time.perf_counter() - started)
                if ahead > 0:
                    await asyncio.sleep(ahead)
            await producer.flush()
        finally:
            await producer.stop()
        await asyncio.sleep(settings.shard_max_age_s + 3)  # let the last shards commit
        text = metrics(port)
        after = histogram(text, "rl_export_sink_freshness_seconds")
        join_after = histogram(text, "rl_export_join_latency_seconds")
    finally:
        proc.terminate()
        proc.wait(60)
    return {
        "rate": rate,
        "seconds": seconds,
        "events": sent,
        "freshness_p50_s": quantile(before, after, 0.5),
        "freshness_p99_s": quantile(before, after, 0.99),
        "join_latency_p50_s": quantile(join_before, join_after, 0.5),
        "join_latency_p99_s": quantile(join_before, join_after, 0.99),
    }


def bench_settings(bootstrap: str, work: Path) -> Settings:
    """The settings every bench worker starts from, in the bench's ``work`` folder."""
    # Quiet chains do not wait (RL_EXPORT_CORPUS_MAX_AGE_S=0, the default before issue 58):
    # a catch-up measures the join and the sink, and its clock stops at the last trajectory
    # visible; a chain left with a few lines at the end would hold that 120 s (one round of
    # a peers run measured 868 events/s so). bench-tenants measures the policy itself.
    return Settings(
        kafka_bootstrap=bootstrap, partitions=8, state_store="rocksdb://",
        data_dir=work / "var", store_url=str(work / "store"), shard_max_age_s=1.0,
        corpus_max_age_s=0.0,
    )  # fmt: skip


async def produce_backlog(
    settings: Settings, shape: Shape, traces: int, seed: int
) -> tuple[list[dict[str, Any]], int, float]:
    """Generate a shape's backlog (2 % repeats) and produce it: the events, their bytes, the
    seconds producing took."""
    events = generate(traces, seed=seed, duplicate_rate=0.02, shape=shape)
    size = sum(len(orjson.dumps(e)) for e in events)
    log(f"{shape.name}: producing {len(events):,} events ({size / len(events) / 1024:.2f} KiB "
        f"avg, {len(shape.projects)} org/projects)")  # fmt: skip
    return events, size, await produce(settings, events)


def fresh(settings: Settings, tag: str, store: Path) -> Settings:
    """Same input topics; new groups, output topics and store: a worker catching up from zero.

    The output topics are new too, or the second run's sink would also read every snapshot
    the first run wrote.
    """
    return settings.model_copy(
        update={"app_id": f"bench-{tag}-join", "sink_group": f"bench-{tag}-sink",
                "store_url": str(store),
                "topic_trajectories": f"bench-{tag}.{settings.topic_trajectories}",
                "topic_dead_letter": f"bench-{tag}.{settings.topic_dead_letter}"}
    )  # fmt: skip


def own_topics(settings: Settings, prefix: str) -> Settings:
    """The same settings on input and output topics of their own (``<prefix>.<topic>``)."""
    names = ("topic_traces", "topic_evaluations", "topic_labels", "topic_trajectories",
             "topic_dead_letter", "topic_commits")  # fmt: skip
    return settings.model_copy(
        update={name: f"{prefix}.{getattr(settings, name)}" for name in names}
    )


def cpu_per_event(runs: list[dict[str, Any]], events: int) -> dict[str, float]:
    """Median CPU µs per backlog event of each kind of process over the runs."""
    kinds = runs[0]["cpu_seconds"]
    return {k: statistics.median(r["cpu_seconds"][k] for r in runs) / events * 1e6 for k in kinds}


def highest_rss(runs: list[dict[str, Any]]) -> list[float]:
    """The per-process peaks of the first worker in the run whose sum of them was highest."""
    return max((r["peak_rss_parts_mib"][0] for r in runs), key=sum)


def _median_run(runs: list[dict[str, Any]], rates: list[float]) -> dict[str, Any]:
    return runs[rates.index(sorted(rates)[len(rates) // 2])]


async def measure_shape(
    base: Settings, shape: Shape, traces: int, seed: int, work: Path, *, runs: int,
    baseline_python: str | None, broker_pid: int | None = None, warm_up_runs: int = 0,
    baseline_env: Mapping[str, str] | None = None,
) -> dict[str, Any]:  # fmt: skip
    """Steps 1-5 for one traffic shape; the numbers of its runs and their medians."""
    settings = own_topics(base, shape.name)
    events, size, produce_s = await produce_backlog(settings, shape, traces, seed)
    compiled = await warm_up(settings, work, broker_pid, warm_up_runs) if broker_pid else []

    bare: list[dict[str, float]] = []
    bare_default: list[dict[str, float]] = []
    ones: list[dict[str, Any]] = []
    befores: list[dict[str, Any]] = []
    plain: list[dict[str, Any]] = []
    twos: list[dict[str, Any]] = []
    for run in range(runs):  # interleaved, so that drift in the machine hits every kind
        step = f"{shape.name} run {run + 1} of {runs}"
        log(f"{step}: bare aiokafka consumer, orjson parse, JSONL write (max_records default)")
        bare_default.append(
            await bare_consumer(settings, len(events), work / "bare.jsonl", run, None)
        )
        log(f"{step}: bare aiokafka consumer, max_poll_records=5000")
        bare.append(await bare_consumer(settings, len(events), work / "bare.jsonl", run))
        log(f"{step}: one worker (join + sink) catching up")
        tag = f"{shape.name}-one-{run}"
        ones.append(
            await catch_up(
                fresh(settings, tag, work / f"store-{tag}"),
                1,
                work / tag,
                broker_pid=broker_pid,
            )
        )
        if baseline_python:
            log(f"{step}: one baseline worker ({baseline_python}) catching up")
            tag = f"{shape.name}-before-{run}"
            befores.append(
                await catch_up(
                    fresh(settings, tag, work / f"store-{tag}"),
                    1,
                    work / tag,
                    baseline_python,
                    broker_pid=broker_pid,
                    env=baseline_env,
                )
            )
        log(f"{step}: one worker, at least once (no transactions)")
        tag = f"{shape.name}-alo-{run}"
        unfenced = fresh(settings, tag, work / f"store-{tag}").model_copy(
            update={"processing_guarantee": "at_least_once"}
        )
        plain.append(await catch_up(unfenced, 1, work / tag, broker_pid=broker_pid))
        log(f"{step}: two workers catching up on the same backlog")
        tag = f"{shape.name}-two-{run}"
        twos.append(await catch_up(fresh(settings, tag, work / f"store-{tag}"), 2, work / tag))

    def rates(items: list[dict[str, Any]]) -> list[float]:
        return [len(events) / r["seconds"] for r in items]

    bare_rates, one_rates, two_rates = rates(bare), rates(ones), rates(twos)
    default_rates = rates(bare_default)
    result: dict[str, Any] = {
        "shape": shape.name,
        "events": len(events),
        "traces": traces,
        "org_projects": len(shape.projects),
        "avg_event_bytes": size / len(events),
        "backlog_mib": size / MIB,
        "produce_events_per_s": len(events) / produce_s,
        "warm_up_compile_seconds": compiled,
        "runs": runs,
        "bare_consumer_events_per_s": statistics.median(bare_rates),
        "bare_consumer_runs": bare_rates,
        "bare_consumer_join_seconds": statistics.median(b["join_seconds"] for b in bare),
        "bare_default_events_per_s": statistics.median(default_rates),
        "bare_default_runs": default_rates,
        "worker_events_per_s": statistics.median(one_rates),
        "worker_runs": one_rates,
        "worker_start_seconds": _median_run(ones, one_rates)["start_seconds"],
        "worker_peak_rss_mib": sum(highest_rss(ones)),
        "worker_peak_rss_parts_mib": highest_rss(ones),
        "worker_cpu_us_per_event": cpu_per_event(ones, len(events)),
        "worker_machine_busy": statistics.median(r["machine_busy"] for r in ones),
        "processing_guarantee": settings.processing_guarantee,
        "at_least_once_events_per_s": statistics.median(rates(plain)),
        "at_least_once_runs": rates(plain),
        "at_least_once_cpu_us_per_event": cpu_per_event(plain, len(events)),
        "two_workers_events_per_s": statistics.median(two_rates),
        "two_workers_runs": two_rates,
        "two_workers_peak_rss_mib": [max(r["peak_rss_mib"][i] for r in twos) for i in (0, 1)],
    }
    result["worker_vs_bare"] = result["worker_events_per_s"] / result["bare_consumer_events_per_s"]
    result["worker_vs_bare_default"] = (
        result["worker_events_per_s"] / result["bare_default_events_per_s"]
    )
    result["two_vs_one"] = result["two_workers_events_per_s"] / result["worker_events_per_s"]
    result["exactly_once_vs_at_least_once"] = (
        result["worker_events_per_s"] / result["at_least_once_events_per_s"]
    )
    if befores:
        before_rates = rates(befores)
        result["baseline_python"] = baseline_python
        result["baseline_worker_events_per_s"] = statistics.median(before_rates)
        result["baseline_worker_runs"] = before_rates
        result["baseline_worker_peak_rss_parts_mib"] = highest_rss(befores)
        result["baseline_worker_peak_rss_mib"] = sum(highest_rss(befores))
        result["baseline_worker_cpu_us_per_event"] = cpu_per_event(befores, len(events))
        result["baseline_worker_machine_busy"] = statistics.median(
            r["machine_busy"] for r in befores
        )
        result["baseline_worker_start_seconds"] = _median_run(befores, before_rates)[
            "start_seconds"
        ]
        result["baseline_worker_vs_bare_default"] = (
            result["baseline_worker_events_per_s"] / result["bare_default_events_per_s"]
        )
        result["baseline_worker_vs_bare"] = (
            result["baseline_worker_events_per_s"] / result["bare_consumer_events_per_s"]
        )
        result["worker_vs_baseline_worker"] = (
            result["worker_events_per_s"] / result["baseline_worker_events_per_s"]
        )
        result["worker_vs_baseline_worker_test"] = compare(before_rates, result["worker_runs"])
    return result


async def run(
    shapes: list[str], traces: dict[str, int], seed: int, out_dir: Path, *, keep: bool,
    steady_rate: float, runs: int = 3, baseline_python: str | None = None,
    warm_up_runs: int = 8, baseline_env: Mapping[str, str] | None = None,
) -> dict[str, Any]:  # fmt: skip
    work = Path(tempfile.mkdtemp(prefix="rl-export-bench-"))
    broker = LocalKafka(work / "kafka", free_port(), heap="1g")
    log(f"starting Kafka in {work}")
    broker.start()
    try:
        base = bench_settings(broker.bootstrap, work)
        measured = []
        for name in shapes:
            shape = SHAPES[name]
            measured.append(
                await measure_shape(
                    base,
                    shape,
                    traces[name],
                    seed,
                    work,
                    runs=runs,
                    baseline_python=baseline_python,
                    broker_pid=broker.pid,
                    warm_up_runs=warm_up_runs,
                    baseline_env=baseline_env,
                )
            )
        log(f"freshness under a steady load of {steady_rate:g} events/s (shard age bound 1 s)")
        quiet = own_topics(fresh(base, "steady", work / "store-steady"), "steady")
        fresh_stats = await steady(quiet, work / "steady", rate=steady_rate, seconds=30)
    finally:
        broker.stop()
        if not keep:
            shutil.rmtree(work, ignore_errors=True)
    result = {
        "at": datetime.now(UTC).isoformat(),
        "machine": {"cpus": os.cpu_count(), "python": sys.version.split()[0]},
        "join_processes": base.join_processes,
        "shapes": measured,
        "steady": fresh_stats,
    }
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"{datetime.now(UTC):%Y%m%dT%H%M%SZ}.json"
    path.write_text(json.dumps(result, indent=2))
    print_table(result, path)
    return result


def shape_rows(r: dict[str, Any]) -> list[tuple[str, str]]:
    """The printed lines of one shape's results."""

    def runs(key: str) -> str:
        return " / ".join(f"{v:,.0f}" for v in r[key])

    def mbs(rate: float) -> str:
        return f"{rate * r['avg_event_bytes'] / MIB:.1f} MB/s"

    n = r["runs"]
    rows = [
        (f"{r['shape']} backlog",
         f"{r['events']:,} events, {r['avg_event_bytes'] / 1024:.2f} KiB avg, "
         f"{r['org_projects']} org/projects, {r['backlog_mib']:.0f} MiB"),
        ("  broker warm-up, untimed", warm_up_text(r.get("warm_up_compile_seconds", []))),
        (f"  bare consumer, max_records default (the reference), median of {n}",
         f"{r['bare_default_events_per_s']:,.0f} events/s, "
         f"{mbs(r['bare_default_events_per_s'])}  ({runs('bare_default_runs')})"),
        (f"  bare consumer, max_poll_records=5000 (tuned), median of {n}",
         f"{r['bare_consumer_events_per_s']:,.0f} events/s, "
         f"{mbs(r['bare_consumer_events_per_s'])}  ({runs('bare_consumer_runs')}); "
         f"group join {r['bare_consumer_join_seconds']:.1f} s apart"),
        (f"  one worker, join + sink, median of {n}",
         f"{r['worker_events_per_s']:,.0f} events/s, {mbs(r['worker_events_per_s'])}  "
         f"({runs('worker_runs')}); ready after {r['worker_start_seconds']:.1f} s"),
        ("    ratio to the bare consumer (default / tuned)",
         f"{r['worker_vs_bare_default']:.3f} / {r['worker_vs_bare']:.3f}  (goal 0.15 / -)"),
        ("    peak RSS (worker + join processes)",
         rss_text(r["worker_peak_rss_mib"], r["worker_peak_rss_parts_mib"])),
        ("    CPU per event", cpu_text(r["worker_cpu_us_per_event"])),
        ("    the machine's cores busy meanwhile (median)",
         busy_text(r.get("worker_machine_busy"))),
        (f"  one worker, at least once (no transactions), median of {n}",
         f"{r['at_least_once_events_per_s']:,.0f} events/s  ({runs('at_least_once_runs')})"),
        ("    exactly once / at least once", f"{r['exactly_once_vs_at_least_once']:.3f}"),
        ("    CPU per event", cpu_text(r["at_least_once_cpu_us_per_event"])),
    ]  # fmt: skip
    if "baseline_worker_events_per_s" in r:
        rows += [
            (f"  baseline worker, median of {n}",
             f"{r['baseline_worker_events_per_s']:,.0f} events/s  "
             f"({runs('baseline_worker_runs')}), peak RSS "
             + rss_text(r["baseline_worker_peak_rss_mib"],
                        r["baseline_worker_peak_rss_parts_mib"])),
            ("    ready after", f"{r['baseline_worker_start_seconds']:.1f} s"),
            ("    ratio to the bare consumer (default / tuned)",
             f"{r['baseline_worker_vs_bare_default']:.3f} / {r['baseline_worker_vs_bare']:.3f}"),
            ("    CPU per event", cpu_text(r["baseline_worker_cpu_us_per_event"])),
            ("    the machine's cores busy meanwhile (median)",
             busy_text(r.get("baseline_worker_machine_busy"))),
            ("    this worker / baseline worker",
             f"{r['worker_vs_baseline_worker']:.2f} (the medians); runs apart: "
             + verdict(r["worker_vs_baseline_worker_test"])),
        ]  # fmt: skip
    rows += [
        (f"  two workers, median of {n}",
         f"{r['two_workers_events_per_s']:,.0f} events/s  ({runs('two_workers_runs')})"),
        ("    ratio to one worker", f"{r['two_vs_one']:.2f}"),
    ]  # fmt: skip
    return rows


def rss_text(total: float, parts: list[float]) -> str:
    """``495 MiB (worker with the sink 137, join processes 183 + 175)``."""
    joins = " + ".join(f"{p:.0f}" for p in parts[1:]) or "none"
    return f"{total:.0f} MiB (worker with the sink {parts[0]:.0f}, join processes {joins})"


def warm_up_text(compiled: list[float]) -> str:
    if not compiled:
        return "none (--warm-up 0): the broker's JIT compiles during the timed runs"
    each = ", ".join(f"{c:.1f}" for c in compiled)
    settled = "" if compiled[-1] < WARM_COMPILE_S else f", not yet under {WARM_COMPILE_S} s"
    return f"{len(compiled)} catch-ups; JIT compiler CPU in each: {each} s{settled}"


def busy_text(share: float | None) -> str:
    """``98 % of both cores``: near all of them, the catch-up was bound by the machine's CPU."""
    if share is None:
        return "not measured"
    cores = os.cpu_count() or 1
    return f"{share * 100:.0f} % of {cores} cores"


def cpu_text(cpu: dict[str, float]) -> str:
    return (
        f"join processes {cpu['join']:.0f} µs, worker (sink) {cpu['worker']:.0f} µs, "
        f"broker {cpu['broker']:.0f} µs"
    )


def print_table(result: dict[str, Any], path: Path) -> None:
    rows = [row for r in result["shapes"] for row in shape_rows(r)]
    s = result["steady"]
    rows += [
        ("freshness p50 / p99", f"{s['freshness_p50_s']:.2f} s / {s['freshness_p99_s']:.2f} s "
                                f"at {s['rate']:.0f} events/s (standard shape; goal: p99 at "
                                f"most 2 s: {'met' if s['freshness_p99_s'] <= 2 else 'MISSED'})"),
        ("join latency p50 / p99", f"{s['join_latency_p50_s']:.3f} s / "
                                   f"{s['join_latency_p99_s']:.3f} s"),
    ]  # fmt: skip
    width = max(len(a) for a, _ in rows)
    print()
    for a, b in rows:
        print(f"  {a:<{width}}  {b}")
    print(
        "\n  events/s: backlog events over the time from the first record (bare consumer) or"
        "\n  from ready (worker) to the last record written (bare) or the last trajectory"
        "\n  visible in the store (worker); MB/s: the same over the backlog's bytes."
    )
    print(f"\n  results: {path}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="rl-export-bench", description=__doc__.split("\n")[0])
    parser.add_argument(
        "--shapes", default="standard,small", help=f"traffic shapes, of {', '.join(SHAPES)}"
    )
    parser.add_argument("--traces", type=int, help="traces per shape (default: ~105k events)")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--out", type=Path, default=Path("var/bench"))
    parser.add_argument("--keep", action="store_true", help="keep the broker and stores")
    parser.add_argument("--steady-rate", type=float, default=500.0, help="events/s")
    parser.add_argument(
        "--steady-only", action="store_true", help="only the freshness under a steady load"
    )
    parser.add_argument("--runs", type=int, default=3, help="catch-up runs of each kind")
    parser.add_argument(
        "--warm-up", type=int, default=8, metavar="N",
        help="untimed catch-ups first, per shape, until the broker's JIT settles (at most N)",
    )  # fmt: skip
    parser.add_argument(
        "--baseline-python",
        help="also run the worker of another checkout with this Python, side by side",
    )
    parser.add_argument(
        "--baseline", type=Path, metavar="CHECKOUT",
        help="also run the worker of another checkout (a git worktree: its services/ first on "
        "PYTHONPATH, this Python), side by side",
    )  # fmt: skip
    args = parser.parse_args(argv)
    if args.runs < 1:
        parser.error("--runs must be at least 1")
    if args.warm_up < 0:
        parser.error("--warm-up must be 0 or more")
    shapes = [s.strip() for s in args.shapes.split(",") if s.strip()]
    unknown = [s for s in shapes if s not in SHAPES]
    if args.steady_only:
        shapes, unknown = [], []
    elif unknown or not shapes:
        parser.error(f"--shapes: unknown shape {unknown[0] if unknown else '(none)'!r}")
    if args.baseline_python and not Path(args.baseline_python).exists():
        parser.error(f"--baseline-python: {args.baseline_python} does not exist")
    baseline_env = None
    if args.baseline is not None:
        if args.baseline_python:
            parser.error("--baseline and --baseline-python: one or the other")
        services = args.baseline.resolve() / "services"
        if not (services / "rl_export").is_dir():
            parser.error(f"--baseline: {args.baseline} is not a checkout (no services/rl_export)")
        args.baseline_python, baseline_env = sys.executable, {"PYTHONPATH": str(services)}
    traces = {
        s: args.traces or DEFAULT_TRACES.get(s, DEFAULT_TRACES[STANDARD.name]) for s in SHAPES
    }
    asyncio.run(
        run(shapes, traces, args.seed, args.out, keep=args.keep, steady_rate=args.steady_rate,
            runs=args.runs, baseline_python=args.baseline_python, warm_up_runs=args.warm_up,
            baseline_env=baseline_env)
    )  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
