"""Process plumbing shared by the worker and its join processes.

Logging, signals, dying with a parent process, running stages side by side until one
fails, and a process's event loop that ends in bounded time.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import logging
import os
import signal
from collections.abc import Coroutine
from typing import Any, TypeVar

from rl_export.runtime.settings import Settings

T = TypeVar("T")
LEFTOVER_S = 1.0
"""How long a process waits, once its main coroutine has ended, for tasks still running
(a Kafka client's closing, cancelled by a stop cut short) before it closes its loop."""

log = logging.getLogger(__name__)


async def run_stages(tasks: list[asyncio.Task[None]], stop: asyncio.Event, grace_s: float) -> None:
    """Run the stages until ``stop`` is set or one fails; then stop them all, in bounded time.

    A stage that fails stops the others and its error is raised. Once stopping, a stage
    finishes the batch in hand and commits it, which takes under a second with a broker
    that answers. One that has not ended within ``grace_s`` (``RL_EXPORT_STOP_GRACE_S``:
    a transaction waiting for a broker that is gone, say) is cancelled, and given 5 s more
    to close its clients. Everything the stages write is exactly once, so a stop cut short
    loses nothing: the next start reads on from the committed offsets and the changelog.
    """
    stopping = asyncio.create_task(stop.wait(), name="stop")
    try:
        pending: set[asyncio.Task[None] | asyncio.Task[bool]] = {*tasks, stopping}
        while pending:
            done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
            for task in done:
                if task is not stopping:
                    task.result()  # a failed stage: raise its error
            if stopping in done or pending == {stopping}:
                break
    finally:
        stop.set()
        stopping.cancel()
        left = [task for task in tasks if not task.done()]
        if left:
            _, late = await asyncio.wait(left, timeout=grace_s)
            for task in late:
                log.warning("%s did not stop within %.0fs of the stop: cancelled",
                            task.get_name(), grace_s)  # fmt: skip
                task.cancel()
            if late:
                await asyncio.wait(late, timeout=5.0)


def run_bounded(main: Coroutine[Any, Any, T], leftover_s: float = LEFTOVER_S) -> T:
    """``asyncio.run(main)``, but the tasks still running once ``main`` has ended are given
    ``leftover_s`` to end after they are cancelled, not forever.

    A stop cut short (:func:`run_stages`, a broker that does not answer) cancels a stage
    while its Kafka clients close; aiokafka's consumer then sends LeaveGroup from a task of
    its own, which waits for the broker's answer up to its request timeout (40 s).
    ``asyncio.run`` waits for every such task, so the process outlived its grace by that
    long. Nothing is lost by not waiting: what the stages write is exactly once, and the
    group notices the member gone when its session ends.
    """
    loop = asyncio.new_event_loop()
    try:
        asyncio.set_event_loop(loop)
        return loop.run_until_complete(main)
    finally:
        try:
            left = [task for task in asyncio.all_tasks(loop) if not task.done()]
            for task in left:
                task.cancel()
            if left:
                _, late = loop.run_until_complete(asyncio.wait(left, timeout=leftover_s))
                if late:
                    log.warning("%d tasks did not end within %.0fs of the stop (a broker that "
                                "does not answer): left", len(late), leftover_s)  # fmt: skip
            loop.run_until_complete(asyncio.wait_for(loop.shutdown_asyncgens(), leftover_s))
            loop.run_until_complete(asyncio.wait_for(loop.shutdown_default_executor(), leftover_s))
        except TimeoutError:
            log.warning("the loop's generators or threads did not end within %.0fs: left",
                        leftover_s)  # fmt: skip
        finally:
            asyncio.set_event_loop(None)
            loop.close()


_LOG_LEVELS = {"crit": "CRITICAL", "error": "ERROR", "warn": "WARNING", "info": "INFO",
               "debug": "DEBUG"}  # fmt: skip


def configure_logging(settings: Settings) -> None:
    logging.basicConfig(
        level=_LOG_LEVELS[settings.log_level],
        format="[%(asctime)s] [%(process)d] [%(levelname)s] %(name)s: %(message)s",
        force=True,  # the command line set up warnings-only logging before
    )
    logging.getLogger("aiokafka").setLevel(logging.WARNING)


def stop_on_signals(stop: asyncio.Event) -> None:
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)


def die_with(parent_pid: int) -> None:
    """Ask Linux to SIGKILL this process when its parent dies; exit if it already has."""
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != parent_pid:
        raise SystemExit(1)


_PR_SET_PDEATHSIG = 1  # from <linux/prctl.h>
