"""The index's gate: ingests side by side up to a cap, maintenance alone and first."""

from __future__ import annotations

import threading
import time

import pytest

from rl_export.index.gate import Gate


def test_at_most_writers_ingests_hold_it_at_once() -> None:
    gate = Gate(2)
    inside, most = 0, 0
    lock = threading.Lock()

    def ingest() -> None:
        nonlocal inside, most
        with gate.shared():
            with lock:
                inside += 1
                most = max(most, inside)
            time.sleep(0.02)
            with lock:
                inside -= 1

    threads = [threading.Thread(target=ingest) for _ in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(10)
    assert most == 2


def test_maintenance_waits_for_ingests_and_goes_before_later_ones() -> None:
    gate = Gate(2)
    order: list[str] = []
    held = threading.Event()
    release = threading.Event()

    def long_ingest() -> None:
        with gate.shared():
            held.set()
            release.wait(10)
            order.append("ingest 1 ends")

    def maintenance() -> None:
        with gate.exclusive():
            order.append("maintenance")

    def later_ingest() -> None:
        with gate.shared():
            order.append("ingest 2")

    first = threading.Thread(target=long_ingest)
    first.start()
    held.wait(10)
    keeper = threading.Thread(target=maintenance)
    keeper.start()
    while not gate._waiting_exclusive:  # the maintenance waits now
        time.sleep(0.001)
    later = threading.Thread(target=later_ingest)
    later.start()
    time.sleep(0.05)
    assert order == []  # neither runs while the first ingest holds the gate
    release.set()
    for thread in (first, keeper, later):
        thread.join(10)
    assert order == ["ingest 1 ends", "maintenance", "ingest 2"]


def test_a_gate_needs_a_writer() -> None:
    with pytest.raises(ValueError, match="at least 1"):
        Gate(0)
