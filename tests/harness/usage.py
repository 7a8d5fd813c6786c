"""What a process has used, as the kernel counts it (``/proc``): CPU seconds and peak RSS.

The benches read them around each catch-up: a worker's own process (the sink) and its join
processes apart, the broker's, and the broker's JIT compiler threads (:func:`compiler_cpu`);
and how busy the whole machine's cores were meanwhile (:func:`machine_cpu`), which says
whether a catch-up was bound by CPU at all.
"""

from __future__ import annotations

import os
from pathlib import Path

from rl_export.local.process import child_pids

_TICK = os.sysconf("SC_CLK_TCK")


def _cpu_of(stat: str) -> float:
    """User and system CPU seconds in the text of a ``stat`` file (a process's or a thread's)."""
    fields = stat.rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / _TICK


def cpu_seconds(pid: int) -> float:
    """User and system CPU time a process has used (``/proc/<pid>/stat``)."""
    return _cpu_of(Path(f"/proc/{pid}/stat").read_text())


def compiler_cpu(pid: int) -> float:
    """CPU seconds a JVM's JIT compiler threads (``C1/C2 CompilerThread``) have used."""
    total = 0.0
    for task in os.listdir(f"/proc/{pid}/task"):
        try:
            stat = Path(f"/proc/{pid}/task/{task}/stat").read_text()
        except OSError:  # the thread has ended
            continue
        if "CompilerThre" in stat[stat.index("(") + 1 : stat.rindex(")")]:
            total += _cpu_of(stat)
    return total


def machine_cpu() -> tuple[float, float]:
    """Seconds all cores have been busy and have existed since boot (``/proc/stat``).

    Busy is everything but idle and waiting for I/O; two readings give the share of the
    machine's cores that was busy between them (:func:`busy_share`).
    """
    with open("/proc/stat") as fh:
        ticks = [int(v) for v in fh.readline().split()[1:9]]  # user .. steal
    total = sum(ticks)
    return (total - ticks[3] - ticks[4]) / _TICK, total / _TICK


def busy_share(before: tuple[float, float], after: tuple[float, float]) -> float:
    """The share (0 to 1) of all the machine's cores that was busy between two readings."""
    span = after[1] - before[1]
    # Seconds come from integer ticks: the two differences may round apart by a hair.
    return min(1.0, (after[0] - before[0]) / span) if span > 0 else 0.0


def worker_cpu(pid: int) -> dict[str, float]:
    """CPU seconds of a worker's own process and of its join processes, apart."""
    return {"worker": cpu_seconds(pid), "join": sum(cpu_seconds(c) for c in child_pids(pid))}


def peak_rss_parts_mib(pid: int) -> list[float]:
    """Peak RSS of a worker's processes: its own (with the sink), then each join process."""
    peaks = []
    for each in [pid, *child_pids(pid)]:
        with open(f"/proc/{each}/status") as fh:
            for line in fh:
                if line.startswith("VmHWM:"):
                    peaks.append(int(line.split()[1]) / 1024)
    return peaks
