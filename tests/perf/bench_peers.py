"""``make bench-peers``: the worker beside what a user would pick instead, on one backlog.

1. Start the local broker and produce ``make bench``'s small backlog (110,079 events of the
   ``small`` shape over 8 partitions: :func:`tests.perf.bench.produce_backlog`), then warm
   the broker up as ``make bench`` does (:func:`tests.perf.bench.warm_up`).
2. ``--rounds`` rounds (3), each running every system once, in an order rotated each round
   (:func:`tests.perf.bench_ab.rotated`), each run with fresh consumer groups, application
   ids, output topics and state:

   - ``bare``: the bench's bare aiokafka consumer (``max_poll_records=5000``: parse,
     write JSONL), in a process of its own (:mod:`tests.perf.peers.bare`);
   - ``worker``: one ``rl-export worker`` (join processes and sink, exactly-once, RocksDB),
     timed from ready to its last commit in the store (:func:`tests.perf.bench.catch_up`);
   - ``quix-0.1`` and ``quix-5``: Quix Streams merging the three input topics per trace
     in its RocksDB State with a changelog, exactly-once, to an output topic
     (:mod:`tests.perf.peers.quix_join`), at 0.1 s commits (the worker's batches) and at
     Quix's default 5 s;
   - ``kstreams`` and ``kstreams-tuned``: Kafka Streams doing the same (a KTable aggregate,
     RocksDB store and changelog, ``exactly_once_v2``; :mod:`tests.perf.peers.kstreams`),
     with its defaults and tuned as its users would.

   A peer is timed from the record it handled first to the answer that its group has
   committed the end of every input topic (:mod:`tests.perf.peers.process`); then its
   output topic is read and every trace's merged state checked against the backlog
   (:mod:`tests.perf.peers.merge`). A wrong join stops the bench: its time never counts.
3. Per system: events/s (median and range over the rounds), CPU µs per event of its own
   processes and of the broker apart (medians), its highest peak RSS, the share of the
   machine's cores busy meanwhile, and events/s as a share of the worker's; printed as a
   table beside the goals of issue 59 (:func:`goal_lines`) and written as JSON to
   ``var/bench/peers-<time>.json``.

The peers run in processes of their own: Quix Streams in the ``peers`` dependency group's
virtualenv (``--peers-python``; ``make bench-peers`` makes it), Kafka Streams built with Maven
into ``--cache`` on first use.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import statistics
import sys
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import orjson
from aiokafka.admin import AIOKafkaAdminClient, NewTopic

from rl_export.local.broker import LocalKafka
from rl_export.local.synthetic import SHAPES
from rl_export.runtime.net import free_port
from rl_export.runtime.settings import Settings
from tests.harness.reads import read_topics
from tests.perf.bench import (
    DEFAULT_TRACES,
    MIB,
    bench_settings,
    catch_up,
    fresh,
    log,
    own_topics,
    produce_backlog,
    warm_up,
    warm_up_text,
)
from tests.perf.bench_ab import rotated
from tests.perf.peers import kstreams
from tests.perf.peers.merge import check, expected_counts
from tests.perf.peers.process import Committed, input_ends, measure

ROOT = Path(__file__).resolve().parents[2]
SYSTEMS: dict[str, str] = {
    "bare": "bare aiokafka consumer (max_poll_records=5000)",
    "worker": "rl-export worker (join + sink to the store), exactly-once",
    "quix-0.1": "Quix Streams, exactly-once, 0.1 s commits",
    "quix-5": "Quix Streams, exactly-once, its default 5 s commits",
    "kstreams": "Kafka Streams, exactly_once_v2, defaults",
    "kstreams-tuned": "Kafka Streams, exactly_once_v2, tuned",
}
QUIX_COMMIT_S = {"quix-0.1": 0.1, "quix-5": 5.0}
# The goals of issue 59, item 2: against Quix Streams at the worker's commit interval.
GOAL_PEER = "quix-0.1"
GOAL_RATE = 1.2


@dataclass(frozen=True)
class Bench:
    """What every run of a round needs: the backlog's topics, the broker, the peers' builds."""

    settings: Settings
    shape: str  # the input topics' prefix (:func:`tests.perf.bench.own_topics`)
    events: int
    expected: dict[str, dict[str, int]]
    broker_pid: int | None
    work: Path
    peers_python: Path
    kstreams_built: Path | None
    kstreams_heap: str
    cores: int


async def make_topic(bootstrap: str, name: str, partitions: int) -> None:
    """A peer's output topic, stamped with the broker's clock when each record is appended."""
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        config = {"message.timestamp.type": "LogAppendTime"}
        await admin.create_topics([NewTopic(name, partitions, 1, topic_configs=config)])
    finally:
        await admin.close()


async def read_merged(bootstrap: str, topic: str) -> tuple[dict[str, dict[str, Any]], float]:
    """The last merged state a peer wrote for each trace (read committed), and when the last
    of its records was appended (seconds since the epoch; 0 when there is none)."""
    last: dict[str, bytes] = {}
    appended = 0
    for record in await read_topics(bootstrap, [topic]):  # a key's records are in order
        last[record.key.decode()] = record.value
        appended = max(appended, record.timestamp)
    return {trace: orjson.loads(value) for trace, value in last.items()}, appended / 1000


async def run_peer(bench: Bench, key: str, tag: str) -> dict[str, Any]:
    """One run of a Quix Streams or Kafka Streams peer, its output checked."""
    s = bench.settings
    group, output, work = f"peers-{tag}", f"peers-{tag}.merged", bench.work / tag
    await make_topic(s.kafka_bootstrap, output, s.partitions)
    inputs = list(s.input_topics)
    env: Mapping[str, str] | None = None
    if key in QUIX_COMMIT_S:
        cmd = [
            str(bench.peers_python), "-m", "tests.perf.peers.quix_join",
            "--bootstrap", s.kafka_bootstrap, "--group", group, "--inputs", ",".join(inputs),
            "--output", output, "--state-dir", str(work / "state"),
            "--commit-interval", str(QUIX_COMMIT_S[key]),
        ]  # fmt: skip
        env = os.environ | {"PYTHONPATH": str(ROOT)}
    else:
        assert bench.kstreams_built is not None
        tuned = key == "kstreams-tuned"
        cmd = kstreams.command(
            bench.kstreams_built, bootstrap=s.kafka_bootstrap, application_id=group,
            inputs=inputs, output=output, state_dir=work / "state",
            heap=bench.kstreams_heap if tuned else None,
            threads=kstreams.tuned_threads(s.partitions, bench.cores) if tuned else None,
            commit_interval_ms=kstreams.COMMIT_INTERVAL_MS if tuned else None,
        )  # fmt: skip
    ends = await input_ends(s.kafka_bootstrap, inputs, s.partitions)
    async with Committed(s.kafka_bootstrap, group, ends) as committed:

        async def done(_: dict[str, Any]) -> bool:
            return await committed.left() == 0

        result = await measure(
            key, cmd, work, done=done, broker_pid=bench.broker_pid, env=env, cwd=ROOT
        )
    merged, last_output_at = await read_merged(s.kafka_bootstrap, output)
    checked = check(bench.expected, merged)
    if not checked.ok:
        raise RuntimeError(f"{SYSTEMS[key]}: a wrong join, its time does not count: "
                           f"{checked.text()} (logs in {work})")  # fmt: skip
    # Up to the last commit, from the first record; apart, to the last output appended (a
    # long commit interval's last wait is in the first, not in this).
    output_seconds = last_output_at - float(result["said"]["first_record_at"])
    return result | {"check": checked.text(), "output_seconds": output_seconds}


async def run_once(bench: Bench, key: str, round_: int) -> dict[str, Any]:
    """One run of one system; its seconds, CPU seconds (own, broker), busy share, peak RSS."""
    tag = f"{key}-{round_}"
    s = bench.settings
    if key == "worker":
        r = await catch_up(
            fresh(s, tag, bench.work / f"store-{tag}"), 1, bench.work / tag,
            broker_pid=bench.broker_pid,
        )  # fmt: skip
        cpu = r["cpu_seconds"]
        return {
            "seconds": r["seconds"], "start_seconds": r["start_seconds"],
            "cpu_seconds": {"own": cpu["join"] + cpu["worker"], "broker": cpu["broker"],
                            "join": cpu["join"], "worker": cpu["worker"]},
            "machine_busy": r["machine_busy"], "peak_rss_mib": r["peak_rss_mib"][0],
            "peak_rss_parts_mib": r["peak_rss_parts_mib"][0],
        }  # fmt: skip
    if key == "bare":
        cmd = [
            sys.executable, "-m", "tests.perf.peers.bare", "--bootstrap", s.kafka_bootstrap,
            "--prefix", bench.shape, "--total", str(bench.events),
            "--work", str(bench.work / tag), "--run", str(round_),
        ]  # fmt: skip

        async def finished(told: dict[str, Any]) -> bool:
            return "last_record_at" in told

        return await measure(
            key, cmd, bench.work / tag, done=finished, broker_pid=bench.broker_pid, cwd=ROOT
        )
    return await run_peer(bench, key, tag)


def summarise(key: str, runs: list[dict[str, Any]], events: int) -> dict[str, Any]:
    """One system's runs: medians, ranges, the highest peak RSS, what it said last."""
    rates = [events / r["seconds"] for r in runs]
    own = [r["cpu_seconds"]["own"] / events * 1e6 for r in runs]
    broker = [r["cpu_seconds"]["broker"] / events * 1e6 for r in runs]
    said = runs[-1].get("said", {})
    return {
        "system": key,
        "label": SYSTEMS[key],
        "events_per_s": statistics.median(rates),
        "events_per_s_runs": rates,
        "cpu_us_per_event": statistics.median(own),
        "cpu_us_per_event_runs": own,
        "broker_cpu_us_per_event": statistics.median(broker),
        "peak_rss_mib": max(r["peak_rss_mib"] for r in runs),
        "machine_busy": statistics.median(r["machine_busy"] for r in runs),
        "start_seconds": statistics.median(r["start_seconds"] for r in runs),
        "jit_cpu_seconds": statistics.median(r.get("jit_cpu_seconds", 0.0) for r in runs),
        "events_per_s_to_output": (
            statistics.median(events / r["output_seconds"] for r in runs)
            if all(r.get("output_seconds", 0) > 0 for r in runs)
            else None
        ),
        "check": runs[-1].get("check"),
        "said": {k: v for k, v in said.items() if not k.endswith("_at")},
        "runs": runs,
    }


def with_ratios(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each row's events/s as a share of the worker's (None without a worker row)."""
    worker = next((r for r in rows if r["system"] == "worker"), None)
    return [
        r | {"of_worker": r["events_per_s"] / worker["events_per_s"] if worker else None}
        for r in rows
    ]


def label(row: Mapping[str, Any]) -> str:
    """The row's system, with the version, threads and heap it said it ran with."""
    said = row.get("said", {})
    if "quixstreams" in said:
        return str(row["label"]).replace("Quix Streams", f"Quix Streams {said['quixstreams']}")
    if "kafka_streams" in said:
        threads = said["stream_threads"]
        return (
            str(row["label"]).replace("Kafka Streams", f"Kafka Streams {said['kafka_streams']}")
            + f" ({threads} stream thread{'s' if threads != 1 else ''}, heap "
            f"{said['max_heap_mib']:,} MiB, commits {said['commit_interval_ms']} ms)"
        )
    return str(row["label"])


def table(rows: list[dict[str, Any]]) -> list[str]:
    """The results as a Markdown table, the lines of it."""
    lines = [
        "| system | events/s (median, range) | CPU µs/event (+ broker) | peak RSS "
        "| of the worker | cores busy |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for r in rows:
        runs = r["events_per_s_runs"]
        spread = f" ({min(runs):,.0f}-{max(runs):,.0f})" if len(runs) > 1 else ""
        ratio = "-" if r.get("of_worker") is None else f"{r['of_worker']:.2f}"
        lines.append(
            f"| {label(r)} | {r['events_per_s']:,.0f}{spread} "
            f"| {r['cpu_us_per_event']:.0f} (+{r['broker_cpu_us_per_event']:.0f}) "
            f"| {r['peak_rss_mib']:,.0f} MiB | {ratio} | {r['machine_busy'] * 100:.0f} % |"
        )
    return lines


def goal_lines(rows: list[dict[str, Any]]) -> list[str]:
    """Issue 59's goals for the worker, against Quix Streams at the same commit interval."""
    by = {r["system"]: r for r in rows}
    worker, peer = by.get("worker"), by.get(GOAL_PEER)
    if worker is None or peer is None:
        return [f"goals: not judged (they need the worker and {GOAL_PEER} in the run)"]
    cpu_met = worker["cpu_us_per_event"] < peer["cpu_us_per_event"]
    ratio = worker["events_per_s"] / peer["events_per_s"]
    return [
        f"goal: the worker's own CPU per event below Quix Streams' at 0.1 s commits: "
        f"{worker['cpu_us_per_event']:.1f} against {peer['cpu_us_per_event']:.1f} µs: "
        + ("met" if cpu_met else "MISSED"),
        f"goal: the worker's events/s at least {GOAL_RATE} x Quix Streams' at 0.1 s commits: "
        f"{worker['events_per_s']:,.0f} against {peer['events_per_s']:,.0f}, {ratio:.2f} x: "
        + ("met" if ratio >= GOAL_RATE else "MISSED"),
    ]


def detail_lines(rows: list[dict[str, Any]]) -> list[str]:
    """Per system, what the table leaves out: its start-up, its output's check, and its
    events/s to its last output appended (before the commit that made it visible)."""
    lines = []
    for r in rows:
        said = [f"first record {r['start_seconds']:.1f} s after its start (median)"]
        if r.get("jit_cpu_seconds"):
            said.append(f"its JIT compiler {r['jit_cpu_seconds']:.1f} s of CPU over its life")
        if r.get("events_per_s_to_output"):
            said.append(f"{r['events_per_s_to_output']:,.0f} events/s to its last output written")
        if r.get("check"):
            said.append(f"output: {r['check']}")
        lines.append(f"{r['system']}: " + "; ".join(said))
    return lines


def print_result(result: dict[str, Any], path: Path) -> None:
    print(f"\n  {result['shape']} backlog: {result['events']:,} events over "
          f"{result['partitions']} partitions, {result['avg_event_bytes'] / 1024:.2f} KiB avg; "
          f"{result['rounds']} round{'s' if result['rounds'] != 1 else ''}, the order rotated "
          "each round")  # fmt: skip
    print(f"  broker warm-up, untimed: {warm_up_text(result['warm_up_compile_seconds'])}\n")
    for line in table(result["systems"]):
        print(f"  {line}")
    print()
    for line in goal_lines(result["systems"]):
        print(f"  {line}")
    print()
    for line in detail_lines(result["systems"]):
        print(f"  {line}")
    print(
        "\n  events/s: backlog events over the time from the first record handled to the last"
        "\n  commit (the worker: from ready to its last trajectory visible in the store; the bare"
        "\n  consumer: to its last record). CPU: the system's own processes, the broker's apart."
        "\n  Peak RSS: the highest of the rounds (the worker: the sum of its processes' peaks)."
    )
    print(f"\n  results: {path}")


async def run(
    systems: list[str], *, shape_name: str, traces: int, rounds: int, seed: int,
    warm_up_runs: int, peers_python: Path, cache: Path, kstreams_heap: str,
    kstreams_version: str | None, keep: bool = False,
) -> dict[str, Any]:  # fmt: skip
    """Build the peers, start the broker, produce the backlog, run the rounds; the results."""
    shape = SHAPES[shape_name]
    built = None
    if any(k.startswith("kstreams") for k in systems):
        log(f"building the Kafka Streams peer with Maven into {cache} (once)")
        built = kstreams.build(cache, kstreams_version)
    work = Path(tempfile.mkdtemp(prefix="rl-export-bench-peers-"))
    broker = LocalKafka(work / "kafka", free_port(), heap="1g")
    log(f"starting Kafka in {work}")
    broker.start()
    measured: dict[str, list[dict[str, Any]]] = {k: [] for k in systems}
    try:
        settings = own_topics(bench_settings(broker.bootstrap, work), shape.name)
        events, size, _ = await produce_backlog(settings, shape, traces, seed)
        pid = broker.pid
        compiled = await warm_up(settings, work, pid, warm_up_runs) if pid else []
        bench = Bench(
            settings, shape.name, len(events), expected_counts(events), pid, work, peers_python,
            built, kstreams_heap, os.cpu_count() or 1,
        )  # fmt: skip
        for round_ in range(rounds):
            for key in rotated(systems, round_):
                log(f"round {round_ + 1} of {rounds}: {SYSTEMS[key]}")
                measured[key].append(await run_once(bench, key, round_))
    finally:
        broker.stop()
        if keep:
            log(f"kept the broker's data, the stores and every run's logs in {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)
    return {
        "at": datetime.now(UTC).isoformat(),
        "machine": {"cpus": os.cpu_count(), "python": sys.version.split()[0]},
        "shape": shape.name,
        "events": len(events),
        "traces": traces,
        "partitions": settings.partitions,
        "avg_event_bytes": size / len(events),
        "backlog_mib": size / MIB,
        "rounds": rounds,
        "warm_up_compile_seconds": compiled,
        "systems": with_ratios([summarise(k, measured[k], len(events)) for k in systems]),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="rl-export-bench-peers", description=__doc__.split("\n")[0]
    )
    parser.add_argument(
        "--systems", default=",".join(SYSTEMS),
        help=f"which to run, comma-separated, of {', '.join(SYSTEMS)} (default: all)",
    )  # fmt: skip
    parser.add_argument("--shape", choices=sorted(SHAPES), default="small")
    parser.add_argument(
        "--traces", type=int, help="traces (default: the small shape's ~110k events)"
    )
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--warm-up", type=int, default=8, metavar="N",
        help="untimed catch-ups first, until the broker's JIT settles (at most N)",
    )  # fmt: skip
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--out", type=Path, default=Path("var/bench"))
    parser.add_argument("--keep", action="store_true", help="keep the broker, stores and logs")
    parser.add_argument(
        "--peers-python", type=Path, default=ROOT / ".cache/peers/venv/bin/python",
        help="the Python of the peers' virtualenv, with Quix Streams (make bench-peers makes it)",
    )  # fmt: skip
    parser.add_argument(
        "--cache", type=Path, default=ROOT / ".cache/peers",
        help="where the Kafka Streams peer is built",
    )  # fmt: skip
    parser.add_argument(
        "--kstreams-heap", default="512m", help="the tuned Kafka Streams row's -Xms and -Xmx"
    )
    parser.add_argument(
        "--kstreams-version", help="kafka-streams to build with (default: the pom's)"
    )
    args = parser.parse_args(argv)
    systems = [s.strip() for s in args.systems.split(",") if s.strip()]
    unknown = [s for s in systems if s not in SYSTEMS]
    if unknown or not systems:
        parser.error(f"--systems: unknown system {unknown[0] if unknown else '(none)'!r}")
    if len(set(systems)) != len(systems):
        parser.error("--systems: a system named twice")
    if args.rounds < 1:
        parser.error("--rounds must be at least 1")
    if args.warm_up < 0:
        parser.error("--warm-up must be 0 or more")
    if args.traces is not None and args.traces < 1:
        parser.error("--traces must be at least 1")
    if any(s in QUIX_COMMIT_S for s in systems) and not args.peers_python.exists():
        parser.error(
            f"--peers-python: {args.peers_python} does not exist (`make bench-peers` makes the "
            "peers' virtualenv)"
        )
    traces = args.traces or DEFAULT_TRACES.get(args.shape, DEFAULT_TRACES["standard"])
    result = asyncio.run(
        run(systems, shape_name=args.shape, traces=traces,
            rounds=args.rounds, seed=args.seed, warm_up_runs=args.warm_up,
            peers_python=args.peers_python, cache=args.cache.resolve(),
            kstreams_heap=args.kstreams_heap, kstreams_version=args.kstreams_version,
            keep=args.keep)
    )  # fmt: skip
    result["goals"] = goal_lines(result["systems"])
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / f"peers-{datetime.now(UTC):%Y%m%dT%H%M%SZ}.json"
    path.write_text(json.dumps(result, indent=2))
    print_result(result, path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
