"""``make bench-scaling``: 2 -> 4 -> 2 workers under a steady load, as KEDA would scale them.

How a run goes (the steps match :meth:`Scaling.run`); it reuses the soak's stack, load and
checks (:mod:`tests.soak.soak`) with no fault injected:

1. Start a Kafka broker and SeaweedFS of its own under ``--work``, create the topics, start
   two ``rl-export worker`` processes (RocksDB tables, their join processes, the sink),
   each with ``RL_EXPORT_INSTANCE_ID`` (static membership) unless ``--dynamic``.
2. Produce the soak's load at its steady pace for three phases of ``--phase`` seconds:
   two workers, then two more started (scale out), then those two stopped with SIGTERM
   (scale in), as a pod is stopped.
3. All along, every 0.25 s, describe the join and sink consumer groups and read their lag
   (end offsets less committed offsets). For each change: the rebalances observed (the
   group leaving the ``Stable`` state), the partitions that changed owner between the
   assignments before the change and after the group settled, the highest lag after it,
   and the time from the change until the lag is back at its level before the change.
4. Wait until both groups have read everything, stop the workers, and run the soak's
   checks: every corpus's latest view equals the pure fold of the produced events (each
   trace's latest revision once), ``shards verify`` clean, dead letters exact, offsets at
   the end. Print the figures, write them as JSON under ``--work``; exit 1 on a difference.

Only processes this script started are stopped, by their pid.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import shutil
import statistics
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path

import aiohttp
from aiokafka import AIOKafkaConsumer, TopicPartition
from confluent_kafka import ConsumerGroupState
from confluent_kafka.admin import AdminClient

from rl_export.local.seaweed import LOCAL_CREDENTIALS
from tests.harness.reads import committed_offsets, partitions
from tests.harness.workers import WorkerProcess
from tests.soak.soak import Soak, _Slot, _stop
from tests.soak.soak_plan import SoakSize, make_plan

POLL_S = 0.25
Owners = dict[tuple[str, int], str]  # (topic, partition) -> the member that owns it
Sample = tuple[float, bool, Owners, int]  # (monotonic time, group stable, owners, lag)


@dataclass
class Change:
    """What one change of the worker count did to one consumer group."""

    group: str
    change: str
    rebalances: int = 0
    moved: int = 0
    lag_before: float = 0.0
    lag_peak: int = 0
    drain_s: float | None = None  # None: the lag was not back within the phase

    def line(self) -> str:
        drain = "not within the phase" if self.drain_s is None else f"{self.drain_s:.1f}s"
        return (f"  {self.change:<7} {self.group:<5} rebalances {self.rebalances}, partitions "
                f"moved {self.moved}, lag before {self.lag_before:.0f}, peak {self.lag_peak}, "
                f"drained in {drain}")  # fmt: skip


@dataclass
class ScalingReport:
    static: bool
    phase_s: float
    rate: float
    partitions: int
    changes: list[Change] = field(default_factory=list)
    checks: list[str] = field(default_factory=list)
    differences: list[str] = field(default_factory=list)


class Watch:
    """Samples the join and sink groups every :data:`POLL_S`: state, owners and lag."""

    def __init__(self, bootstrap: str, groups: dict[str, tuple[str, Sequence[str]]]) -> None:
        self.bootstrap = bootstrap
        self.groups = groups  # name -> (group id, topics)
        self.admin = AdminClient({"bootstrap.servers": bootstrap, "log_level": 0})
        self.samples: dict[str, list[Sample]] = {g: [] for g in groups}
        self.consumer: AIOKafkaConsumer | None = None

    async def _lag(self, group: str, topics: Sequence[str]) -> int:
        assert self.consumer is not None
        tps: list[TopicPartition] = await partitions(self.bootstrap, topics)
        ends = await self.consumer.end_offsets(tps)
        committed = await committed_offsets(self.bootstrap, group)
        return sum(max(0, end - committed.get(tp, 0)) for tp, end in ends.items())

    def _describe(self, group: str) -> tuple[bool, Owners]:
        description = self.admin.describe_consumer_groups([group])[group].result(10)
        owners: Owners = {}
        for member in description.members:
            who = member.group_instance_id or member.member_id
            for tp in member.assignment.topic_partitions:
                owners[(tp.topic, tp.partition)] = who
        return description.state == ConsumerGroupState.STABLE, owners

    async def run(self, stop: asyncio.Event) -> None:
        self.consumer = AIOKafkaConsumer(bootstrap_servers=self.bootstrap,
                                         isolation_level="read_committed")  # fmt: skip
        await self.consumer.start()
        try:
            while not stop.is_set():
                for name, (group, topics) in self.groups.items():
                    stable, owners = await asyncio.to_thread(self._describe, group)
                    lag = await self._lag(group, topics)
                    self.samples[name].append((time.monotonic(), stable, owners, lag))
                await asyncio.sleep(POLL_S)
        finally:
            await self.consumer.stop()

    def change(self, name: str, label: str, at: float, until: float) -> Change:
        """The figures of the change at ``at`` (the next one, or the end, at ``until``)."""
        return figures(name, label, self.samples[name], at, until)


def figures(group: str, label: str, samples: list[Sample], at: float, until: float) -> Change:
    """What the change at ``at`` did, from the samples of one group (up to ``until``).

    Rebalances: the times the group left ``Stable``. Moved: partitions whose owner after
    the group last settled differs from the owner before the change. Drained: the first
    stable sample after the last rebalance whose lag is back near its level before.
    """
    before = [s for s in samples if at - 10 <= s[0] < at]
    after = [s for s in samples if at <= s[0] < until]
    result = Change(group, label)
    if not before or not after:
        return result
    result.lag_before = statistics.mean(s[3] for s in before)
    result.lag_peak = max(s[3] for s in after)
    was_stable = before[-1][1]
    for _, stable, _, _ in after:
        if was_stable and not stable:
            result.rebalances += 1
        was_stable = stable
    settled = [s for s in after if s[1] and s[2]]
    if settled:
        old, new = before[-1][2], settled[-1][2]
        result.moved = sum(1 for tp, who in new.items() if old.get(tp) != who)
    quiet_from = at
    for t, stable, _, _ in after:
        if not stable:
            quiet_from = t
    threshold = max(result.lag_before * 1.5, result.lag_before + 20)
    for t, stable, _, lag in after:
        if t > quiet_from and stable and lag <= threshold:
            result.drain_s = t - at
            break
    return result


class Scaling(Soak):
    """The soak's stack and load, with the worker count changed instead of faults."""

    def __init__(self, size: SoakSize, work: Path, *, static: bool, phase_s: float) -> None:
        super().__init__(1, size, work, catch_up_s=300.0)
        self.static = static
        self.phase_s = phase_s
        self.scaling = ScalingReport(static, phase_s, size.rate, size.partitions)

    def _launch(self, slot: _Slot) -> None:
        """The soak's worker, with a pod name as its instance id when membership is static."""
        assert self.settings is not None
        assert self.proxy is not None
        env = {"AWS_ENDPOINT_URL": self.proxy.url, **LOCAL_CREDENTIALS}
        if self.static:
            env["RL_EXPORT_INSTANCE_ID"] = f"worker-{slot.index}"
        slot.worker = WorkerProcess(self.settings, f"w{slot.index}", env=env)
        slot.worker.launch()
        slot.launched_at, slot.ready = time.monotonic(), False

    async def run(self) -> ScalingReport:  # type: ignore[override]  # a report of its own
        await self._run()
        return self.scaling

    async def _run(self) -> None:
        stop = asyncio.Event()
        self.http = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=2))
        supervisor: asyncio.Task[None] | None = None
        watcher: asyncio.Task[None] | None = None
        try:
            # 1. the stack and two workers
            self.settings = s = await self._start_stack()
            plan = make_plan(self.seed, self.size, datetime.now(UTC), s.partitioner)
            plan.faults = []  # the changes of worker count are the only events
            for slot in self.slots:
                self._launch(slot)
            supervisor = asyncio.create_task(self._supervise(stop))
            await self._all_ready()
            watch = Watch(s.kafka_bootstrap, {
                "join": (s.app_id, list(s.input_topics)),
                "sink": (s.sink_group, [s.topic_trajectories]),
            })  # fmt: skip
            watcher = asyncio.create_task(watch.run(stop))
            # 2. the load, and the changes at its thirds
            self.t0 = time.monotonic()
            load = asyncio.create_task(self._load(plan))
            await asyncio.sleep(self.phase_s)
            out_at = time.monotonic()
            self.fault("scale out: two more workers")
            self.slots += [_Slot(2), _Slot(3)]
            for slot in self.slots[2:]:
                self._launch(slot)
            await asyncio.sleep(self.phase_s)
            in_at = time.monotonic()
            self.fault("scale in: SIGTERM to the two added workers")
            leaving, self.slots = self.slots[2:], self.slots[:2]
            await asyncio.gather(*(_stop(slot.worker) for slot in leaving if slot.worker))
            await load  # the third phase ends with the load
            end_at = time.monotonic()
            for group in ("join", "sink"):
                self.scaling.changes += [watch.change(group, "2 -> 4", out_at, in_at),
                                         watch.change(group, "4 -> 2", in_at, end_at)]  # fmt: skip
            # 3, 4. catch up, stop, check
            await self._catch_up()
            stop.set()
            await supervisor
            supervisor = None
            await watcher
            watcher = None
            for slot in self.slots:
                if slot.worker is not None:
                    await _stop(slot.worker)
            await self._check()
            self.scaling.checks = [f"shards verify: {self.report.verify}",
                                   "corpora (latest view): " + ", ".join(
                                       f"{k} {v:,}" for k, v in self.report.corpora.items()),
                                   f"sent: {self.report.sent}",
                                   f"left unread: {self.report.unread}"]  # fmt: skip
            self.scaling.differences = self.report.differences
        finally:
            stop.set()
            for task in (supervisor, watcher):
                if task is not None:
                    await task
            await self._stop_stack()
            await self.http.close()

    async def _all_ready(self) -> None:
        deadline = time.monotonic() + 180
        while not all(slot.ready for slot in self.slots):
            if time.monotonic() > deadline:
                raise RuntimeError("the workers did not become ready within 180 s")
            await asyncio.sleep(0.3)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bench-scaling", description=__doc__.split("\n")[0])
    parser.add_argument("--phase", type=float, default=45.0, help="seconds per worker count")
    parser.add_argument("--rate", type=float, default=40.0, help="events per second, about")
    parser.add_argument("--partitions", type=int, default=8)
    parser.add_argument("--dynamic", action="store_true", help="also run without static membership")
    parser.add_argument("--work", type=Path, default=Path("var/bench-scaling"))
    args = parser.parse_args(argv)
    size = SoakSize(duration_s=3 * args.phase, rate=args.rate, kills=0,
                    outages=1, partitions=args.partitions, spread_s=8.0,
                    compaction_interval_s=15.0)  # fmt: skip
    work = args.work / f"{datetime.now(UTC):%Y%m%dT%H%M%SZ}"
    work.mkdir(parents=True, exist_ok=True)
    logging.basicConfig(filename=work / "scaling.log", level=logging.WARNING,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")  # fmt: skip
    reports = []
    for static in (True, False) if args.dynamic else (True,):
        mode = "static" if static else "dynamic"
        report = asyncio.run(Scaling(size, work / mode, static=static, phase_s=args.phase).run())
        reports.append(report)
    ok = True
    for report in reports:
        mode = "static" if report.static else "dynamic"
        print(f"\n{mode} membership: {report.rate:.0f} events/s, {report.partitions} "
              f"partitions, {report.phase_s:.0f} s per phase")  # fmt: skip
        for change in report.changes:
            print(change.line())
        for line in report.checks:
            print(f"  {line}")
        print(f"  differences: {len(report.differences)}")
        for line in report.differences[:20]:
            print(f"    {line}")
        ok = ok and not report.differences
    path = work / "report.json"
    path.write_text(json.dumps([asdict(r) for r in reports], indent=2, default=str))
    print(f"\nreport: {path}")
    if ok:
        for mode in ("static", "dynamic"):
            for name in ("kafka", "seaweedfs", "var"):
                shutil.rmtree(work / mode / name, ignore_errors=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
