"""One join process of a worker:
``python -m rl_export.worker.join_process PARENT_PID FD [REFUSALS]``.

Started only by the worker (:class:`rl_export.worker.joins.ChildJoins`), never by hand: the
join loop, and its ``/readyz`` and ``/metrics`` on the loopback socket the parent bound and
passed down as file descriptor ``FD``, which only the parent reads. A join the broker refuses
(TLS, SASL, an ACL) writes the refusal (``setting<TAB>detail``) to the pipe ``REFUSALS``
before it exits with code 2, and the worker ends with that line.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import sys

from rl_export.kafka.client import KafkaConnection, watch_refusals
from rl_export.model.errors import KafkaSecurityError
from rl_export.runtime.gctune import tune_gc
from rl_export.runtime.settings import Settings
from rl_export.worker.child_pages import ChildPages
from rl_export.worker.inprocess import InProcessJoin
from rl_export.worker.runtime import (
    configure_logging,
    die_with,
    run_bounded,
    run_stages,
    stop_on_signals,
)

log = logging.getLogger(__name__)


async def serve_join(settings: Settings, listening: socket.socket, stop: asyncio.Event) -> None:
    """The join child's main: the join, and its pages on the parent's loopback socket."""
    join = InProcessJoin(settings)
    pages = ChildPages(listening, join.is_ready, join.metrics_text)
    refused: list[KafkaSecurityError] = []

    def on_refusal(exc: KafkaSecurityError) -> None:
        log.error("join: %s; stopping", exc)
        refused.append(exc)
        stop.set()

    try:
        with watch_refusals(KafkaConnection.of(settings), on_refusal):
            await run_stages(
                [asyncio.create_task(join.run(stop), name="join")], stop, settings.stop_grace_s
            )
    finally:
        await pages.close()
    if refused:
        raise refused[0]


def run_join_process(parent_pid: int, fd: int, refusals: int | None = None) -> int:
    """A join child of a worker (see :class:`ChildJoins`); return the exit code."""
    die_with(parent_pid)
    listening = socket.socket(fileno=fd)
    settings = Settings()
    configure_logging(settings)

    async def main() -> None:
        stop = asyncio.Event()
        stop_on_signals(stop)
        tune_gc()

        async def watch_parent() -> None:  # where PR_SET_PDEATHSIG does not exist
            while not stop.is_set():
                if os.getppid() != parent_pid:
                    log.error("the worker (pid %d) is gone; the join stops", parent_pid)
                    stop.set()
                await asyncio.sleep(1)

        watcher = asyncio.create_task(watch_parent())
        log.info("join process starting: group %s", settings.app_id)
        try:
            await serve_join(settings, listening, stop)
        finally:
            watcher.cancel()
        log.info("join process stopped")

    try:
        run_bounded(main())
    except KafkaSecurityError as exc:  # one line, not a traceback; the worker stops too
        log.error("join process: %s", exc)
        if refusals is not None:
            with contextlib.suppress(OSError):
                os.write(refusals, f"{exc.setting}\t{exc.detail}".encode()[: 64 * 1024])
        return 2
    return 0


if __name__ == "__main__":
    if len(sys.argv) not in (3, 4) or not all(a.isdigit() for a in sys.argv[1:]):
        sys.exit("usage: python -m rl_export.worker.join_process PARENT_PID FD [REFUSALS] "
                 "(the worker runs this)")  # fmt: skip
    refusals = int(sys.argv[3]) if len(sys.argv) == 4 else None
    sys.exit(run_join_process(int(sys.argv[1]), int(sys.argv[2]), refusals))
