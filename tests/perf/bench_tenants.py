"""``make bench-tenants``: what the sink's object writes cost as tenants grow.

The same total traffic, spread over more and more projects: ``--rate`` traces a second (each
a ``trace.completed`` and one ``evaluation.finished``, so twice as many events) for
``--seconds``, round robin over 10, 100 and 1,000 projects (``--projects``). For each, a
fresh worker with the default settings (shard age bound ``RL_EXPORT_SHARD_MAX_AGE_S``, unless
``--shard-max-age`` says otherwise) on topics and a local store of its own, after 20 s of
warm-up traffic that is not counted (the first lines after a start wait for the groups):

1. the objects written while the traffic ran and its last lines committed (every file that
   appeared in the store: data shards, commit entries, index sidecars, erasure entries,
   compactions, the open tables' files), per event and per second, by kind; and those
   written while the traffic ran only (the steady rate, the last held lines left out);
2. freshness: event to visible in a corpus (the sink's histograms: lines of busy chains,
   and lines that waited as a quiet chain's), p50 and p99;
3. a new trace in its project's Label queue: a web service (``rl-export web``) beside the
   worker, asked for the queue of ``--queue-probes`` of the projects every 0.25 s; the time
   from a trace's event sent to the trace in its queue, p50, p99 and the largest;
4. beside each measured figure, what a model of the sink's commits predicts
   (:func:`simulate`: each trajectories partition commits every writer with pending lines
   once its oldest line is the age bound old, a quiet one once it has enough lines or its
   own bound passed; a writer is a (project, corpus) chain, and a commit writes its shard
   and its commit entry, or one object when it holds its lines). The model, checked against
   the measurements, then says what 10,000 projects would cost, and what a layout whose
   objects are per partition rather than per chain would (docs/performance.md, "Cost as
   tenants grow").

Results are printed and written as JSON to ``var/bench/tenants-<time>.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import json
import logging
import math
import os
import random
import shutil
import sys
import tempfile
import time
from collections import Counter
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import orjson
from aiokafka import AIOKafkaProducer

from rl_export.corpora.store import open_store
from rl_export.local.broker import LocalKafka
from rl_export.local.synthetic import SHAPES, trace_events
from rl_export.model.events import FAMILY_OF_TYPE
from rl_export.model.partitioning import kafka_partitioner, partition_for
from rl_export.runtime.childenv import child_env
from rl_export.runtime.net import free_port
from rl_export.runtime.settings import Settings
from rl_export.stream.produce import topic_for
from rl_export.web.tokens import TokenStore
from tests.perf.bench import fresh, histogram, metrics, own_topics, quantile, ready, start_worker
from tests.perf.bench_web import Service

logging.getLogger("aiokafka").setLevel(logging.ERROR)

WARM_UP_S = 20.0
"""Seconds of traffic before each measurement, not counted."""
STEADY_S = 1800.0
"""Seconds of traffic the models run: long enough for quiet chains' waits to be the steady
state, not the start."""
CORPORA = ("traces", "evaluator")
"""The corpora a trace with one evaluation and no label lands in (the ``human`` corpus waits
for a label)."""


def log(message: str) -> None:
    print(f"[bench-tenants {time.strftime('%H:%M:%S')}] {message}", flush=True)


def kind_of(path: Path) -> str:
    """What a file of the local store is, for the counts by kind."""
    parts = path.parts
    if "_table" in parts:
        return "open tables"
    if "_compacted" in parts:
        return "compaction"
    if "_erasures" in parts:
        return "erasure entries"
    if "_manifest" in parts:
        return "commit entries"
    if path.name.endswith(".parquet"):
        return "index sidecars"
    if path.name.endswith((".jsonl", ".jsonl.gz")):
        return "data shards"
    return "other"


def settle_s(settings: Settings) -> float:
    """How long after traffic stops its last lines take to commit."""
    return max(settings.shard_max_age_s, settings.corpus_max_age_s) + 5


def census(store: Path) -> Counter[str]:
    """Files in the store by kind (temporary files of writes under way left out)."""
    if not store.exists():
        return Counter()
    return Counter(kind_of(p) for p in store.rglob("*")
                   if p.is_file() and not p.name.startswith(".tmp"))  # fmt: skip


class Probe:
    """The Label queues of some projects, asked every ``every_s``: when each trace first
    showed in its project's queue (``seen``), against when its first event was sent (``sent``,
    filled by :func:`traffic`)."""

    def __init__(self, base: str, tokens: dict[tuple[str, str], str], every_s: float = 0.25
                 ) -> None:  # fmt: skip
        self.base = base
        self.tokens = tokens
        self.every_s = every_s
        self.sent: dict[str, float] = {}
        self.seen: dict[str, float] = {}
        self.errors = 0

    async def run(self, stop: asyncio.Event) -> None:
        import httpx

        async with httpx.AsyncClient(base_url=self.base, timeout=10) as client:
            while not stop.is_set():
                started = time.monotonic()
                await asyncio.gather(
                    *(self._ask(client, org, project, token)
                      for (org, project), token in self.tokens.items())
                )  # fmt: skip
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), max(0.0, self.every_s - (
                        time.monotonic() - started)))  # fmt: skip

    async def _ask(self, client: Any, org: str, project: str, token: str) -> None:
        try:
            response = await client.get(f"/api/v1/{org}/{project}/queue", params={"limit": 100},
                                        headers={"Authorization": f"Bearer {token}"})  # fmt: skip
            items = response.json()["items"] if response.status_code == 200 else None
        except Exception:  # a slow answer on a busy machine: counted, asked again
            items = None
        if items is None:
            self.errors += 1
            return
        now = time.monotonic()
        for item in items:
            self.seen.setdefault(item["trace_id"], now)

    def latencies(self) -> list[float]:
        return sorted(self.seen[t] - at for t, at in self.sent.items() if t in self.seen)


def nearest_rank(samples: list[float], q: float) -> float:
    if not samples:
        return float("nan")
    return samples[min(len(samples) - 1, max(0, math.ceil(q * len(samples)) - 1))]


def shape_for(projects: int) -> Any:
    """The small shape over ``projects`` projects of three orgs; one evaluation, no label."""
    names = tuple((f"org-{n % 3}", f"project-{n:05d}") for n in range(projects))
    return dataclasses.replace(SHAPES["small"], projects=names, evaluations=(1,), labels=(0,))


async def traffic(
    settings: Settings, projects: int, rate: float, seconds: float, *, first: int = 0,
    probe: Probe | None = None,
) -> int:  # fmt: skip
    """``rate`` traces a second for ``seconds``, round robin over the projects (trace ids from
    ``first`` on); the events sent. The traces of the probe's projects are noted as sent."""
    shape, rng = shape_for(projects), random.Random(45)
    producer = AIOKafkaProducer(
        bootstrap_servers=settings.kafka_bootstrap, linger_ms=5,
        partitioner=kafka_partitioner(settings.partitioner),
    )  # fmt: skip
    await producer.start()
    sent, index, started = 0, first, time.perf_counter()
    try:
        while time.perf_counter() - started < seconds:
            completed = datetime.now(UTC) - timedelta(hours=1)
            for event in trace_events(rng, index, completed, shape):
                topic = topic_for(settings, FAMILY_OF_TYPE[event["event_type"]])
                await producer.send(topic, orjson.dumps(event), key=event["trace_id"].encode())
                sent += 1
                if probe is not None and (event["org"], event["project"]) in probe.tokens:
                    probe.sent.setdefault(event["trace_id"], time.monotonic())
            index += 1
            ahead = (index - first) / rate - (time.perf_counter() - started)
            if ahead > 0:
                await asyncio.sleep(ahead)
        await producer.flush()
    finally:
        await producer.stop()
    return sent


def probed(projects: int, count: int) -> list[tuple[str, str]]:
    """``count`` of the projects, spread over them (the queues the probe asks for)."""
    names = shape_for(projects).projects
    step = max(1, len(names) // max(count, 1))
    return list(names[::step][:count])


async def probe_tokens(settings: Settings, projects: list[tuple[str, str]]
                       ) -> dict[tuple[str, str], str]:  # fmt: skip
    """A label token of each probed project, in the store (as ``rl-export tokens create``)."""
    store = open_store(settings.store_url)
    try:
        tokens = TokenStore(store)
        now = datetime.now(UTC)
        return {(org, project): (await tokens.create(org, project, "bench", ("label",), now))[1]
                for org, project in projects}  # fmt: skip
    finally:
        await store.close()


async def measure(
    base: Settings, work: Path, projects: int, rate: float, seconds: float, *, probes: int = 0
) -> dict[str, Any]:
    tag = f"tenants-{projects}"
    settings = own_topics(fresh(base, tag, work / tag / "store"), tag)
    store = Path(settings.store_url)
    proc, port = start_worker(settings, work / tag / "var")
    web = probe = None
    stop_probe = asyncio.Event()
    try:
        while not ready(port):
            if proc.poll() is not None:
                raise RuntimeError(f"the worker stopped: see {work / tag / 'var' / 'worker.log'}")
            await asyncio.sleep(0.5)
        if probes:
            web_port = free_port()
            env = child_env(settings.model_copy(update={
                "data_dir": work / tag / "web", "web_port": web_port,
                "web_metrics_port": free_port()}), os.environ)  # fmt: skip
            web = Service("rl-export web", ["web"], work / tag / "web.log", env)
            web.start(f"http://127.0.0.1:{web_port}/readyz")
            probe = Probe(f"http://127.0.0.1:{web_port}",
                          await probe_tokens(settings, probed(projects, probes)))  # fmt: skip
        probing = asyncio.create_task(probe.run(stop_probe)) if probe else None
        # A warm-up, not counted: the groups settle and the chains are made (the first lines
        # after a start wait for the sink's assignment, up to 20 s here).
        await traffic(settings, projects, rate, WARM_UP_S, first=10_000_000)
        await asyncio.sleep(settle_s(settings))
        before = await asyncio.to_thread(census, store)
        text = metrics(port)
        fresh_before = histogram(text, "rl_export_sink_freshness_seconds")
        quiet_before = histogram(text, "rl_export_sink_quiet_freshness_seconds")
        log(
            f"{projects} projects: {rate:g} traces/s for {seconds:g} s"
            + (f", the Label queues of {probes} of them asked every 0.25 s" if probe else "")
        )
        started = time.monotonic()
        events = await traffic(settings, projects, rate, seconds, probe=probe)
        during = await asyncio.to_thread(census, store) - before  # the steady rate
        await asyncio.sleep(settle_s(settings))  # the last shards commit, held ones too
        elapsed = time.monotonic() - started
        text = metrics(port)
        fresh_after = histogram(text, "rl_export_sink_freshness_seconds")
        quiet_after = histogram(text, "rl_export_sink_quiet_freshness_seconds")
        written = await asyncio.to_thread(census, store) - before
        stop_probe.set()
        if probing is not None:
            await probing
    finally:
        stop_probe.set()
        if web is not None:
            web.stop()
        proc.terminate()
        proc.wait(60)
    total = sum(written.values())
    sink = total - written.get("compaction", 0) - written.get("open tables", 0)
    waits = probe.latencies() if probe else []
    return {
        "projects": projects,
        "events": events,
        "traces_per_s": rate,
        "seconds": seconds,
        "objects": total,
        "objects_by_kind": dict(written),
        "objects_per_event": total / events,
        "sink_objects_per_event": sink / events,
        "objects_per_event_while_running": sum(during.values()) / events,
        "objects_per_s": total / elapsed,
        "freshness_p50_s": quantile(fresh_before, fresh_after, 0.5),
        "freshness_p99_s": quantile(fresh_before, fresh_after, 0.99),
        "quiet_freshness_p50_s": quantile(quiet_before, quiet_after, 0.5),
        "quiet_freshness_p99_s": quantile(quiet_before, quiet_after, 0.99),
        "queue": None
        if probe is None
        else {
            "projects": probes,
            "traces": len(probe.sent),
            "seen": len(waits),
            "p50_s": nearest_rank(waits, 0.5),
            "p99_s": nearest_rank(waits, 0.99),
            "max_s": waits[-1] if waits else float("nan"),
            "errors": probe.errors,
        },
        "model": simulate(
            projects,
            rate,
            seconds,
            settings.shard_max_age_s,
            settings.partitions,
            quiet_age=settings.corpus_max_age_s,
            quiet_records=settings.quiet_chain_records,
            inline=settings.shard_inline_max_bytes > 0,
        ),
    }


def simulate(
    projects: int, rate: float, seconds: float, age: float, partitions: int, *,
    quiet_age: float = 0.0, quiet_records: int = 8, per_partition: bool = False,
    inline: bool = False,
) -> dict[str, float]:  # fmt: skip
    """The sink's commits, modelled: traces arrive ``rate`` a second, round robin over
    ``projects``, each into a trajectories partition by its id (as the worker places them),
    each a line in every corpus of :data:`CORPORA`. A partition commits once its oldest
    pending line is ``age`` seconds old, and each (project, corpus) writer with lines
    pending in it writes its shard and its commit entry; with ``quiet_age``, a writer
    holding fewer than ``quiet_records`` lines waits until it has that many or its oldest
    line is ``quiet_age`` old. With ``per_partition``, a partition's commit writes two
    objects whatever the writers: one shard holding every tenant's lines, one entry
    indexing them. With ``inline``, a chain's commit is one object (it holds its lines: a
    quiet chain's few lines always fit). Returns objects per event and per second, and how
    long lines waited."""
    interval = 1.0 / rate
    count = int(seconds * rate)
    pending: list[dict[tuple[int, str], list[float]]] = [{} for _ in range(partitions)]
    due = [math.inf] * partitions
    objects, waits = 0, list[float]()

    def deadline(times: list[float]) -> float:
        quiet = quiet_age > 0 and len(times) < quiet_records
        return times[0] + (quiet_age if quiet else age)

    def flush(partition: int, now: float) -> None:
        nonlocal objects
        kept, committed = {}, 0
        for writer, times in pending[partition].items():
            if quiet_age > 0 and len(times) < quiet_records and deadline(times) > now:
                kept[writer] = times
                continue
            committed += 1
            waits.extend(now - t for t in times)
        objects += (1 if inline else 2) * (min(committed, 1) if per_partition else committed)
        pending[partition] = kept
        due[partition] = min((deadline(t) for t in kept.values()), default=math.inf)

    for n in range(count):
        now = n * interval
        for partition in range(partitions):
            if due[partition] <= now:
                flush(partition, now)
        partition = partition_for(f"tr-{n:08d}".encode(), partitions, "murmur2")
        for corpus in CORPORA:
            times = pending[partition].setdefault((n % projects, corpus), [])
            times.append(now)
            due[partition] = min(due[partition], times[0] + age, deadline(times))
    while any(pending):  # the traffic stops: what is left commits at its deadlines
        partition = min(range(partitions), key=due.__getitem__)
        flush(partition, due[partition])
    waits.sort()
    return {
        "objects": objects,
        "objects_per_event": objects / (2 * count),
        "objects_per_s": objects / seconds,
        "wait_p50_s": waits[len(waits) // 2],
        "wait_p99_s": waits[int(len(waits) * 0.99)],
    }


async def run(args: argparse.Namespace) -> dict[str, Any]:
    work = Path(tempfile.mkdtemp(prefix="rl-export-tenants-"))
    broker = LocalKafka(work / "kafka", free_port(), heap="1g")
    log(f"starting Kafka in {work}")
    broker.start()
    try:
        base = Settings(
            kafka_bootstrap=broker.bootstrap, partitions=8, state_store="rocksdb://",
            data_dir=work / "var", store_url=str(work / "store"),
        )  # fmt: skip
        if args.shard_max_age is not None:
            base = base.model_copy(update={"shard_max_age_s": args.shard_max_age})
        if args.corpus_max_age is not None:
            base = base.model_copy(update={"corpus_max_age_s": args.corpus_max_age})
        if args.compaction_min_commits is not None:
            base = base.model_copy(update={"compaction_min_commits": args.compaction_min_commits})
        if args.inline_max_bytes is not None:
            base = base.model_copy(update={"shard_inline_max_bytes": args.inline_max_bytes})
        measured = [await measure(base, work, n, args.rate, args.seconds,
                                  probes=args.queue_probes) for n in args.projects]  # fmt: skip
    finally:
        broker.stop()
        shutil.rmtree(work, ignore_errors=True)
    age, partitions = base.shard_max_age_s, base.partitions
    scales = sorted({*args.projects, 10_000})
    hold = base.corpus_max_age_s or 120.0
    layouts: dict[str, dict[str, Any]] = {
        "per chain, no wait, a data object and a commit each": {},
        f"per chain, quiet wait {hold:g} s, a data object and a commit each": {"quiet_age": hold},
        f"per chain, quiet wait {hold:g} s, small commits hold their lines (the defaults)": {
            "quiet_age": hold, "inline": True},
        "per partition": {"per_partition": True},
    }  # fmt: skip
    return {
        "at": datetime.now(UTC).isoformat(),
        "cpus": os.cpu_count(),
        "shard_max_age_s": age,
        "corpus_max_age_s": base.corpus_max_age_s,
        "compaction_min_commits": base.compaction_min_commits,
        "compaction_interval_s": base.compaction_interval_s,
        "shard_inline_max_bytes": base.shard_inline_max_bytes,
        "measured": measured,
        "models": {
            layout: [
                {"projects": n, **simulate(n, args.rate, STEADY_S, age, partitions, **how)}
                for n in scales
            ]
            for layout, how in layouts.items()
        },
    }


def print_table(result: dict[str, Any], path: Path) -> None:
    hold = result["corpus_max_age_s"]
    print()
    print(f"object writes as tenants grow: shard age bound {result['shard_max_age_s']:g} s, "
          f"quiet chains {f'wait up to {hold:g} s' if hold else 'do not wait'}; the same "
          f"total rate over more projects (goal: at most 1 object write a event)")  # fmt: skip
    print(
        f"compaction every {result.get('compaction_interval_s', 300):g} s of a tail of at least "
        f"{result['compaction_min_commits']} commit(s); commits hold shards of up to "
        f"{result.get('shard_inline_max_bytes', 0):,} bytes; the model counts the sink's objects"
    )
    print(f"{'projects':>9} {'events':>7} {'objects':>8} {'a event':>8} {'sink':>6} {'model':>6} "
          f"{'a second':>8} {'freshness p50 / p99':>20}  by kind")  # fmt: skip
    for m in result["measured"]:
        kinds = ", ".join(f"{k} {v:,}" for k, v in sorted(m["objects_by_kind"].items()))
        print(f"{m['projects']:>9,} {m['events']:>7,} {m['objects']:>8,} "
              f"{m['objects_per_event']:>8.2f} {m['sink_objects_per_event']:>6.2f} "
              f"{m['model']['objects_per_event']:>6.2f} "
              f"{m['objects_per_s']:>8.1f} {m['freshness_p50_s']:>10.2f} s / "
              f"{m['freshness_p99_s']:>5.2f} s  {kinds}")  # fmt: skip
        print(f"{'':>9} while the traffic ran: {m['objects_per_event_while_running']:.2f} a "
              f"event; lines that waited (quiet chains): p50 {m['quiet_freshness_p50_s']:.1f} s, "
              f"p99 {m['quiet_freshness_p99_s']:.1f} s")  # fmt: skip
        queue = m.get("queue")
        if queue:
            print(f"{'':>9} a new trace in its Label queue ({queue['seen']} of "
                  f"{queue['traces']} traces of {queue['projects']} projects): p50 "
                  f"{queue['p50_s']:.2f} s, p99 {queue['p99_s']:.2f} s, max "
                  f"{queue['max_s']:.2f} s (goal: p99 at most 2 s)")  # fmt: skip
    print(
        "modelled, the same traffic (objects a event, a second; how long a line waits, p50 / p99):"
    )
    for layout, rows in result["models"].items():
        print(f"  {layout}:")
        for r in rows:
            print(f"    {r['projects']:>6,} projects: {r['objects_per_event']:5.2f} a event, "
                  f"{r['objects_per_s']:6.1f} a second; {r['wait_p50_s']:6.1f} s / "
                  f"{r['wait_p99_s']:6.1f} s")  # fmt: skip
    print(f"written to {path}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bench_tenants", description=__doc__.split("\n")[0])
    parser.add_argument("--projects", type=int, nargs="+", default=[10, 200, 1000])
    parser.add_argument("--rate", type=float, default=20.0, help="traces a second, in total")
    parser.add_argument("--seconds", type=float, default=120.0, help="of traffic per scale")
    parser.add_argument("--shard-max-age", type=float, help="the sink's age bound (s)")
    parser.add_argument(
        "--corpus-max-age", type=float,
        help="how long quiet chains may wait (s; RL_EXPORT_CORPUS_MAX_AGE_S, default 120)",
    )  # fmt: skip
    parser.add_argument(
        "--compaction-min-commits", type=int,
        help="commits a corpus's tail needs before it is compacted (default 64)",
    )  # fmt: skip
    parser.add_argument(
        "--inline-max-bytes", type=int,
        help="largest shard a commit holds itself (RL_EXPORT_SHARD_INLINE_MAX_BYTES; 0: off)",
    )  # fmt: skip
    parser.add_argument(
        "--queue-probes", type=int, default=10,
        help="projects whose Label queue a web service is asked for (0: no web service)",
    )  # fmt: skip
    parser.add_argument("--out", type=Path, default=Path("var/bench"))
    args = parser.parse_args(argv)
    if args.rate <= 0 or args.seconds <= 0 or min(args.projects) < 1 or args.queue_probes < 0:
        parser.error("--rate, --seconds and --projects must be positive")
    result = asyncio.run(run(args))
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / f"tenants-{datetime.now(UTC):%Y%m%dT%H%M%SZ}.json"
    path.write_text(json.dumps(result, indent=1))
    print_table(result, path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
