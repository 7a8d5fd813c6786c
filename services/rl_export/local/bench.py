"""``make bench``: one worker against a bare consumer on the same backlog, side by side.

1. Start the local Kafka broker and produce a backlog of realistic events (multi-turn
   conversations of a few KB, evaluations with reports, labels with skips and retractions,
   shuffled, with duplicates).
2. Baseline: a bare aiokafka consumer that parses every event with orjson and writes JSONL.
3. One ``rl-export worker`` (join processes and sink, RocksDB table) catches up on the same
   backlog, until both its consumer groups have committed the end of every topic; then the
   same with ``processing_guarantee=at_least_once``, what the join's transactions cost.
4. Two workers on the same backlog: the scaling.
   Steps 2 to 4 run ``--runs`` times (3), interleaved, each catch-up with fresh groups,
   output topics and store; the medians are reported, and every run. The machine is
   shared with the broker, and single runs differ by up to 20 %.
5. Freshness under a steady load: event to visible in a corpus, p50/p99.

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
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import orjson
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.errors import KafkaError

from rl_export.common.events import FAMILY_OF_TYPE
from rl_export.common.net import free_port
from rl_export.common.partitioning import kafka_partitioner
from rl_export.common.settings import Settings, child_env
from rl_export.local.broker import LocalKafka
from rl_export.local.process import child_pids, tail
from rl_export.local.reads import unread
from rl_export.local.synthetic import generate, trace_events
from rl_export.stream.produce import topic_for
from rl_export.stream.topics import ensure_service_topics

logging.getLogger("aiokafka").setLevel(logging.ERROR)  # retries while leaders settle


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


async def bare_consumer(settings: Settings, total: int, out: Path, run: int = 0) -> float:
    """The baseline: consume, parse with orjson, write JSONL; no join, no state."""
    consumer = AIOKafkaConsumer(
        *settings.input_topics,
        bootstrap_servers=settings.kafka_bootstrap,
        group_id=f"bench-bare-{os.getpid()}-{run}",
        auto_offset_reset="earliest",
        enable_auto_commit=False,
        max_poll_records=5000,
    )
    await consumer.start()
    seen = 0
    started = time.perf_counter()
    try:
        with open(out, "wb") as fh:
            while seen < total:
                batch = await consumer.getmany(timeout_ms=500)
                for records in batch.values():
                    for r in records:
                        fh.write(orjson.dumps(orjson.loads(r.value)) + b"\n")
                    seen += len(records)
    finally:
        await consumer.stop()
    return time.perf_counter() - started


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


def worker_env(settings: Settings, port: int, data_dir: Path, **extra: str) -> dict[str, str]:
    return child_env(
        settings,
        os.environ,
        RL_EXPORT_WORKER_WEB_PORT=str(port),
        RL_EXPORT_DATA_DIR=str(data_dir),
        **extra,
    )


def start_worker(
    settings: Settings, data_dir: Path, **extra: str
) -> tuple[subprocess.Popen[bytes], int]:
    port = free_port()
    data_dir.mkdir(parents=True, exist_ok=True)
    with open(data_dir / "worker.log", "wb") as log_file:  # the child keeps its own handle
        proc = subprocess.Popen(
            [sys.executable, "-m", "rl_export.cli", "worker"],
            env=worker_env(settings, port, data_dir, **extra),
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


def peak_rss_mib(pid: int) -> float:
    """Peak RSS of a worker: its process and its join process (the sum of their peaks)."""
    total = 0.0
    for each in [pid, *child_pids(pid)]:
        with open(f"/proc/{each}/status") as fh:
            for line in fh:
                if line.startswith("VmHWM:"):
                    total += int(line.split()[1]) / 1024
    return total


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


async def catch_up(settings: Settings, workers: int, data_dir: Path) -> dict[str, Any]:
    """Run ``workers`` workers until both groups have committed everything; time it.

    The clock that gives the rate starts when every worker is ready (joined both groups,
    state restored), so process start-up (imports, group joins) is reported apart.
    """
    launched = time.perf_counter()
    procs = [start_worker(settings, data_dir / f"w{i}") for i in range(workers)]
    try:
        while not all(ready(port) for _, port in procs):
            await asyncio.sleep(0.05)
            _check_running(procs, data_dir)
        started = time.perf_counter()
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
        elapsed = time.perf_counter() - started
        rss = [peak_rss_mib(p.pid) for p, _ in procs]
        text = "".join(metrics(port) for _, port in procs)
    finally:
        for proc, _ in procs:
            proc.terminate()
        for proc, _ in procs:
            proc.wait(60)
    return {
        "workers": workers,
        "seconds": elapsed,
        "start_seconds": started - launched,
        "peak_rss_mib": rss,
        "metrics": text,
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


async def run(
    traces: int, seed: int, out_dir: Path, *, keep: bool, steady_rate: float, runs: int = 3
) -> dict[str, Any]:
    work = Path(tempfile.mkdtemp(prefix="rl-export-bench-"))
    broker = LocalKafka(work / "kafka", free_port(), heap="1g")
    log(f"starting Kafka in {work}")
    broker.start()
    try:
        base = Settings(
            kafka_bootstrap=broker.bootstrap, partitions=8, state_store="rocksdb://",
            data_dir=work / "var", store_url=str(work / "store"), shard_max_age_s=1.0,
        )  # fmt: skip
        events = generate(traces, seed=seed, duplicate_rate=0.02)
        size = sum(len(orjson.dumps(e)) for e in events)
        log(f"producing {len(events):,} events ({size / len(events) / 1024:.1f} KiB avg)")
        produce_s = await produce(base, events)

        bare_rates, ones, twos, plain = [], [], [], []
        for run in range(runs):  # interleaved, so that drift in the machine hits them all
            log(f"run {run + 1} of {runs}: bare aiokafka consumer, orjson parse, JSONL write")
            bare_s = await bare_consumer(base, len(events), work / "bare.jsonl", run)
            bare_rates.append(len(events) / bare_s)
            log(f"run {run + 1} of {runs}: one worker (join + sink) catching up")
            tag = f"one-{run}"
            ones.append(await catch_up(fresh(base, tag, work / f"store-{tag}"), 1, work / tag))
            log(f"run {run + 1} of {runs}: one worker, at least once (no transactions)")
            tag = f"alo-{run}"
            unfenced = fresh(base, tag, work / f"store-{tag}").model_copy(
                update={"processing_guarantee": "at_least_once"}
            )
            plain.append(await catch_up(unfenced, 1, work / tag))
            log(f"run {run + 1} of {runs}: two workers catching up on the same backlog")
            tag = f"two-{run}"
            twos.append(await catch_up(fresh(base, tag, work / f"store-{tag}"), 2, work / tag))
        one_rates = [len(events) / r["seconds"] for r in ones]
        two_rates = [len(events) / r["seconds"] for r in twos]
        plain_rates = [len(events) / r["seconds"] for r in plain]
        bare_rate, one_rate, two_rate = (
            statistics.median(bare_rates), statistics.median(one_rates),
            statistics.median(two_rates),
        )  # fmt: skip
        one = ones[one_rates.index(sorted(one_rates)[len(one_rates) // 2])]  # the median run

        log(f"freshness under a steady load of {steady_rate:g} events/s (shard age bound 1 s)")
        quiet = fresh(base, "steady", work / "store-steady").model_copy(
            update={  # topics of its own: no backlog to catch up on first
                name: f"steady.{getattr(base, name)}"
                for name in ("topic_traces", "topic_evaluations", "topic_labels",
                             "topic_trajectories", "topic_dead_letter")
            }
        )  # fmt: skip
        fresh_stats = await steady(quiet, work / "steady", rate=steady_rate, seconds=30)
    finally:
        broker.stop()
        if not keep:
            shutil.rmtree(work, ignore_errors=True)
    result = {
        "at": datetime.now(UTC).isoformat(),
        "machine": {"cpus": os.cpu_count(), "python": sys.version.split()[0]},
        "events": len(events),
        "traces": traces,
        "avg_event_bytes": size / len(events),
        "produce_events_per_s": len(events) / produce_s,
        "runs": runs,
        "join_processes": base.join_processes,
        "bare_consumer_events_per_s": bare_rate,
        "bare_consumer_runs": bare_rates,
        "worker_events_per_s": one_rate,
        "worker_runs": one_rates,
        "worker_vs_bare": one_rate / bare_rate,
        "processing_guarantee": base.processing_guarantee,
        "at_least_once_events_per_s": statistics.median(plain_rates),
        "at_least_once_runs": plain_rates,
        "exactly_once_vs_at_least_once": one_rate / statistics.median(plain_rates),
        "worker_seconds": one["seconds"],
        "worker_start_seconds": one["start_seconds"],
        "worker_peak_rss_mib": max(r["peak_rss_mib"][0] for r in ones),
        "two_workers_events_per_s": two_rate,
        "two_workers_runs": two_rates,
        "two_vs_one": two_rate / one_rate,
        "two_workers_peak_rss_mib": [max(r["peak_rss_mib"][i] for r in twos) for i in (0, 1)],
        "steady": fresh_stats,
    }
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"{datetime.now(UTC):%Y%m%dT%H%M%SZ}.json"
    path.write_text(json.dumps(result, indent=2))
    print_table(result, path)
    return result


def print_table(r: dict[str, Any], path: Path) -> None:
    def runs(key: str) -> str:
        return " / ".join(f"{v:,.0f}" for v in r[key])

    rows = [
        ("events in backlog", f"{r['events']:,} ({r['avg_event_bytes'] / 1024:.1f} KiB avg)"),
        (f"bare consumer (baseline), median of {r['runs']}",
         f"{r['bare_consumer_events_per_s']:,.0f} events/s  ({runs('bare_consumer_runs')})"),
        (f"one worker, join + sink, median of {r['runs']}",
         f"{r['worker_events_per_s']:,.0f} events/s  ({runs('worker_runs')})"),
        ("  ratio to baseline", f"{r['worker_vs_bare']:.3f}"),
        (f"one worker, at least once (no transactions), median of {r['runs']}",
         f"{r['at_least_once_events_per_s']:,.0f} events/s  ({runs('at_least_once_runs')})"),
        ("  exactly once / at least once", f"{r['exactly_once_vs_at_least_once']:.3f}"),
        ("  peak RSS (worker + join processes)", f"{r['worker_peak_rss_mib']:.0f} MiB"),
        (f"two workers, median of {r['runs']}",
         f"{r['two_workers_events_per_s']:,.0f} events/s  ({runs('two_workers_runs')})"),
        ("  ratio to one worker", f"{r['two_vs_one']:.2f}"),
        ("freshness p50 / p99", f"{r['steady']['freshness_p50_s']:.2f} s / "
                                f"{r['steady']['freshness_p99_s']:.2f} s "
                                f"at {r['steady']['rate']:.0f} events/s"),
        ("join latency p50 / p99", f"{r['steady']['join_latency_p50_s']:.3f} s / "
                                   f"{r['steady']['join_latency_p99_s']:.3f} s"),
    ]  # fmt: skip
    width = max(len(a) for a, _ in rows)
    print()
    for a, b in rows:
        print(f"  {a:<{width}}  {b}")
    print(f"\n  results: {path}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="rl-export-bench", description=__doc__.split("\n")[0])
    parser.add_argument("--traces", type=int, default=36_000, help="about 2.9 events each")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--out", type=Path, default=Path("var/bench"))
    parser.add_argument("--keep", action="store_true", help="keep the broker and stores")
    parser.add_argument("--steady-rate", type=float, default=500.0, help="events/s")
    parser.add_argument("--runs", type=int, default=3, help="catch-up runs of each kind")
    args = parser.parse_args(argv)
    if args.runs < 1:
        parser.error("--runs must be at least 1")
    asyncio.run(
        run(args.traces, args.seed, args.out, keep=args.keep, steady_rate=args.steady_rate,
            runs=args.runs)
    )  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
