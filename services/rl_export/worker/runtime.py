"""Process plumbing shared by the worker and its join processes.

Logging, signals, dying with a parent process, and running stages side by side until one
fails.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import logging
import os
import signal

from rl_export.common.settings import Settings


async def run_stages(tasks: list[asyncio.Task[None]], stop: asyncio.Event) -> None:
    """Wait for the stages; one that fails stops the others and raises its error."""
    try:
        done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
        for task in done:
            task.result()
    finally:
        stop.set()
        for task in tasks:
            if not task.done():
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(asyncio.shield(task), 40)
                task.cancel()


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
