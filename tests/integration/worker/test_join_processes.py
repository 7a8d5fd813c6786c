"""The worker's join processes: they live and die with the worker, and answer through it."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from rl_export.local.process import child_pids
from rl_export.local.synthetic import generate
from rl_export.model.partitioning import partition_for
from rl_export.runtime.settings import Settings
from tests.integration.stream.test_join_loop import wait_for_final
from tests.integration.workers import WorkerProcess, comparable, expected_final, publish


def join_children(pid: int) -> list[int]:
    """The pids of a worker's join processes."""
    return [
        child
        for child in child_pids(pid)
        if b"rl_export.worker.join_process" in Path(f"/proc/{child}/cmdline").read_bytes()
    ]


def gone(pid: int) -> bool:
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except FileNotFoundError:
        return True
    return "\nState:\tZ" in status  # exited; only its parent has not reaped it


def wait_until(condition: Callable[[], bool], timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.1)
    return False


async def test_the_join_processes_answer_through_the_worker_and_die_with_it(
    settings: Settings,
) -> None:
    events = generate(40, seed=41, duplicate_rate=0.1)
    expected = expected_final(events)
    worker = WorkerProcess(settings, "w1", env={"RL_EXPORT_JOIN_PROCESSES": "2"}).start()
    try:
        assert worker.pid is not None
        children = join_children(worker.pid)
        assert len(children) == 2
        await publish(settings, events)
        await wait_for_final(settings, expected)
        # Both members got partitions, and the worker's page sums what they did.
        assert worker.metric("rl_export_join_snapshots_total") >= len(expected)
        events_seen = sum(
            worker.metric("rl_export_join_events_total", event_type=t, outcome=o)
            for t in ("trace.completed", "evaluation.finished", "label.submitted",
                      "label.skipped", "label.retracted")
            for o in ("accepted", "duplicate", "pending")
        )  # fmt: skip
        assert events_seen == len(events)
        worker.kill()  # SIGKILL: the children cannot be told
        assert wait_until(lambda: all(gone(c) for c in children), 10), "a join process survived"
    finally:
        worker.stop()


async def test_a_join_process_that_dies_stops_the_worker_with_one_line(
    settings: Settings,
) -> None:
    worker = WorkerProcess(settings, "w1").start()
    try:
        assert worker.pid is not None
        assert worker.proc is not None
        first = join_children(worker.pid)[0]
        os.kill(first, signal.SIGKILL)
        code = worker.proc.wait(60)
    finally:
        worker.stop()
    assert code == 1
    log = worker.log_path.read_text()
    assert "exited with code -9" in log
    assert "Traceback" not in log


async def test_the_join_in_the_worker_process_gives_the_same_snapshots(
    settings: Settings,
) -> None:
    events = generate(40, seed=42, duplicate_rate=0.1)
    expected = expected_final(events)
    with WorkerProcess(settings, "w1", env={"RL_EXPORT_JOIN_PROCESSES": "0"}).start() as worker:
        assert worker.pid is not None
        assert join_children(worker.pid) == []
        await publish(settings, events)
        final = await wait_for_final(settings, expected)
    assert {k: comparable(v) for k, v in final.items()} == {
        k: comparable(v) for k, v in expected.items()
    }


async def test_three_join_processes_keep_each_trace_in_one_member(settings: Settings) -> None:
    """Three members of four partitions: range assignment keeps the inputs co-partitioned.

    aiokafka's default (round robin) would give one member traces-1 and another
    evaluations-1, and their events would never meet.
    """
    events = generate(60, seed=43, duplicate_rate=0.1)
    expected = expected_final(events)
    with WorkerProcess(settings, "w1", env={"RL_EXPORT_JOIN_PROCESSES": "3"}).start():
        await publish(settings, events)
        final = await wait_for_final(settings, expected)
    assert {k: comparable(v) for k, v in final.items()} == {
        k: comparable(v) for k, v in expected.items()
    }


@pytest.mark.soak  # a paused process waited out, about 45 s: make soak runs it
async def test_a_paused_sibling_holding_its_stores_stalls_nothing_else(
    settings: Settings,
) -> None:
    """A join process paused past its session keeps its RocksDB stores locked.

    Its sibling is given every partition: it joins the partitions whose stores it can open
    and waits for the others without holding anything the group needs (it used to wait 30 s
    under its lock, then died with StoreLockedError and stopped the worker). Once resumed,
    the paused one lets go and everything is joined.
    """
    local = settings.model_copy(update={"state_store": "rocksdb://", "session_timeout_s": 6.0})
    worker = WorkerProcess(local, "w1", env={"RL_EXPORT_JOIN_PROCESSES": "2"}).start()
    first = generate(20, seed=44, duplicate_rate=0)
    try:
        assert worker.pid is not None
        assert worker.proc is not None
        await publish(local, first)
        await wait_for_final(local, expected_final(first))
        paused = join_children(worker.pid)[0]
        held = assigned_to(worker.log_path, paused)
        assert held, "the paused process had partitions"
        os.kill(paused, signal.SIGSTOP)
        later = [e | {"trace_id": f"{e['trace_id']}-b"} for e in generate(40, seed=45)]
        await publish(local, later)
        elsewhere = [e for e in later if partition_for(e["trace_id"].encode(), 4) not in held]
        try:  # joined by the sibling while the paused one still holds its stores
            await wait_for_final(local, expected_final(first + elsewhere), timeout_s=90)
            await asyncio.sleep(40)  # longer than the old 30 s wait for a store, under a lock
            assert worker.proc.poll() is None, "the worker stopped"
        finally:
            os.kill(paused, signal.SIGCONT)
        await wait_for_final(local, expected_final(first + later), timeout_s=120)
        assert worker.proc.poll() is None
    finally:
        worker.stop()
    assert "StoreLockedError" not in worker.log_path.read_text()


def assigned_to(log: Path, pid: int) -> set[int]:
    """The partitions a join process was last assigned, from the worker's log."""
    found: set[int] = set()
    for line in log.read_text(errors="replace").splitlines():
        if f"[{pid}]" in line and "join assigned partitions" in line:
            found = {int(p) for p in line.rsplit("[", 1)[1].rstrip("]").split(",") if p.strip()}
    return found
