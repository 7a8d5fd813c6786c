"""A worker's stop: bounded by ``RL_EXPORT_STOP_GRACE_S`` even when its broker is gone."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from rl_export.formats.specs import DEFAULT_CORPORA
from rl_export.local.broker import LocalKafka
from rl_export.local.synthetic import generate
from rl_export.runtime.net import free_port
from tests.integration.conftest import run_settings
from tests.integration.corpora.test_sink import assert_verified, wait_for_corpora
from tests.integration.workers import WorkerProcess, expected_corpora, publish

GRACE_S = 2.0
CORPUS = DEFAULT_CORPORA[0].name


@pytest.fixture
def own_broker(tmp_path: Path) -> Iterator[LocalKafka]:
    """A broker of this test's own, which it can stop: not the session's."""
    broker = LocalKafka(tmp_path / "kafka", free_port(), heap="256m")
    broker.start()
    try:
        yield broker
    finally:
        broker.stop()


async def test_a_worker_whose_broker_stopped_answering_stops_within_its_grace(
    own_broker: LocalKafka, tmp_path: Path
) -> None:
    """The broker is paused (SIGSTOP: a hung broker, or one cut off by the network) while the
    worker catches up: every request of its join processes and its sink, a transaction, an
    offset commit, leaving the group, waits for an answer that does not come. SIGTERM ends
    the worker within the grace (and the 5 s its stages get to close), with exit code 0; it
    used to take 30 s. Then, with the broker back, a new worker writes the corpora exactly
    once: the cut-short stop lost and repeated nothing.

    A killed broker refuses connections instead, and the stop then waits only when it
    catches a transaction or an offset commit in flight: on a fast run the backlog is done
    by then, so the test would not show the bound."""
    settings = run_settings(
        own_broker, "stop", tmp_path / "var", str(tmp_path / "store"),
        stop_grace_s=GRACE_S, shard_max_age_s=0.5,
    )  # fmt: skip
    events = generate(8000, seed=51, duplicate_rate=0.02)  # 23,000 events
    await publish(settings, events)
    worker = WorkerProcess(settings, "w1", env={"RL_EXPORT_JOIN_PROCESSES": "2"}).start()
    try:
        deadline = time.monotonic() + 60
        while worker.metric("rl_export_sink_commits_total", corpus=CORPUS) == 0:  # writing
            assert time.monotonic() < deadline, "the worker wrote nothing in 60 s"
            await asyncio.sleep(0.05)
        assert own_broker.proc is not None
        os.kill(own_broker.proc.pid, signal.SIGSTOP)
        assert worker.proc is not None
        stopping = time.monotonic()
        worker.proc.send_signal(signal.SIGTERM)
        code = worker.proc.wait(60)
        took = time.monotonic() - stopping
    finally:
        worker.stop()
        if own_broker.proc is not None:
            os.kill(own_broker.proc.pid, signal.SIGCONT)
    log = worker.log_path.read_text()
    assert code == 0
    assert took < GRACE_S + 5.0 + 3.0, f"the stop took {took:.1f}s"
    assert f"did not stop within {GRACE_S:.0f}s" in log  # it was waiting for the broker
    # aiokafka logs its own tracebacks when a request fails; none may pass through ours.
    assert "/rl_export/" not in "".join(
        line for line in log.splitlines() if line.lstrip().startswith("File ")
    )
    assert "Unclosed" not in log

    with WorkerProcess(settings, "w2").start():
        got = await wait_for_corpora(settings, events)
    assert got == expected_corpora(events)
    await assert_verified(settings)
