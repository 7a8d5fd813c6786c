"""``make bench-restart``: how fast a worker restarts on a million records and traces.

1. Build, once, and keep under ``--cache`` (``var/bench-restart/<traces>``): a broker's
   data, a worker's data dir (its RocksDB table) and a local store, through the real code
   paths. Events of ``--traces`` small traces (a trace, an evaluation, a label for some)
   are produced to the broker; one worker (join processes and sink) catches up until both
   its groups have committed the end of every topic; it stops; ``rl-export shards compact``
   compacts its corpora. A table of that many traces and corpora of that many records.
2. Measure ``--runs`` times: start the broker on the kept data, then a worker on the kept
   data dir and store, and at the same moment produce a few new events for traces it has.
   From the worker's launch: restart-to-ready (``/readyz`` answers 200), the join's first
   commit (its group's offsets move past the new events) and the sink's first commit
   (a new commit object in the store). ``/healthz`` is asked every 100 ms all along: its
   slowest answer says whether the worker's event loop stayed responsive.
3. Print the figures and write them as JSON to ``var/bench/restart-<time>.json``.

Only the broker, the worker's HTTP pages, its log and the store's files are looked at, so
the same script measures any version of the worker.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import time
import urllib.error
import urllib.request
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import orjson
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.errors import KafkaError

from rl_export.local.broker import LocalKafka
from rl_export.model.partitioning import kafka_partitioner
from rl_export.runtime.childenv import child_env
from rl_export.runtime.net import free_port
from rl_export.runtime.settings import Settings
from rl_export.stream.topics import ensure_service_topics

BROKER_PORT_FILE = "broker.port"


def log(message: str) -> None:
    print(f"[bench-restart {time.strftime('%H:%M:%S')}] {message}", flush=True)


# --- the data ---------------------------------------------------------------------------------


def small_trace(rng: random.Random, index: int, at: datetime) -> list[dict[str, Any]]:
    """A trace, its evaluation, and for one in three a label: about 1 KiB of record."""
    base: dict[str, Any] = {"org": "acme", "project": "restart", "trace_id": f"rt-{index:08d}"}
    stamp = at.isoformat().replace("+00:00", "Z")
    events = [
        base | {"event_id": f"rt-{index}-t", "event_type": "trace.completed",
                "occurred_at": stamp, "agent_version": "v4", "scenario": "restart",
                "messages": [{"role": "user", "content": f"question {index}"},
                             {"role": "assistant", "content": f"answer {rng.random():.6f}"}]},
        base | {"event_id": f"rt-{index}-e", "event_type": "evaluation.finished",
                "occurred_at": stamp, "evaluation_id": f"ev-{index}",
                "results": [{"evaluator": "judge", "score": round(rng.random(), 3),
                             "passed": rng.random() < 0.6, "reasoning": "ok"}],
                "report": {"outcomes": [], "classifications": []}},
    ]  # fmt: skip
    if index % 3 == 0:
        events.append(
            base | {"event_id": f"rt-{index}-l", "event_type": "label.submitted",
                    "occurred_at": stamp, "labeler": "ana",
                    "rubric": {"correctness": rng.randint(1, 5), "helpfulness": 4,
                               "efficiency": 3, "safety": 5}}
        )  # fmt: skip
    return events


def topic_of(settings: Settings, event_type: str) -> str:
    return {"trace": settings.topic_traces, "evaluation": settings.topic_evaluations,
            "label": settings.topic_labels}[event_type.split(".", 1)[0]]  # fmt: skip


async def produce(settings: Settings, events: Any) -> int:
    producer = AIOKafkaProducer(
        bootstrap_servers=settings.kafka_bootstrap, linger_ms=20, max_batch_size=512 * 1024,
        partitioner=kafka_partitioner(settings.partitioner),
    )  # fmt: skip
    await producer.start()
    count = 0
    try:
        pending = []
        for event in events:
            pending.append(await producer.send(
                topic_of(settings, event["event_type"]), orjson.dumps(event),
                key=event["trace_id"].encode(),
            ))  # fmt: skip
            count += 1
            if len(pending) >= 20_000:
                await asyncio.gather(*pending)
                pending.clear()
        await asyncio.gather(*pending)
    finally:
        await producer.stop()
    return count


async def offsets(settings: Settings, group: str, topics: list[str]) -> dict[Any, int]:
    admin = AIOKafkaAdminClient(bootstrap_servers=settings.kafka_bootstrap)
    await admin.start()
    try:
        committed = await admin.list_consumer_group_offsets(group)
    except KafkaError:
        return {}
    finally:
        await admin.close()
    return {tp: o.offset for tp, o in committed.items() if tp.topic in topics}


async def ends(settings: Settings, topics: list[str]) -> dict[Any, int]:
    consumer = AIOKafkaConsumer(bootstrap_servers=settings.kafka_bootstrap)
    await consumer.start()
    try:
        tps = [TopicPartition(t, p) for t in topics for p in range(settings.partitions)]
        return dict(await consumer.end_offsets(tps))
    finally:
        await consumer.stop()


async def lag(settings: Settings, group: str, topics: list[str]) -> int:
    """Committed records the group has not committed past.

    Read, not computed from end offsets: these count transaction markers too.
    """
    done = await offsets(settings, group, topics)
    consumer = AIOKafkaConsumer(
        bootstrap_servers=settings.kafka_bootstrap, isolation_level="read_committed",
        enable_auto_commit=False,
    )  # fmt: skip
    await consumer.start()
    left = 0
    try:
        tps = [TopicPartition(t, p) for t in topics for p in range(settings.partitions)]
        consumer.assign(tps)
        end = await consumer.end_offsets(tps)
        todo = {tp for tp in tps if done.get(tp, 0) < end[tp]}
        for tp in todo:
            consumer.seek(tp, done.get(tp, 0))
        while todo:
            fetched = await consumer.getmany(*todo, timeout_ms=1000, max_records=50_000)
            left += sum(len(records) for records in fetched.values())
            for tp in list(todo):
                if await consumer.position(tp) >= end[tp]:
                    todo.discard(tp)
            if left > 10_000:  # far from done: no need to count it all
                break
    finally:
        await consumer.stop()
    return left


# --- processes --------------------------------------------------------------------------------


def start_worker(
    settings: Settings, data: Path, port: int, **extra: str
) -> subprocess.Popen[bytes]:
    env = child_env(settings, os.environ, RL_EXPORT_WORKER_WEB_PORT=str(port),
                    RL_EXPORT_DATA_DIR=str(data), RL_EXPORT_LOG_LEVEL="info", **extra)  # fmt: skip
    log_file = open(data / "worker.log", "ab")  # noqa: SIM115 - the child keeps it
    try:
        return subprocess.Popen([sys.executable, "-m", "rl_export.cli", "worker"], env=env,
                                stdout=log_file, stderr=subprocess.STDOUT)  # fmt: skip
    finally:
        log_file.close()


def get(port: int, path: str, timeout: float) -> int:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=timeout) as r:
            return int(r.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)
    except OSError:
        return 0


def stop(proc: subprocess.Popen[bytes]) -> None:
    proc.terminate()
    try:
        proc.wait(120)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def settings_for(cache: Path, port: int) -> Settings:
    return Settings(
        kafka_bootstrap=f"127.0.0.1:{port}", partitions=8, state_store="rocksdb://",
        data_dir=cache / "var", store_url=str(cache / "store"), shard_max_age_s=1.0,
        shard_max_records=10_000, compaction_interval_s=10**9, app_id="restart-join",
        sink_group="restart-sink",
    )  # fmt: skip


def broker_for(cache: Path) -> LocalKafka:
    """The kept broker, on the port its data was written with (the port is in its log)."""
    port_file = cache / BROKER_PORT_FILE
    if not port_file.exists():
        port_file.parent.mkdir(parents=True, exist_ok=True)
        port_file.write_text(str(free_port()))
    return LocalKafka(cache / "kafka", int(port_file.read_text()), heap="1g")


async def build(cache: Path, traces: int, seed: int) -> None:
    """Step 1: the kept data, made by a real worker."""
    if (cache / "built").exists():
        log(f"using the data built in {cache}")
        return
    shutil.rmtree(cache, ignore_errors=True)
    broker = broker_for(cache)
    broker.start()
    try:
        settings = settings_for(cache, broker.port)
        (cache / "var").mkdir(parents=True, exist_ok=True)
        await ensure_service_topics(settings)
        rng = random.Random(seed)
        start = datetime(2026, 1, 1, tzinfo=UTC)
        events = (e for i in range(traces)
                  for e in small_trace(rng, i, start + timedelta(seconds=i)))  # fmt: skip
        started = time.monotonic()
        produced = await produce(settings, events)
        log(f"produced {produced:,} events of {traces:,} traces in "
            f"{time.monotonic() - started:.0f}s")  # fmt: skip
        proc = start_worker(settings, cache / "var", free_port())
        started = time.monotonic()
        try:
            while True:
                await asyncio.sleep(10)
                if proc.poll() is not None:
                    raise RuntimeError(f"the worker exited with {proc.returncode}")
                join = await lag(settings, settings.app_id, list(settings.input_topics))
                sink = await lag(settings, settings.sink_group, [settings.topic_trajectories])
                log(f"catching up: join {join:,} left, sink {sink:,} left "
                    f"({time.monotonic() - started:.0f}s)")  # fmt: skip
                if join == 0 and sink == 0:
                    break
        finally:
            stop(proc)
        log("compacting the corpora (rl-export shards compact)")
        env = child_env(settings, os.environ)
        subprocess.run([sys.executable, "-m", "rl_export.cli", "shards", "compact", "--store",
                        settings.store_url], env=env, check=True)  # fmt: skip
    finally:
        broker.stop()
    (cache / "built").write_text(json.dumps({"traces": traces, "seed": seed}))


# --- the measurement --------------------------------------------------------------------------


async def measure(cache: Path, new_events: int, limit_s: float) -> dict[str, Any]:
    """Step 2, once: start the broker, then a worker; time it."""
    broker = broker_for(cache)
    broker.start()
    try:
        settings = settings_for(cache, broker.port)
        inputs = list(settings.input_topics)
        before_join = await ends(settings, inputs)
        commits_before = set(manifests(cache))
        rng = random.Random()
        traces = json.loads((cache / "built").read_text())["traces"]
        fresh = [
            {"event_id": f"restart-{time.time_ns()}-{n}", "event_type": "label.skipped",
             "occurred_at": "2026-06-01T00:00:00Z", "org": "acme", "project": "restart",
             "trace_id": f"rt-{rng.randrange(traces):08d}", "labeler": "restart-bench"}
            for n in range(new_events)
        ]  # fmt: skip
        port = free_port()
        launched = time.monotonic()
        proc = start_worker(settings, cache / "var", port)
        await produce(settings, fresh)
        figures: dict[str, Any] = {"healthz_max_s": 0.0}
        healthz: list[float] = []
        try:
            while time.monotonic() - launched < limit_s:
                if proc.poll() is not None:  # a finding, not a failure of the benchmark
                    figures["exited_s"] = time.monotonic() - launched
                    figures["exit_code"] = proc.returncode
                    log(f"  the worker exited with {proc.returncode}")
                    break
                asked = time.monotonic()
                answer = await asyncio.to_thread(get, port, "/healthz", 30.0)
                took = time.monotonic() - asked
                if answer == 200:
                    healthz.append(took)
                now = time.monotonic() - launched
                if "ready_s" not in figures and (
                    await asyncio.to_thread(get, port, "/readyz", 5) == 200
                ):
                    figures["ready_s"] = now
                if "join_commit_s" not in figures:
                    done = await offsets(settings, settings.app_id, inputs)
                    if any(done.get(tp, 0) > end for tp, end in before_join.items()):
                        figures["join_commit_s"] = now
                if "sink_commit_s" not in figures and any(
                    p not in commits_before for p in manifests(cache)
                ):
                    figures["sink_commit_s"] = now
                if {"ready_s", "join_commit_s", "sink_commit_s"} <= figures.keys():
                    break
                await asyncio.sleep(max(0.0, 0.1 - (time.monotonic() - asked)))
        finally:
            stop(proc)
        figures["healthz_max_s"] = max(healthz, default=float("nan"))
        figures["healthz_answers"] = len(healthz)
        return figures
    finally:
        broker.stop()


def manifests(cache: Path) -> list[Path]:
    """Every commit object of the kept store (``<org>/<project>/<corpus>/_manifest/...``)."""
    return list((cache / "store").glob("*/*/*/_manifest/*/*.json"))


async def run(args: argparse.Namespace) -> dict[str, Any]:
    cache = args.cache / str(args.traces)
    await build(cache, args.traces, args.seed)
    runs = []
    for n in range(args.runs):
        log(f"restart {n + 1} of {args.runs}")
        figures = await measure(cache, args.new_events, args.limit)
        log("  " + ", ".join(f"{k} {v:.2f}" for k, v in figures.items()))
        runs.append(figures)
    keys = ("ready_s", "join_commit_s", "sink_commit_s", "healthz_max_s")
    result = {
        "at": datetime.now(UTC).isoformat(),
        "traces": args.traces,
        "runs": runs,
        "median": {k: statistics.median(r.get(k, float("inf")) for r in runs) for k in keys},
        "machine": {"cpus": os.cpu_count(), "python": sys.version.split()[0]},
    }
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / f"restart-{datetime.now(UTC):%Y%m%dT%H%M%SZ}.json"
    path.write_text(json.dumps(result, indent=2))
    print()
    for key in keys:
        values = " / ".join(f"{r.get(key, float('inf')):.2f}" for r in runs)
        print(f"  {key:<16} median {result['median'][key]:.2f} s  ({values})")
    print(f"\n  results: {path}")
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="rl-export-bench-restart",
                                     description=__doc__.split("\n")[0])  # fmt: skip
    parser.add_argument("--traces", type=int, default=1_000_000)
    parser.add_argument("--seed", type=int, default=11)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--new-events", type=int, default=200)
    parser.add_argument("--limit", type=float, default=900.0, help="give up after (s)")
    parser.add_argument("--cache", type=Path, default=Path("var/bench-restart"))
    parser.add_argument("--out", type=Path, default=Path("var/bench"))
    asyncio.run(run(parser.parse_args(argv)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
