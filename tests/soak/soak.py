"""``make soak``: two workers under a steady load while faults rain on them; then the checks.

How a soak runs (the steps match :meth:`Soak.run`):

1. Start a Kafka broker and SeaweedFS (S3) of its own, under ``--work``, with a proxy in
   front of SeaweedFS that can cut it off (:mod:`tests.harness.faults`); create the topics;
   start two workers (RocksDB tables, two join processes each, S3 through the proxy).
2. From the seed, plan the load and the faults (:mod:`tests.soak.soak_plan`). Produce
   the load at its pace (an idempotent producer that retries until the broker takes each
   record), and inject the faults at their moments: SIGKILLs of whole workers and of single
   join processes (a killed worker is started again a few seconds later; a worker whose join
   process died stops, and is started again too), a broker restart, store outages, a pause
   of a whole worker longer than the session timeout. Workers that exit for any other
   reason are started again as well, and reported.
3. When the load is done and every fault is over, wait until both consumer groups have
   nothing left to read (the join on the input topics, the sink on ``trajectories``).
4. Stop the workers, and check, from what the topics hold (read committed):
   a. every corpus's latest view equals the pure join folded over the valid input events
      (:mod:`tests.harness.fold`);
   b. ``shards verify`` finds no problem (chains without gap or overlap, checksums, no
      ``(trace_id, revision)`` twice);
   c. every input record marked for the dead-letter topic is there exactly once, with the
      reason it was meant to get, and no other record is;
   d. both groups' offsets reached the end.
5. Print what was done and what was found, write it as JSON under ``--work``; exit 1 on
   any difference.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import os
import random
import shutil
import signal
import sys
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal

import aiohttp
from aiokafka import AIOKafkaProducer

from rl_export.corpora.layout import list_corpora
from rl_export.corpora.reader import CorpusReader
from rl_export.corpora.store import S3Store
from rl_export.corpora.verify import verify
from rl_export.local.broker import LocalKafka
from rl_export.local.process import ManagedProcess
from rl_export.local.seaweed import LOCAL_CREDENTIALS, LocalS3
from rl_export.model.codec import dumps, loads
from rl_export.model.partitioning import kafka_partitioner
from rl_export.runtime.net import free_port
from rl_export.runtime.settings import Settings
from rl_export.stream.emitter import HEADER_FORWARDED_FROM
from rl_export.stream.produce import topic_for
from rl_export.stream.topics import ensure_service_topics
from tests.harness.faults import CuttableProxy
from tests.harness.fold import expected_corpora
from tests.harness.reads import read_topics, unread, wait_caught_up
from tests.harness.workers import WorkerProcess, descendants, log_tail
from tests.soak.soak_checks import check_dead_letters, compare_corpus
from tests.soak.soak_plan import EXPECT_HEADER, Fault, SoakPlan, SoakSize, make_plan

BUCKET = "rl-export-soak"
Guarantee = Literal["exactly_once", "at_least_once"]
SHORT = SoakSize(
    duration_s=60.0, rate=40.0, kills=4, outages=1, outage_s=(10.0, 12.0), pause_s=11.0,
    spread_s=8.0, compaction_interval_s=10.0,
)  # fmt: skip
"""The soak ``make test`` runs: every kind of fault once or more, in about two minutes."""


@dataclass
class SoakReport:
    """What a soak did and found; ``differences`` empty means it passed."""

    seed: int
    size: dict[str, Any]
    faults: list[str] = field(default_factory=list)
    sent: dict[str, int] = field(default_factory=dict)
    topics: dict[str, int] = field(default_factory=dict)
    corpora: dict[str, int] = field(default_factory=dict)
    dead_letters: dict[str, int] = field(default_factory=dict)
    unread: dict[str, int] = field(default_factory=dict)
    verify: str = ""
    restarts: int = 0
    other_exits: list[str] = field(default_factory=list)
    differences: list[str] = field(default_factory=list)
    seconds: dict[str, float] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return not self.differences

    def lines(self) -> list[str]:
        out = [
            f"soak seed {self.seed}: {self.size['duration_s']:.0f} s of load at about "
            f"{self.size['rate']:.0f} events/s, {self.size['workers']} workers, "
            f"{self.size['partitions']} partitions",
            f"faults injected ({len(self.faults)}):",
            *(f"  {line}" for line in self.faults),
            f"workers started again: {self.restarts}; exits the soak did not cause: "
            f"{len(self.other_exits)}",
            *(f"  {line}" for line in self.other_exits[:20]),
            "records produced: "
            + ", ".join(f"{kind} {count:,}" for kind, count in self.sent.items()),
            "the topics hold: "
            + ", ".join(f"{name} {count:,}" for name, count in self.topics.items()),
            "corpora (latest view): "
            + ", ".join(f"{name} {count:,}" for name, count in self.corpora.items()),
            "dead letters: "
            + ", ".join(f"{reason} {count:,}" for reason, count in self.dead_letters.items()),
            "left unread: " + ", ".join(f"{g} {n}" for g, n in self.unread.items()),
            f"shards verify: {self.verify}",
            "took: " + ", ".join(f"{k} {v:.0f}s" for k, v in self.seconds.items()),
            f"differences found: {len(self.differences)}",
            *(f"  {line}" for line in self.differences[:50]),
        ]
        if len(self.differences) > 50:
            out.append(f"  ... and {len(self.differences) - 50} more")
        return out


@dataclass
class _Slot:
    """One worker of the soak, across its restarts."""

    index: int
    worker: WorkerProcess | None = None
    planned_exit: bool = False  # we killed it (or one of its join processes)
    restart_at: float | None = None
    restart_delay: float = 1.0
    paused: bool = False
    launched_at: float = 0.0
    ready: bool = False


class Soak:
    """One soak run (see the module docstring)."""

    def __init__(self, seed: int, size: SoakSize, work: Path, *, catch_up_s: float = 600.0,
                 quiet: bool = False, guarantee: Guarantee = "exactly_once") -> None:  # fmt: skip
        self.seed = seed
        self.guarantee = guarantee
        self.size = size
        self.work = work
        self.catch_up_s = catch_up_s
        self.quiet = quiet
        self.report = SoakReport(seed, asdict(size))
        self.t0 = time.monotonic()
        self.slots = [_Slot(i) for i in range(size.workers)]
        self.loading = True
        self.broker: LocalKafka | None = None
        self.s3: LocalS3 | None = None
        self.proxy: CuttableProxy | None = None
        self.settings: Settings | None = None
        self.http: aiohttp.ClientSession | None = None

    # -- reporting ---------------------------------------------------------------------

    def say(self, message: str) -> None:
        if not self.quiet:
            print(f"[soak +{time.monotonic() - self.t0:6.1f}s] {message}", flush=True)

    def fault(self, message: str) -> None:
        self.report.faults.append(f"+{time.monotonic() - self.t0:6.1f}s {message}")
        self.say(message)

    # -- 1. the stack ------------------------------------------------------------------

    async def _start_stack(self) -> Settings:
        self.work.mkdir(parents=True, exist_ok=True)
        self.broker = LocalKafka(self.work / "kafka", free_port(), heap="512m")
        self.say(f"starting Kafka and SeaweedFS under {self.work}")
        self.broker.start()
        self.s3 = LocalS3(self.work / "seaweedfs", bucket=BUCKET).start()
        self.proxy = await CuttableProxy("127.0.0.1", self.s3.port).start()
        os.environ.update(LOCAL_CREDENTIALS)
        settings = Settings(
            kafka_bootstrap=self.broker.bootstrap,
            partitions=self.size.partitions,
            state_store="rocksdb://",
            data_dir=self.work / "var",
            store_url=f"s3://{BUCKET}/soak",
            shard_max_age_s=1.0,
            # Quiet chains wait (the default's rule, a bound of the soak's time scale), so
            # held lines live through the kills; every tail is worth compacting.
            corpus_max_age_s=5.0,
            compaction_min_commits=1,
            session_timeout_s=6.0,
            max_event_bytes=self.size.max_event_bytes,
            compaction_interval_s=self.size.compaction_interval_s,
            shard_retention_s=2 * self.size.compaction_interval_s,
            processing_guarantee=self.guarantee,
            log_level="info",
        )
        await ensure_service_topics(settings)
        return settings

    def _store(self) -> S3Store:
        """The store as the checks read it: SeaweedFS itself, not through the proxy."""
        assert self.s3 is not None
        return S3Store(BUCKET, "soak", endpoint_url=self.s3.endpoint_url)

    async def _stop_stack(self) -> None:
        for slot in self.slots:
            if slot.worker is not None:
                await _stop(slot.worker)
        if self.proxy is not None:
            await self.proxy.stop()
        if self.s3 is not None:
            self.s3.stop()
        if self.broker is not None:
            await _stop(self.broker)

    # -- workers -----------------------------------------------------------------------

    def _launch(self, slot: _Slot) -> None:
        assert self.settings is not None
        assert self.proxy is not None
        env = {"AWS_ENDPOINT_URL": self.proxy.url, **LOCAL_CREDENTIALS}
        slot.worker = WorkerProcess(self.settings, f"w{slot.index}", env=env)
        slot.worker.launch()  # from the event loop's thread: its children die with us
        slot.launched_at, slot.ready, slot.planned_exit, slot.restart_at = (
            time.monotonic(), False, False, None,
        )  # fmt: skip

    async def _is_ready(self, worker: WorkerProcess) -> bool:
        assert self.http is not None
        try:
            async with self.http.get(worker.url("/readyz")) as response:
                return response.status == 200
        except (aiohttp.ClientError, OSError, TimeoutError):
            return False

    async def _supervise(self, stop: asyncio.Event) -> None:
        """Start again every worker that exited; note when started ones are ready."""
        while not stop.is_set():
            now = time.monotonic()
            for slot in self.slots:
                worker = slot.worker
                if worker is not None and worker.proc is not None:
                    code = worker.proc.poll()
                    if code is not None:
                        if not slot.planned_exit:
                            line = log_tail(worker.log_path, 1).strip()[-300:]
                            self.report.other_exits.append(
                                f"+{now - self.t0:.1f}s worker {slot.index} exited with {code}:"
                                f" {line}"
                            )
                            self.say(f"worker {slot.index} exited with {code} by itself")
                        worker.proc = None
                        slot.restart_at = now + (slot.restart_delay if slot.planned_exit else 1)
                    elif not slot.ready and await self._is_ready(worker):
                        slot.ready = True
                        self.say(f"worker {slot.index} ready after {now - slot.launched_at:.1f}s")
                elif slot.restart_at is not None and now >= slot.restart_at:
                    self.report.restarts += 1
                    self._launch(slot)
            await asyncio.sleep(0.3)

    async def _target(self, preferred: int, *, ready: bool = False) -> _Slot | None:
        """The preferred worker if it runs (and is ``ready``) and is not paused, else another;
        when none is, wait for one (a minute at most)."""
        order = [preferred, *(i for i in range(len(self.slots)) if i != preferred)]
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            for index in order:
                slot = self.slots[index]
                worker = slot.worker
                running = worker and worker.proc and worker.proc.poll() is None
                if running and not slot.paused and (slot.ready or not ready):
                    return slot
            await asyncio.sleep(0.5)
        return None

    # -- 2. faults -----------------------------------------------------------------------

    async def _inject(self, fault: Fault) -> None:
        await asyncio.sleep(max(0.0, self.t0 + fault.at - time.monotonic()))
        if fault.kind in ("kill_worker", "kill_join"):
            await self._kill(fault)
        elif fault.kind == "broker_restart":
            await self._restart_broker(fault.seconds)
        elif fault.kind == "store_outage":
            assert self.proxy is not None
            self.proxy.cut()
            self.fault(f"store unreachable for {fault.seconds:.1f}s")
            await asyncio.sleep(fault.seconds)
            self.proxy.restore()
            self.say("store reachable again")
        elif fault.kind == "pause_worker":
            slot = await self._target(fault.target, ready=True)  # with its join processes
            if slot is None or slot.worker is None:
                self.fault("pause skipped: no worker running")
                return
            slot.paused = True
            pids = slot.worker.pause()
            self.fault(f"SIGSTOP worker {slot.index} and its join processes {pids} for "
                       f"{fault.seconds:.1f}s (session timeout 6s)")  # fmt: skip
            await asyncio.sleep(fault.seconds)
            WorkerProcess.resume(pids)
            slot.paused = False
            self.say(f"SIGCONT worker {slot.index}")

    async def _kill(self, fault: Fault) -> None:
        # A join process is started once the worker is ready: wait for one that is.
        slot = await self._target(fault.target, ready=fault.kind == "kill_join")
        if slot is None or slot.worker is None or slot.worker.proc is None:
            self.fault(f"{fault.kind} skipped: no worker running")
            return
        pid = slot.worker.proc.pid
        slot.planned_exit = True
        slot.restart_delay = fault.seconds
        if fault.kind == "kill_worker":
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
            self.fault(f"SIGKILL worker {slot.index} (pid {pid}); started again "
                       f"{fault.seconds:.1f}s after it is gone")  # fmt: skip
            return
        joins = [p for p in descendants(pid) if _is_join(p)]
        if not joins:  # still starting: kill the worker instead
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
            self.fault(f"SIGKILL worker {slot.index} (pid {pid}; no join process yet)")
            return
        victim = random.Random(self.seed + int(fault.at * 1000)).choice(joins)
        with contextlib.suppress(ProcessLookupError):
            os.kill(victim, signal.SIGKILL)
        self.fault(f"SIGKILL join process {victim} of worker {slot.index}; the worker stops, "
                   f"started again {fault.seconds:.1f}s later")  # fmt: skip

    async def _restart_broker(self, down_s: float) -> None:
        assert self.broker is not None
        self.fault(f"broker restart: SIGTERM, down {down_s:.1f}s, started again")
        await _stop(self.broker)
        await asyncio.sleep(down_s)
        self.broker.launch()
        deadline = time.monotonic() + 120
        while not self.broker.up():
            if time.monotonic() > deadline:
                raise RuntimeError("the broker did not come back within 120s")
            await asyncio.sleep(0.2)
        self.say("broker is back")

    # -- 2. load -------------------------------------------------------------------------

    async def _load(self, plan: SoakPlan) -> None:
        assert self.settings is not None
        producer = AIOKafkaProducer(
            bootstrap_servers=self.settings.kafka_bootstrap,
            enable_idempotence=True,  # a retry after a broker restart is no duplicate
            linger_ms=5,
            max_request_size=4 * 1024 * 1024,
            partitioner=kafka_partitioner(self.settings.partitioner),
        )
        await producer.start()
        pending: list[asyncio.Future[Any]] = []
        sent = Counter[str]()
        try:
            for send in plan.sends:
                await asyncio.sleep(max(0.0, self.t0 + send.at - time.monotonic()))
                topic = topic_for(self.settings, send.family)
                while True:
                    try:
                        pending.append(
                            await producer.send(topic, send.value, key=send.key,
                                                partition=send.partition, headers=send.headers)
                        )  # fmt: skip
                        break
                    except Exception as exc:  # the broker is away: this record was not taken
                        self.say(f"send failed ({type(exc).__name__}); trying again")
                        await asyncio.sleep(1.0)
                sent[send.kind] += 1
                if len(pending) >= 500:
                    await self._settle(pending)
            await self._settle(pending)
        finally:
            await producer.stop()
        self.report.sent = dict(sorted(sent.items()))
        self.say(f"load done: {sum(sent.values()):,} records sent")

    async def _settle(self, pending: list[asyncio.Future[Any]]) -> None:
        results = await asyncio.gather(*pending, return_exceptions=True)
        failed = [r for r in results if isinstance(r, BaseException)]
        if failed:  # never seen so far: an idempotent producer retries until it succeeds
            self.report.differences.append(
                f"{len(failed)} records could not be sent: {failed[0]!r}"
            )
        pending.clear()

    # -- 3, 4. catch up and check ------------------------------------------------------

    async def _catch_up(self) -> None:
        assert self.settings is not None
        s = self.settings
        deadline = time.monotonic() + 180
        for slot in self.slots:  # every worker up again
            if slot.worker is None or slot.worker.proc is None:
                slot.restart_at = time.monotonic()
        while not all(slot.ready for slot in self.slots):
            if time.monotonic() > deadline:
                self.report.differences.append("not every worker became ready after the faults")
                break
            await asyncio.sleep(0.5)
        started = time.monotonic()
        join_left = await wait_caught_up(s.kafka_bootstrap, s.app_id, s.input_topics,
                                         self.catch_up_s)  # fmt: skip
        sink_left = await wait_caught_up(s.kafka_bootstrap, s.sink_group,
                                         [s.topic_trajectories], self.catch_up_s)  # fmt: skip
        self.report.seconds["catch up"] = time.monotonic() - started
        self.say(f"caught up: join {join_left} unread, sink {sink_left} unread")

    async def _check(self) -> None:
        assert self.settings is not None
        s = self.settings
        report = self.report
        inputs = await read_topics(s.kafka_bootstrap, list(s.input_topics))
        valid: list[bytes] = []
        meant: dict[tuple[str, int, int], str] = {}
        forwarded = 0
        for record in inputs:
            headers = dict(record.headers or ())
            if EXPECT_HEADER in headers:
                meant[(record.topic, record.partition, record.offset)] = headers[
                    EXPECT_HEADER
                ].decode()
            else:
                valid.append(record.value)
                forwarded += HEADER_FORWARDED_FROM in headers
        report.topics = {"input records": len(inputs), "of them forwarded copies": forwarded,
                         "meant for the dead-letter topic": len(meant)}  # fmt: skip

        # a. the corpora against the pure fold
        want: dict[tuple[str, str, str], dict[str, dict[str, Any]]] = {}
        for corpus, rows in expected_corpora(valid, s.corpora, s.human_pass_threshold).items():
            for trace_id, row in rows.items():
                want.setdefault((row["org"], row["project"], corpus), {})[trace_id] = row
        store = self._store()
        try:
            got: dict[tuple[str, str, str], dict[str, dict[str, Any]]] = {}
            for ref in await list_corpora(store):
                reader = CorpusReader(store, ref)
                got[(ref.org, ref.project, ref.corpus)] = {
                    r["trace_id"]: r async for r in reader.records(latest_only=True)
                }
            verified = await verify(store)
        finally:
            await store.close()
        for where in sorted(set(want) | set(got)):
            report.corpora["/".join(where)] = len(got.get(where, {}))
            report.differences += compare_corpus(
                "/".join(where), want.get(where, {}), loads(dumps(got.get(where, {})))
            )

        # b. shards verify
        report.verify = verified.summary()
        report.differences += [f"verify: {p}" for p in verified.problems]

        # c. dead letters
        letters = []
        for letter in await read_topics(s.kafka_bootstrap, [s.topic_dead_letter]):
            headers = {k: v.decode() for k, v in letter.headers or ()}
            source = (headers.get("rl-export-source-topic", "?"),
                      int(headers.get("rl-export-source-partition", -1)),
                      int(headers.get("rl-export-source-offset", -1)))  # fmt: skip
            letters.append((source, headers.get("rl-export-reason", "?")))
        differences, reasons = check_dead_letters(meant, letters)
        report.differences += differences
        report.dead_letters = dict(sorted(reasons.items()))

        # d. group offsets at the end
        report.unread = {
            "join": len(await unread(s.kafka_bootstrap, s.app_id, s.input_topics)),
            "sink": len(await unread(s.kafka_bootstrap, s.sink_group, [s.topic_trajectories])),
        }
        for group, left in report.unread.items():
            if left:
                report.differences.append(f"the {group} group left {left} records unread")

    # -- the whole run -------------------------------------------------------------------

    async def run(self) -> SoakReport:
        started = time.monotonic()
        saved = {k: os.environ.get(k) for k in LOCAL_CREDENTIALS}
        stop = asyncio.Event()
        self.http = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=2))
        supervisor: asyncio.Task[None] | None = None
        try:
            self.settings = await self._start_stack()
            plan = make_plan(self.seed, self.size, datetime.now(UTC), self.settings.partitioner)
            self.say(f"plan: {len(plan.sends):,} records, {len(plan.faults)} faults")
            for slot in self.slots:
                self._launch(slot)
            supervisor = asyncio.create_task(self._supervise(stop))
            while not all(slot.ready for slot in self.slots):
                await asyncio.sleep(0.3)
            self.report.seconds["start"] = time.monotonic() - started
            self.t0 = time.monotonic()  # the plan's clock starts with the load
            load = asyncio.create_task(self._load(plan))
            faults = [asyncio.create_task(self._inject(f)) for f in plan.faults]
            await asyncio.gather(load, *faults)
            self.report.seconds["load"] = time.monotonic() - self.t0
            await self._catch_up()
            stop.set()  # the workers stop (their compaction and expiry with them)
            await supervisor
            supervisor = None
            for slot in self.slots:
                if slot.worker is not None:
                    await _stop(slot.worker)
            started_checks = time.monotonic()
            await self._check()
            self.report.seconds["checks"] = time.monotonic() - started_checks
        finally:
            stop.set()
            if supervisor is not None:
                await supervisor
            await self._stop_stack()
            await self.http.close()
            for key, value in saved.items():
                if value is None:
                    os.environ.pop(key, None)
                else:
                    os.environ[key] = value
        self.report.seconds["total"] = time.monotonic() - started
        return self.report


async def _stop(process: ManagedProcess, timeout_s: float = 30.0) -> None:
    """SIGTERM, wait without blocking the event loop, then SIGKILL."""
    proc = process.proc
    if proc is None:
        return
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(proc.pid, signal.SIGCONT)  # a paused process cannot stop
            os.kill(proc.pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout_s
        while proc.poll() is None and time.monotonic() < deadline:
            await asyncio.sleep(0.2)
        if proc.poll() is None:
            proc.kill()
            while proc.poll() is None:
                await asyncio.sleep(0.1)
    process.proc = None


def _is_join(pid: int) -> bool:
    try:
        return b"rl_export.worker.join_process" in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="rl-export-soak", description=__doc__.split("\n")[0])
    parser.add_argument("--seed", type=int, default=None, help="default: a random one")
    parser.add_argument("--short", action="store_true", help="the short soak of make test")
    parser.add_argument("--duration", type=float, help="seconds of load (default 600)")
    parser.add_argument("--kills", type=int, help="SIGKILLs (default 24)")
    parser.add_argument("--work", type=Path, default=Path("var/soak"))
    parser.add_argument("--keep", action="store_true", help="keep the data even if it passes")
    parser.add_argument(
        "--guarantee",
        choices=["exactly_once", "at_least_once"],
        default="exactly_once",
        help="the workers' processing guarantee",
    )
    args = parser.parse_args(argv)
    seed = args.seed if args.seed is not None else random.randrange(1, 10**6)
    size = SHORT if args.short else SoakSize()
    if args.duration is not None:
        size = SoakSize(**{**asdict(size), "duration_s": args.duration})
    if args.kills is not None:
        size = SoakSize(**{**asdict(size), "kills": args.kills})
    work = args.work / f"{datetime.now(UTC):%Y%m%dT%H%M%SZ}-seed{seed}"
    work.mkdir(parents=True, exist_ok=True)
    logging.basicConfig(  # the clients' retries while the broker restarts: to a file
        filename=work / "soak.log", level=logging.WARNING,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )  # fmt: skip
    report = asyncio.run(Soak(seed, size, work, guarantee=args.guarantee).run())
    print()
    for line in report.lines():
        print(line)
    path = work / "report.json"
    path.write_text(json.dumps(asdict(report), indent=2))
    print(f"\nreport: {path}")
    if report.ok and not args.keep:
        for name in ("kafka", "seaweedfs", "var"):
            shutil.rmtree(work / name, ignore_errors=True)
    return 0 if report.ok else 1


if __name__ == "__main__":
    sys.exit(main())
