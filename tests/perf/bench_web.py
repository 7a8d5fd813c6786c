"""``make bench-web`` (and ``make bench``): the web service's index over 1,000,000 records.

1. Build the corpora once, the real way, and cache them under ``var/bench/web-corpus-...``
   (``done.json`` marks them complete): synthetic traces that are all evaluated (one in a
   hundred deleted) go through ``replay`` (the join and the sink) into the ``traces`` and
   ``evaluator`` corpora, in chunks of 50,000 traces, each chunk a replay run with chains of
   its own, run in two processes side by side; after the first two chunks the corpora are
   compacted, so the index reads a compaction and a tail of commits, as in production.
2. Start new instances told to warm the project (``RL_EXPORT_WEB_WARM``), ``--warm-starts``
   of them (10), each timed from its process's start to its ``/readyz`` 200 with both
   corpora indexed (the goal: under 10 s, every time). Then ``rl-export web`` on that store
   with an empty index: create a token, ask for the stats of each corpus and time the
   index's catch-up (records/s, from its metrics).
3. Once indexed (the time from the process's start to both corpora indexed is the cold
   start): latency of ``GET stats`` (without and with filters), ``GET records`` (the
   preview), ``GET queue``, ``GET labeling``, ``GET agreement`` (a report kept since the
   last one, and on filters no request used before: computed each time), and ``POST
   queue/claim`` with ``DELETE queue/claims/{id}`` by 20 labelers at once (a random pause
   of mean 5 s before each claim, then 0.5 s, then none: saturation, whose claims a second
   are the instance's throughput), p50/p99 over many requests, from a client on the same
   machine (so HTTP and JSON are included), each against its goal. Steps 2 and 3 run with a
   broker of their own, as in production (``--no-broker``: without), so each claim's news
   goes out on the claims topic before its answer, and the entries sent are counted.
4. Label submission to visible in the stats: a broker, a worker and a web service on a small
   corpus of their own; a label is posted through the API and ``GET stats`` is polled until
   ``human_labeled`` counts it.
5. The agreement report's computation over 1,000,000 traces, 200,000 multi-labeled
   (:mod:`tests.perf.bench_agreement`, without its baseline: ``make bench-agreement``).

Results are printed and written as JSON to ``var/bench/web-<time>.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import http.client
import json
import math
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ProcessPoolExecutor
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

from rl_export.corpora.compaction import compact
from rl_export.corpora.layout import CorpusRef
from rl_export.corpora.replay import replay
from rl_export.corpora.store import LocalStore
from rl_export.formats.specs import CorpusSpec
from rl_export.labeling.claims import PREFIX as CLAIMS_PREFIX
from rl_export.local.broker import LocalKafka
from rl_export.local.process import ManagedProcess
from rl_export.local.synthetic import scored_event_lines, scored_trace_events, traces_for
from rl_export.model.codec import dumps
from rl_export.model.events import FAMILY_OF_TYPE
from rl_export.runtime.childenv import child_env
from rl_export.runtime.net import free_port
from rl_export.runtime.settings import Settings, load_settings
from rl_export.stream.produce import make_producer, topic_for
from rl_export.stream.topics import ensure_service_topics
from tests.harness.reads import read_topics
from tests.harness.usage import peak_rss_parts_mib
from tests.perf import bench_agreement

ORG, PROJECT = "acme", "support-bot"
SOURCES = ("traces", "evaluator")
CHUNK = 50_000
COMPACT_AFTER_CHUNKS = 2
COLD_START_GOAL_S = 10.0
CATCH_UP_GOAL = 50_000
VERSION = 2  # bump when the corpus's recipe changes (2: index sidecars), so caches are rebuilt


def log(message: str) -> None:
    print(f"[bench-web {time.strftime('%H:%M:%S')}] {message}", flush=True)


def corpus_dir(base: Path, records: int, seed: int, partitions: int) -> Path:
    return base / f"web-corpus-r{records}-s{seed}-p{partitions}-v{VERSION}"


def _specs() -> tuple[CorpusSpec, ...]:
    return (
        CorpusSpec(name="traces", source=None),
        CorpusSpec(name="evaluator", source="evaluator"),
    )


def _replay_chunk(store_dir: str, partitions: int, chunk: tuple[int, int, int],
                  seed: int) -> dict[str, Any]:  # fmt: skip
    """One chunk (number, first trace, count), in a child process: a replay run with chains
    of its own."""
    n, first, count = chunk
    os.nice(10)  # the machine is shared: the benchmark's build is the least urgent work
    settings = load_settings(partitions=partitions, shard_max_records=10_000, corpora=_specs())
    store = LocalStore(Path(store_dir))
    report = asyncio.run(
        replay(settings, store, scored_event_lines(first, count, seed), run_id=f"c{n:03d}")
    )
    if sum(report.invalid.values()):
        raise RuntimeError(f"the bench's events were rejected: {report.examples[:3]}")
    return {"lines": report.lines, "snapshots": report.snapshots}


def build_corpus(directory: Path, records: int, seed: int, partitions: int) -> dict[str, Any]:
    """Step 1 (cached)."""
    done = directory / "done.json"
    if done.exists():
        info: dict[str, Any] = json.loads(done.read_text())
        log(f"corpora cached in {directory} (built in {info['build_s']:.0f} s)")
        return info
    if directory.exists():
        shutil.rmtree(directory)
    store_dir = directory / "store"
    store_dir.mkdir(parents=True)
    traces = traces_for(records)
    chunks = [(n, first, min(CHUNK, traces - first))
              for n, first in enumerate(range(0, traces, CHUNK))]  # fmt: skip
    started = time.monotonic()
    lines = snapshots = 0

    def run(batch: list[tuple[int, int, int]]) -> None:
        nonlocal lines, snapshots
        with ProcessPoolExecutor(2) as pool:
            futures = [pool.submit(_replay_chunk, str(store_dir), partitions, chunk, seed)
                       for chunk in batch]  # fmt: skip
            for (n, first, count), future in zip(batch, futures, strict=True):
                result = future.result()
                lines += result["lines"]
                snapshots += result["snapshots"]
                log(f"chunk {n}: traces {first}..{first + count - 1}, {lines} events so far, "
                    f"{time.monotonic() - started:.0f} s")  # fmt: skip

    run(chunks[:COMPACT_AFTER_CHUNKS])
    store = LocalStore(store_dir)
    settings = load_settings(partitions=partitions)
    for source in SOURCES:
        # With the holdings index for the replays' partitioning, as the worker compacts: a
        # later chunk's writers then read each partition's holdings, not the whole compaction
        # (without it the chunks after this took ten times as long).
        made = asyncio.run(compact(store, CorpusRef(ORG, PROJECT, source), writer="bench",
                                   partitioning=(settings.partitioner, partitions)))  # fmt: skip
        log(f"{source} compacted: generation {made.generation if made else '-'}, "
            f"{made.records if made else 0} records")  # fmt: skip
    run(chunks[COMPACT_AFTER_CHUNKS:])
    info = {
        "records": records,
        "traces": traces,
        "events": lines,
        "snapshots": snapshots,
        "seed": seed,
        "partitions": partitions,
        "sources": list(SOURCES),
        "build_s": time.monotonic() - started,
        "bytes": sum(p.stat().st_size for p in store_dir.rglob("*") if p.is_file()),
    }
    done.write_text(json.dumps(info, indent=2))
    log(f"corpora built in {info['build_s']:.0f} s: {info}")
    return info


# --- the service, measured over HTTP -------------------------------------------------------


class Service(ManagedProcess):
    """``rl-export <command>`` as a child process of the benchmark."""

    def __init__(self, name: str, argv: list[str], log: Path, env: dict[str, str]) -> None:
        super().__init__(log)
        self.name = name
        self.argv = argv
        self.env = env

    def start(self, ready_url: str, timeout_s: float = 120.0) -> Service:
        self._spawn([sys.executable, "-m", "rl_export.cli", *self.argv], env=self.env)
        self._wait_until(lambda: _answers(ready_url), timeout_s, f"{ready_url} answered 200")
        return self


class Api:
    """A keep-alive HTTP/1.1 client of one web service (the standard library's: the benchmark
    needs nothing the service does not install)."""

    def __init__(self, port: int, token: str | None = None, metrics_port: int | None = None
                 ) -> None:  # fmt: skip
        self.port = port
        self.metrics_port = metrics_port  # /metrics is not on the public port (since issue 41)
        self.prefix = f"/api/v1/{ORG}/{PROJECT}/"
        self.headers = {"Authorization": f"Bearer {token}"} if token else {}
        self._conn = http.client.HTTPConnection("127.0.0.1", port, timeout=600)

    def call(self, method: str, path: str, params: dict[str, str] | None = None,
             body: Any = None) -> tuple[int, bytes]:  # fmt: skip
        url = path if path.startswith("/") else self.prefix + path
        if params:
            url += "?" + urlencode(params)
        headers = dict(self.headers)
        data = None
        if body is not None:
            data = json.dumps(body).encode()
            headers["Content-Type"] = "application/json"
        try:
            self._conn.request(method, url, body=data, headers=headers)
            response = self._conn.getresponse()
        except (BrokenPipeError, ConnectionResetError, http.client.RemoteDisconnected):
            # The server closed a keep-alive connection that idled (a labeler's pause):
            # once more on a new one, as a browser would.
            self._conn.close()
            self._conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=600)
            self._conn.request(method, url, body=data, headers=headers)
            response = self._conn.getresponse()
        return response.status, response.read()

    def metrics(self) -> str:
        """The service's metrics, from its metrics port (a baseline older than that: its
        public port)."""
        for port in (self.metrics_port, self.port):
            if port is None:
                continue
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=60) as r:
                    return str(r.read().decode())
            except (urllib.error.URLError, ConnectionError):
                continue
        raise RuntimeError("the web service serves no /metrics")

    def get(self, path: str, params: dict[str, str] | None = None) -> Any:
        status, data = self.call("GET", path, params)
        if status != 200:
            raise RuntimeError(f"GET {path} {params}: {status} {data[:300]!r}")
        return json.loads(data)

    def close(self) -> None:
        self._conn.close()


def _answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return bool(response.status == 200)
    except (urllib.error.URLError, OSError):
        return False


def _token(env: dict[str, str], subject: str = "bench", scopes: str = "admin") -> str:
    result = subprocess.run(
        [sys.executable, "-m", "rl_export.cli", "tokens", "create", "--org", ORG, "--project",
         PROJECT, "--subject", subject, "--scopes", scopes],
        env=env, capture_output=True, text=True, check=True, timeout=60,
    )  # fmt: skip
    return result.stdout.strip().splitlines()[-1]


def _metric(text: str, name: str, **labels: str) -> float:
    want = name + ("{" + ",".join(f'{k}="{v}"' for k, v in sorted(labels.items())) + "}"
                   if labels else "")  # fmt: skip
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith(want + " "))  # fmt: skip


def quantiles(samples: list[float]) -> dict[str, float]:
    """p50 and p99 in milliseconds (nearest rank), with the count."""
    ordered = sorted(samples)

    def rank(q: float) -> float:
        return ordered[min(len(ordered) - 1, max(0, int(q * len(ordered) + 0.5) - 1))] * 1000

    return {"p50_ms": rank(0.50), "p99_ms": rank(0.99), "n": len(ordered)}


def catch_up(client: Api, source: str, expected: int) -> dict[str, Any]:
    """Step 2 for one corpus: from the first request to the index's first complete pass."""
    started = time.monotonic()
    while True:
        index = client.get("stats", {"source": source})["index"]
        if index["ready"] and index["indexed"] >= expected:
            break
        if time.monotonic() - started > 3600:
            raise RuntimeError(f"the index of {source} did not catch up within an hour")
        time.sleep(0.2)
    elapsed = time.monotonic() - started
    lines = _metric(client.metrics(), "rl_export_web_index_lines_total", corpus=source)
    log(f"{source}: {index['indexed']:,} records ({lines:,.0f} lines) indexed in {elapsed:.1f} s")
    records = index["indexed"]
    return {"records": records, "lines": lines, "seconds": elapsed,
            "records_per_s": records / elapsed, "lines_per_s": lines / elapsed}  # fmt: skip


QUERIES: dict[str, tuple[str, dict[str, str]]] = {
    "stats (evaluator, no filter)": ("stats", {"source": "evaluator"}),
    "stats (evaluator, 4 filters)": ("stats", {
        "source": "evaluator", "passed": "true", "min_reward": "0.4", "scenario":
        "multi_city_trip_planning", "max_severity": "1"}),
    "stats (traces, labeled)": ("stats", {"source": "traces", "labeled": "true"}),
    "preview (trajectory, 10)": ("records", {"source": "evaluator", "limit": "10"}),
    "preview (prompt_completion, 10, passed)": ("records", {
        "source": "evaluator", "format": "prompt_completion", "passed": "true", "limit": "10"}),
    "queue (10)": ("queue", {"limit": "10"}),
    "labeling settings": ("labeling", {}),
    "agreement (no label since)": ("agreement", {}),
    # A filter no request used before: the report is computed while the request waits.
    "agreement (new filters)": ("agreement", {"until": "<fresh>"}),
}  # fmt: skip
GOALS_MS: dict[str, float] = {
    "agreement (no label since)": 1000.0,  # issue 45 (issue 33: 2,000)
    "agreement (new filters)": 1000.0,
    "claim (20 labelers, 5 s apart)": 150.0,
    "release (20 labelers, 5 s apart)": 150.0,
    "claim (20 labelers, 0.5 s apart)": 150.0,
    "release (20 labelers, 0.5 s apart)": 150.0,
    # Saturation (no pause: each request waits for those of the 19 others) has no goal.
    "claim (20 labelers, no pause)": math.inf,
    "release (20 labelers, no pause)": math.inf,
}
"""p99 goals where they differ from the default :data:`GOAL_MS` (issues 33 and 45)."""
GOAL_MS = 100.0
CLAIMS_GOAL = 100  # claims a second one web instance serves (issue 45)
FRESH_ROUNDS = 20  # of the queries that compute a report each time
LABELERS = 20


def latencies(client: Api, rounds: int) -> dict[str, Any]:
    """Step 3: each query ``rounds`` times, interleaved, after one warm-up each."""
    fresh = iter(range(1, 1_000_000))

    def asked(params: dict[str, str]) -> dict[str, str]:
        # "<fresh>": a value no request asked for before (a moment after every trace)
        value = (datetime(2030, 1, 1, tzinfo=UTC) + timedelta(seconds=next(fresh))).isoformat()
        return {k: value if v == "<fresh>" else v for k, v in params.items()}

    for path, params in QUERIES.values():
        client.get(path, asked(params))
    samples: dict[str, list[float]] = {name: [] for name in QUERIES}
    for n in range(rounds):
        for name, (path, params) in QUERIES.items():
            if n >= FRESH_ROUNDS and "<fresh>" in params.values():
                continue  # each takes a whole computation
            query = asked(params)
            began = time.perf_counter()
            client.get(path, query)
            samples[name].append(time.perf_counter() - began)
    return {name: quantiles(values) for name, values in samples.items()}


def claim_latencies(port: int, tokens: list[str], rounds: int, pause_s: float) -> dict[str, Any]:
    """``POST queue/claim`` and ``DELETE queue/claims/{id}`` by all labelers at once, a
    thread and a connection each: every labeler claims the head of their queue, then lets it
    go, ``rounds`` times in all, pausing a random time of mean ``pause_s`` before each claim
    (0: none, the service saturated). What each labeler's next trace costs under a team's
    load; a person takes tens of seconds a trace, so a mean pause of 0.5 s is a team
    working 60 times faster than people do."""
    rng = random.Random(7)
    pauses = {token: random.Random(rng.random()) for token in tokens}
    claims: list[float] = []
    releases: list[float] = []
    errors: list[str] = []
    each = max(rounds // len(tokens), 1)

    def labeler(token: str) -> None:
        client = Api(port, token)
        try:
            for _ in range(each):
                if pause_s:
                    time.sleep(pauses[token].expovariate(1 / pause_s))
                began = time.perf_counter()
                status, data = client.call("POST", "queue/claim", body={"limit": 1})
                claims.append(time.perf_counter() - began)
                if status != 200:
                    errors.append(f"POST queue/claim: {status} {data[:300]!r}")
                    return
                items = json.loads(data)["items"]
                if not items:
                    continue
                began = time.perf_counter()
                status, data = client.call("DELETE", f"queue/claims/{items[0]['trace_id']}")
                releases.append(time.perf_counter() - began)
                if status != 204:
                    errors.append(f"DELETE queue/claims: {status} {data[:300]!r}")
                    return
        finally:
            client.close()

    threads = [threading.Thread(target=labeler, args=(token,)) for token in tokens]
    began = time.monotonic()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    elapsed = time.monotonic() - began
    if errors:
        raise RuntimeError(errors[0])
    how = f"{pause_s:g} s apart" if pause_s else "no pause"
    log(f"claims, {len(tokens)} labelers, {how}: {len(claims) / elapsed:,.0f} claims/s")
    return {f"claim ({len(tokens)} labelers, {how})": quantiles(claims)
            | {"per_s": len(claims) / elapsed},
            f"release ({len(tokens)} labelers, {how})": quantiles(releases)}  # fmt: skip


def _web_env(store_dir: Path, folder: Path, port: int, **settings: Any) -> dict[str, str]:
    """The environment of a web service on the cached corpora, its index in ``folder``; its
    broker ``kafka_bootstrap`` if given, else a port where none listens (a service that only
    reads corpora)."""
    settings.setdefault("kafka_bootstrap", f"127.0.0.1:{free_port()}")
    return child_env(
        load_settings(store_url=str(store_dir), data_dir=folder, web_port=port,
                      web_metrics_port=free_port(), **settings),
        os.environ,
    )  # fmt: skip


@contextlib.contextmanager
def _broker(folder: Path, wanted: bool) -> Iterator[str | None]:
    """A broker of its own in ``folder`` for the time of the block (its bootstrap), or None."""
    if not wanted:
        yield None
        return
    broker = LocalKafka(folder / "kafka", free_port())
    broker.start()
    try:
        yield broker.bootstrap
    finally:
        broker.stop()


def _known_to(env: dict[str, str], pythonpath: str) -> dict[str, str]:
    """``env`` for another checkout's service (its ``services`` at ``pythonpath``) with only
    the settings the benchmark chose that its code has: a service refuses a setting it does
    not know (or a default, such as the corpora's, with fields it does not know)."""
    names = subprocess.run(
        [sys.executable, "-c", "from rl_export.runtime.settings import Settings; "
         "print(' '.join(Settings.model_fields))"],
        env={**env, "PYTHONPATH": pythonpath}, capture_output=True, text=True, check=True,
        timeout=60,
    ).stdout.split()  # fmt: skip
    known = {"RL_EXPORT_" + name.upper() for name in names}
    defaults = child_env(load_settings(), {})
    kept = {k: v for k, v in env.items() if not k.startswith("RL_EXPORT_")
            or (k in known and defaults.get(k) != v)}  # fmt: skip
    return {**kept, "PYTHONPATH": pythonpath}


def measure_index(
    store_dir: Path, records: int, rounds: int, *, pythonpath: str | None = None,
    cold_only: bool = False, broker: bool = True,
) -> dict[str, Any]:  # fmt: skip
    """Steps 2 and 3: a web service with an empty index on the cached corpora. With
    ``pythonpath`` another checkout's ``services`` (``--baseline``) runs that code's service
    on the same corpora; ``cold_only`` stops after step 2 (its cold start and catch-up).

    With ``broker`` (the default) the service has a broker of its own, as in production: it
    follows the labels and claims topics, and each claim it writes is sent on the claims
    topic before the claim's answer (the records there are counted and reported). Without,
    each claim's news fails to find a broker instead."""
    # The claims of earlier runs (each claims and lets go of the same oldest traces) would
    # make every run read longer slot chains than the one before: each run starts without them.
    shutil.rmtree(store_dir / CLAIMS_PREFIX, ignore_errors=True)
    with (
        tempfile.TemporaryDirectory(prefix="rl-export-bench-web-") as folder,
        _broker(Path(folder), broker) as bootstrap,
    ):
        port = free_port()
        extra = {} if bootstrap is None else {"kafka_bootstrap": bootstrap}
        env = _web_env(store_dir, Path(folder), port, **extra)
        if pythonpath:
            env = _known_to(env, pythonpath)
        token = _token(env)
        labelers = [_token(env, f"labeler-{n:02d}", "label") for n in range(LABELERS)]
        base = f"http://127.0.0.1:{port}"
        web = Service("rl-export web", ["web"], Path(folder) / "web.log", env)
        began = time.monotonic()
        web.start(base + "/readyz")
        metrics_port = env.get("RL_EXPORT_WEB_METRICS_PORT")  # (older code: /metrics on port)
        client = Api(port, token, int(metrics_port) if metrics_port else None)
        try:
            caught = {s: catch_up(client, s, records) for s in ("evaluator", "traces")}
            cold = time.monotonic() - began  # process start to both corpora indexed
            log(f"cold start: both corpora indexed {cold:.1f} s after the process started")
            metrics = client.metrics()
            objects = {how: sum(_metric(metrics, "rl_export_web_index_objects_total",
                                        corpus=source, read=how) for source in caught)
                       for how in ("columns", "lines")}  # fmt: skip
            log(f"objects read as columns (sidecars): {objects['columns']:.0f}, as lines: "
                f"{objects['lines']:.0f}")  # fmt: skip
            if cold_only:
                size = sum(p.stat().st_size for p in Path(folder).rglob("*") if p.is_file())
                return {"catch_up": caught, "cold_start_s": cold, "index_bytes": size}
            log(f"latency: {rounds} rounds of {len(QUERIES)} queries")
            measured = latencies(client, rounds)
            log(f"claims: {rounds} claims and releases by {LABELERS} labelers at once")
            measured |= claim_latencies(port, labelers, rounds, pause_s=5.0)
            measured |= claim_latencies(port, labelers, rounds, pause_s=0.5)
            measured |= claim_latencies(port, labelers, rounds, pause_s=0.0)
            size = sum(p.stat().st_size for p in Path(folder).rglob("*") if p.is_file())
            broadcast = None
            if bootstrap is not None:
                topic = Settings().topic_claims
                broadcast = len(asyncio.run(read_topics(bootstrap, [topic])))
                log(f"claims topic: {broadcast:,} entries sent by the instance")
        finally:
            client.close()
            web.stop()
    return {"catch_up": caught, "cold_start_s": cold, "latency": measured, "index_bytes": size,
            "objects": objects, "claims_broadcast": broadcast}  # fmt: skip


def warm_start(store_dir: Path, records: int) -> dict[str, Any]:
    """A new instance as an autoscaler starts one: told to warm the project
    (``RL_EXPORT_WEB_WARM``), it indexes both corpora side by side as it starts, and its
    /readyz answers 200 only then. Timed from the process's start to that answer; the
    corpora are then checked to be whole (each first request answers from the index)."""
    with tempfile.TemporaryDirectory(prefix="rl-export-bench-web-warm-") as folder:
        port = free_port()
        env = _web_env(store_dir, Path(folder), port, web_warm=f"{ORG}/{PROJECT}",
                       web_index_wait_s=0.0)  # fmt: skip
        token = _token(env)
        web = Service("rl-export web", ["web"], Path(folder) / "web.log", env)
        began = time.monotonic()
        web.start(f"http://127.0.0.1:{port}/readyz", timeout_s=600)
        seconds = time.monotonic() - began
        client = Api(port, token, int(env["RL_EXPORT_WEB_METRICS_PORT"]))
        try:
            indexed = {}
            for source in ("evaluator", "traces"):
                index = client.get("stats", {"source": source})["index"]
                if not index["ready"] or index["indexed"] < records:
                    raise RuntimeError(f"ready, but {source} is not indexed: {index}")
                indexed[source] = index["indexed"]
            assert web.pid is not None
            rss = peak_rss_parts_mib(web.pid)[0]  # the web process (not its export processes)
        finally:
            client.close()
            web.stop()
    log(f"warm start: ready with both corpora indexed {seconds:.1f} s after the process "
        f"started (peak RSS {rss:.0f} MiB)")  # fmt: skip
    return {"seconds": seconds, "indexed": indexed, "peak_rss_mib": rss}


def label_to_visible(labels: int, traces: int) -> dict[str, Any]:
    """Step 4: a label posted to the API until ``GET stats`` counts it, on a live stack."""
    with (
        tempfile.TemporaryDirectory(prefix="rl-export-bench-label-") as folder,
        _broker(Path(folder), True) as bootstrap,
    ):
        data = Path(folder)
        port = free_port()
        settings = load_settings(
            kafka_bootstrap=bootstrap, store_url=str(data / "store"), data_dir=data,
            web_port=port, worker_web_port=free_port(), web_metrics_port=free_port(),
            shard_max_age_s=1.0,
            state_store="memory://",
        )  # fmt: skip
        env = child_env(settings, os.environ)
        services: list[Service] = []
        try:
            services.append(
                Service("rl-export worker", ["worker"], data / "worker.log", env).start(
                    f"http://127.0.0.1:{settings.worker_web_port}/readyz"
                )
            )
            rng = random.Random(5)
            start = datetime.now(UTC) - timedelta(hours=1)
            events = [e for i in range(traces)
                      for e in scored_trace_events(rng, i, start, deleted=False)
                      if e["event_type"] != "label.submitted"]  # fmt: skip
            asyncio.run(_produce(settings, events))
            base = f"http://127.0.0.1:{port}"
            services.append(
                Service("rl-export web", ["web"], data / "web.log", env).start(base + "/readyz")
            )
            client = Api(port, _token(env))

            def labeled() -> int:
                value: int = client.get("stats", {"source": "evaluator"})["human_labeled"]
                return value

            deadline = time.monotonic() + 300
            while client.get("queue", {"limit": "1"})["remaining"] < traces:
                if time.monotonic() > deadline:
                    raise RuntimeError("the benchmark's traces never reached the index")
                time.sleep(0.2)
            queue = [r["trace_id"] for r in client.get("queue", {"limit": str(labels)})["items"]]
            rubric = {"correctness": 4, "helpfulness": 4, "efficiency": 3, "safety": 5}
            samples = []
            for trace_id in queue:
                before = labeled()
                began = time.perf_counter()
                status, answer = client.call(
                    "POST", "labels", body={"trace_id": trace_id, "rubric": rubric}
                )
                if status != 202:
                    raise RuntimeError(f"POST labels: {status} {answer[:300]!r}")
                acknowledged = time.perf_counter() - began
                while labeled() <= before:
                    time.sleep(0.02)
                samples.append((acknowledged, time.perf_counter() - began))
            client.close()
        finally:
            for service in reversed(services):
                service.stop()
    return {
        "acknowledged": quantiles([a for a, _ in samples]),
        "visible_in_stats": quantiles([v for _, v in samples]),
        "settings": {
            "shard_max_age_s": settings.shard_max_age_s,
            "web_index_poll_s": settings.web_index_poll_s,
        },
    }


async def _produce(settings: Settings, events: list[dict[str, Any]]) -> None:
    await ensure_service_topics(settings)
    producer = make_producer(settings)
    await producer.start()
    try:
        futures = [
            await producer.send(
                topic_for(settings, FAMILY_OF_TYPE[e["event_type"]]),
                dumps(e),
                key=e["trace_id"].encode(),
            )
            for e in events
        ]
        for future in futures:
            await future
    finally:
        await producer.stop()


def print_table(result: dict[str, Any], path: Path) -> None:
    corpus = result["corpus"]
    print()
    print(f"web benchmark: {corpus['records']:,} live records per corpus ({corpus['traces']:,} "
          f"traces, {corpus['bytes'] / 2**30:.2f} GiB of corpora; built in "
          f"{corpus['build_s']:.0f} s)")  # fmt: skip
    base = result.get("baseline")
    for source, c in result["catch_up"].items():
        line = (
            f"index catch-up, {source:9}: {c['records']:>9,} records in {c['seconds']:6.1f} s "
            f"= {c['records_per_s']:>8,.0f} records/s ({c['lines_per_s']:,.0f} lines/s)"
        )
        if base and source in base["catch_up"]:
            b = base["catch_up"][source]
            line += (f"; before: {b['records_per_s']:,.0f} records/s "
                     f"({c['records_per_s'] / b['records_per_s']:.1f}x)")  # fmt: skip
        verdict = "met" if c["records_per_s"] >= CATCH_UP_GOAL else "MISSED"
        print(f"{line} (goal >= {CATCH_UP_GOAL:,}: {verdict})")
    if "cold_start_s" in result:
        cold = result["cold_start_s"]
        before = (f"; before: {base['cold_start_s']:.1f} s ({base['cold_start_s'] / cold:.1f}x "
                  "faster)") if base else ""  # fmt: skip
        print(f"cold start, corpora asked for one after the other (process start to both "
              f"indexed): {cold:.1f} s{before}")  # fmt: skip
    if "warm_start" in result:
        warm = result["warm_start"]
        starts = warm.get("starts_s", [warm["seconds"]])
        under = sum(s < COLD_START_GOAL_S for s in starts)
        verdict = "met" if under == len(starts) else "MISSED"
        print(f"new instance, warmed (process start to /readyz 200, both corpora indexed side "
              f"by side): median {warm['seconds']:.1f} s ({min(starts):.1f}-{max(starts):.1f} s), "
              f"under {COLD_START_GOAL_S:.0f} s in {under} of {len(starts)} starts (goal: all: "
              f"{verdict}), peak RSS {warm['peak_rss_mib']:.0f} MiB")  # fmt: skip
    if "objects" in result:
        print(f"objects read as columns (sidecars): {result['objects']['columns']:.0f}, "
              f"as lines: {result['objects']['lines']:.0f}")  # fmt: skip
    print(f"{'route':42} {'p50':>9} {'p99':>9} {'p99 goal':>9}")
    for name, q in result["latency"].items():
        goal = GOALS_MS.get(name, GOAL_MS)
        if math.isinf(goal):
            print(f"{name:42} {q['p50_ms']:7.1f}ms {q['p99_ms']:7.1f}ms {'-':>9}")
            continue
        verdict = "met" if q["p99_ms"] < goal else "MISSED"
        print(f"{name:42} {q['p50_ms']:7.1f}ms {q['p99_ms']:7.1f}ms {goal:7.0f}ms {verdict}")
    for name, q in result["latency"].items():
        if "per_s" in q and name.endswith("no pause)"):  # the instance saturated
            verdict = "met" if q["per_s"] >= CLAIMS_GOAL else "MISSED"
            print(f"claims served by one instance at saturation: {q['per_s']:.0f} claims/s "
                  f"(goal >= {CLAIMS_GOAL}: {verdict})")  # fmt: skip
    if result.get("claims_broadcast") is not None:
        print(f"claims measured with a broker: {result['claims_broadcast']:,} claim entries sent "
              "on the claims topic")  # fmt: skip
    elif "claims_broadcast" in result:
        print("claims measured without a broker (--no-broker)")
    label = result.get("label")
    if label:
        print(
            f"label acknowledged (202):                  {label['acknowledged']['p50_ms']:7.1f}ms "
            f"{label['acknowledged']['p99_ms']:7.1f}ms"
        )
        seen = label["visible_in_stats"]
        print(f"{'label to visible in stats':42} {seen['p50_ms']:7.1f}ms {seen['p99_ms']:7.1f}ms  "
              f"(shard age bound {label['settings']['shard_max_age_s']} s, index poll "
              f"{label['settings']['web_index_poll_s']} s)")  # fmt: skip
    print(f"targets: p99 as above, catch-up >= 50,000 records/s; written to {path}")
    if "agreement" in result:
        bench_agreement.print_table(result["agreement"])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bench_web", description=__doc__.split("\n")[0])
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--seed", type=int, default=13)
    parser.add_argument("--partitions", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=200, help="requests per query")
    parser.add_argument("--labels", type=int, default=20, help="labels timed to visible")
    parser.add_argument("--agreement-rounds", type=int, default=10, help="agreement reports")
    parser.add_argument("--warm-starts", type=int, default=10, help="warmed starts timed")
    parser.add_argument("--dir", default="var/bench")
    parser.add_argument(
        "--no-broker", action="store_true",
        help="steps 2 and 3 without a broker (as before 2026-12-05: each claim's news to the "
        "other instances then fails to find one)",
    )  # fmt: skip
    parser.add_argument("--build-only", action="store_true", help="only build the corpora")
    parser.add_argument(
        "--baseline",
        help="another checkout (its root): its web service's "
        "cold start and catch-up on the same corpora, printed beside this one's",
    )
    parser.add_argument(
        "--baseline-latency",
        action="store_true",
        help="the baseline's route latencies too (printed first)",
    )
    args = parser.parse_args(argv)
    directory = corpus_dir(Path(args.dir), args.records, args.seed, args.partitions)
    corpus = build_corpus(directory, args.records, args.seed, args.partitions)
    if args.build_only:
        return 0
    result: dict[str, Any] = {"at": datetime.now(UTC).isoformat(), "corpus": corpus}
    if args.baseline:
        tree = Path(args.baseline).resolve()
        log(f"baseline: {tree}'s web service on the same corpora (cold start, catch-up)")
        result["baseline"] = measure_index(directory / "store", args.records, args.rounds,
                                           pythonpath=str(tree / "services"),
                                           cold_only=not args.baseline_latency,
                                           broker=not args.no_broker)  # fmt: skip
        result["baseline"]["tree"] = str(tree)
        if "latency" in result["baseline"]:
            print("the baseline's routes:")
            for name, q in result["baseline"]["latency"].items():
                print(f"  {name:42} {q['p50_ms']:7.1f}ms {q['p99_ms']:7.1f}ms")
    if args.warm_starts:
        log(f"warm start: {args.warm_starts} new instances that index the project as they start")
        starts = [warm_start(directory / "store", args.records) for _ in range(args.warm_starts)]
        result["warm_start"] = {
            "seconds": statistics.median(w["seconds"] for w in starts),
            "starts_s": [w["seconds"] for w in starts],
            "peak_rss_mib": max(w["peak_rss_mib"] for w in starts),
        }
    result |= measure_index(directory / "store", args.records, args.rounds,
                            broker=not args.no_broker)  # fmt: skip
    if args.labels:
        log(f"label to visible: {args.labels} labels on a live broker, worker and web service")
        result["label"] = label_to_visible(args.labels, traces=200)
    if args.agreement_rounds:
        log(f"agreement report: {args.agreement_rounds} runs over 1,000,000 traces")
        result["agreement"] = bench_agreement.run(args.agreement_rounds, baseline=False)
    path = Path(args.dir) / f"web-{datetime.now(UTC):%Y%m%dT%H%M%S}.json"
    path.write_text(json.dumps(result, indent=2))
    print_table(result, path)
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
