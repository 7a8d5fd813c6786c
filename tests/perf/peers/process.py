"""Run one system of ``make bench-peers`` in a process of its own and measure it.

The process prints JSON lines to its standard output (a file): ``first_record_at``, the wall
time it handled its first record, starts the clock, so its start-up (imports, a JVM, joining
the group, restoring state) is reported apart. The harness samples, every ``poll_s`` (50 ms),
the CPU seconds of the process and of the broker and the machine's busy time
(:mod:`tests.harness.usage`), and asks whether the system is done (for a peer: its group has
committed the end of every input topic, which under exactly-once happens in the transaction
that makes its last output visible). The clock stops at that answer; the CPU and busy time at
the start are interpolated between the two samples around ``first_record_at``. Peak RSS is
the process's own (``VmHWM``), read before it is stopped with SIGTERM.
"""

from __future__ import annotations

import asyncio
import bisect
import json
import os
import signal
import subprocess
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.errors import KafkaError

from rl_export.local.process import tail
from tests.harness.usage import (
    busy_share,
    compiler_cpu,
    cpu_seconds,
    machine_cpu,
    peak_rss_parts_mib,
)

POLL_S = 0.05


@dataclass(frozen=True)
class Sample:
    """Counters read at one moment: CPU seconds of the system and of the broker, the
    machine's busy and existing core-seconds (:func:`tests.harness.usage.machine_cpu`)."""

    at: float
    own: float
    broker: float
    busy: float
    total: float


def sample(pid: int, broker_pid: int | None) -> Sample:
    busy, total = machine_cpu()
    broker = cpu_seconds(broker_pid) if broker_pid else 0.0
    return Sample(time.time(), cpu_seconds(pid), broker, busy, total)


def at(samples: Sequence[Sample], moment: float) -> Sample:
    """The counters at ``moment``, linear between the samples around it (clamped at the ends).

    ``samples`` are in time order.
    """
    if not samples:
        raise ValueError("no samples")
    times = [s.at for s in samples]
    i = bisect.bisect_left(times, moment)
    if i == 0:
        return samples[0]
    if i == len(samples):
        return samples[-1]
    a, b = samples[i - 1], samples[i]
    f = (moment - a.at) / (b.at - a.at) if b.at > a.at else 1.0

    def mix(x: float, y: float) -> float:
        return x + (y - x) * f

    return Sample(
        moment, mix(a.own, b.own), mix(a.broker, b.broker), mix(a.busy, b.busy),
        mix(a.total, b.total),
    )  # fmt: skip


def span(start: Sample, end: Sample) -> dict[str, Any]:
    """What a run used between two readings: seconds, CPU seconds, the machine's busy share."""
    return {
        "seconds": end.at - start.at,
        "cpu_seconds": {"own": end.own - start.own, "broker": end.broker - start.broker},
        "machine_busy": busy_share((start.busy, start.total), (end.busy, end.total)),
    }


def said(path: Path) -> dict[str, Any]:
    """What a process has said on its standard output: its JSON lines merged (others skipped)."""
    found: dict[str, Any] = {}
    try:
        text = path.read_text(errors="replace")
    except FileNotFoundError:
        return found
    for line in text.splitlines():
        try:
            value = json.loads(line)
        except ValueError:
            continue
        if isinstance(value, dict):
            found.update(value)
    return found


class Committed:
    """Whether a consumer group has committed the end of its input topics (one admin client).

    The input topics are written once, before the rounds, without transactions: their end
    offsets are fixed, and a group is done when its committed offset equals every one.
    """

    def __init__(self, bootstrap: str, group: str, ends: Mapping[TopicPartition, int]) -> None:
        self.group = group
        self.ends = dict(ends)
        self.admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)

    async def __aenter__(self) -> Committed:
        await self.admin.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.admin.close()

    async def left(self) -> int:
        """Records of the input topics the group has not committed past."""
        try:
            offsets = await self.admin.list_consumer_group_offsets(self.group)
        except KafkaError:  # the group does not exist yet
            offsets = {}
        done = {tp: o.offset for tp, o in offsets.items() if o.offset >= 0}
        return sum(max(0, end - done.get(tp, 0)) for tp, end in self.ends.items())


async def input_ends(
    bootstrap: str, topics: Sequence[str], partitions: int
) -> dict[TopicPartition, int]:
    """The end offset of every partition of the input topics."""
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap)
    await consumer.start()
    try:
        tps = [TopicPartition(t, p) for t in topics for p in range(partitions)]
        return dict(await consumer.end_offsets(tps))
    finally:
        await consumer.stop()


async def measure(
    name: str, cmd: list[str], work: Path, *, done: Callable[[dict[str, Any]], Awaitable[bool]],
    broker_pid: int | None, env: Mapping[str, str] | None = None, cwd: Path | None = None,
    timeout_s: float = 1800.0, poll_s: float = POLL_S,
) -> dict[str, Any]:  # fmt: skip
    """Start ``cmd``, wait until ``done`` (given what it has said), measure; stop it.

    ``done`` is asked at each sample. The result: ``seconds`` from its first record to the
    answer that it was done (or to ``last_record_at`` when it says one), ``start_seconds``
    before its first record, CPU seconds of its process and of the broker over the same
    span, the machine's busy share, its peak RSS, the CPU seconds of its JIT compiler threads
    over its whole life (a JVM's), and everything it said.
    """
    out_path, log_path = work / f"{name}.out", work / f"{name}.log"
    launched = time.time()
    proc = launch(cmd, out_path, log_path, env=env, cwd=cwd)
    samples: list[Sample] = []
    try:
        while True:
            samples.append(sample(proc.pid, broker_pid))
            if proc.poll() is not None:
                raise RuntimeError(
                    f"{name} exited early with code {proc.returncode}; the end of {log_path}:\n"
                    + tail(log_path, 30)
                )
            told = said(out_path)
            if "first_record_at" in told and await done(told):
                end = sample(proc.pid, broker_pid)
                break
            if time.time() - launched > timeout_s:
                raise TimeoutError(f"{name} was not done after {timeout_s:.0f} s; see {log_path}")
            await asyncio.sleep(poll_s)
        rss = sum(peak_rss_parts_mib(proc.pid))
        jit = compiler_cpu(proc.pid)  # a JVM's, over its whole life; none in Python
    finally:
        stop(proc)
    first = float(told["first_record_at"])
    if "last_record_at" in told:  # the system timed itself to its last record
        end = Sample(float(told["last_record_at"]), end.own, end.broker, end.busy, end.total)
    used = span(at(samples, first), end)
    return used | {
        "start_seconds": first - launched, "peak_rss_mib": rss, "jit_cpu_seconds": jit,
        "said": told,
    }  # fmt: skip


def launch(
    cmd: list[str], out_path: Path, log_path: Path, *, env: Mapping[str, str] | None,
    cwd: Path | None,
) -> subprocess.Popen[bytes]:  # fmt: skip
    """Start ``cmd``, its standard output to ``out_path`` and its errors to ``log_path``."""
    out_path.parent.mkdir(parents=True, exist_ok=True)
    with open(out_path, "wb") as out, open(log_path, "wb") as log_file:  # the child keeps its own
        return subprocess.Popen(
            cmd, stdout=out, stderr=log_file, env=dict(env) if env is not None else None, cwd=cwd
        )


def stop(proc: subprocess.Popen[bytes], grace_s: float = 60.0) -> None:
    """SIGTERM, then SIGKILL if it has not ended within ``grace_s``."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(grace_s)
        except subprocess.TimeoutExpired:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait()
