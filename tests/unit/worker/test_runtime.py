"""Running the stages of a process: a stop always ends them, a failure stops the others."""

from __future__ import annotations

import asyncio
import time

import pytest

from rl_export.worker.runtime import run_bounded, run_stages


async def test_a_stage_that_ignores_the_stop_is_cancelled_after_the_grace() -> None:
    stop = asyncio.Event()
    cancelled = asyncio.Event()

    async def stuck() -> None:  # waits for a broker that is gone, say
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            cancelled.set()
            raise

    async def polite() -> None:
        await stop.wait()

    tasks = [asyncio.create_task(stuck(), name="stuck"), asyncio.create_task(polite())]
    asyncio.get_running_loop().call_later(0.05, stop.set)
    started = time.monotonic()
    await run_stages(tasks, stop, grace_s=0.2)
    assert cancelled.is_set()
    assert all(task.done() for task in tasks)
    assert time.monotonic() - started < 5


async def test_a_failing_stage_stops_the_others_and_raises() -> None:
    stop = asyncio.Event()

    async def failing() -> None:
        raise RuntimeError("boom")

    async def polite() -> None:
        await stop.wait()

    other = asyncio.create_task(polite())
    with pytest.raises(RuntimeError, match="boom"):
        await run_stages([asyncio.create_task(failing()), other], stop, grace_s=5)
    assert stop.is_set()
    assert other.done()
    assert not other.cancelled()


async def test_stages_that_end_by_themselves_end_the_run() -> None:
    stop = asyncio.Event()

    async def short() -> None:
        await asyncio.sleep(0.01)

    await run_stages([asyncio.create_task(short())], stop, grace_s=5)
    assert stop.is_set()


def test_a_process_ends_in_bounded_time_when_a_task_outlives_its_main() -> None:
    """A Kafka client closing from a task of its own when the broker does not answer (as
    aiokafka's LeaveGroup does, up to 40 s) does not hold the process: ``asyncio.run`` would
    wait for it; ``run_bounded`` cancels it and waits ``leftover_s``."""
    cancelled: list[bool] = []

    async def closing() -> None:  # shrugs off the first cancellation, then waits on
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            cancelled.append(True)
            await asyncio.sleep(30)

    async def main() -> str:
        task = asyncio.get_running_loop().create_task(closing())
        await asyncio.sleep(0.01)
        del task
        return "stopped"

    started = time.monotonic()
    assert run_bounded(main(), leftover_s=0.2) == "stopped"
    assert time.monotonic() - started < 5
    assert cancelled == [True]


def test_run_bounded_raises_what_main_raises_and_closes_its_loop() -> None:
    seen: list[asyncio.AbstractEventLoop] = []

    async def main() -> None:
        seen.append(asyncio.get_running_loop())
        raise ValueError("refused")

    with pytest.raises(ValueError, match="refused"):
        run_bounded(main())
    assert seen[0].is_closed()
