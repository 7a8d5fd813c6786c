"""The worker's join stage in child processes, supervised.

:class:`ChildJoins` runs the join loop (:mod:`rl_export.stream.loop`) in ``join_processes``
children, each one member of the join's consumer group, dying with the worker; the worker's
``/metrics`` shows their metrics summed (:func:`sum_metrics`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import sys
from collections.abc import Iterable

from aiohttp import ClientError, ClientSession, ClientTimeout
from prometheus_client import CollectorRegistry, Metric, generate_latest
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import Collector

from rl_export.model.errors import KafkaSecurityError, WorkerError
from rl_export.runtime.childenv import child_env
from rl_export.runtime.net import LOOPBACK
from rl_export.runtime.settings import Settings, env_name

log = logging.getLogger(__name__)


class _Child:
    """One join process: its OS process and its private loopback port."""

    def __init__(self, index: int) -> None:
        self.index = index
        self.port = 0  # bound when the process starts
        self.proc: asyncio.subprocess.Process | None = None
        self.refusals: int | None = None  # our end of the pipe a refused child writes to

    def refusal(self) -> KafkaSecurityError | None:
        """What the broker refused the child, if it said so before it exited."""
        if self.refusals is None:
            return None
        try:
            said = os.read(self.refusals, 64 * 1024).decode(errors="replace")
        except BlockingIOError:
            return None
        setting, _, detail = said.partition("\t")
        return KafkaSecurityError(setting, detail) if detail else None

    def close(self) -> None:
        if self.refusals is not None:
            os.close(self.refusals)
            self.refusals = None


class ChildJoins:
    """The join in ``join_processes`` child processes, so it can use more than one core.

    Each child is ``python -m rl_export.join_process PARENT_PID FD REFUSALS``, one more member of
    the join's consumer group (the partitions are shared among all the children of all the
    workers, like Kafka Streams' stream threads). A child takes its settings from the same
    ``RL_EXPORT_`` environment, writes to the worker's log, serves ``/readyz`` and
    ``/metrics`` on a loopback socket that this parent binds, passes down as file
    descriptor ``FD`` and alone reads (so no other process can take the port between the
    parent's choice and the child's bind), and dies with the parent
    (PR_SET_PDEATHSIG), so a worker killed with SIGKILL leaves no join behind. When a child
    exits on its own, the worker stops with an error: a worker without its join must not
    look healthy. The worker's ``/metrics`` shows the children's join metrics summed.
    """

    def __init__(self, settings: Settings, count: int) -> None:
        self.settings = settings
        self.children = [_Child(i) for i in range(count)]
        self.http: ClientSession | None = None

    def _instance(self, index: int) -> dict[str, str]:
        """Each join process is its own static member of the join's group."""
        if self.settings.instance_id is None:
            return {}
        return {env_name("instance_id"): f"{self.settings.instance_id}-{index}"}

    async def run(self, stop: asyncio.Event) -> None:
        self.http = ClientSession(timeout=ClientTimeout(total=5))
        exits: dict[asyncio.Task[int], _Child] = {}
        stopping = asyncio.create_task(stop.wait())
        try:
            for child in self.children:
                child.refusals, refusals = os.pipe()
                os.set_blocking(child.refusals, False)
                with socket.create_server((LOOPBACK, 0)) as listening:  # the child's copy stays
                    child.port = listening.getsockname()[1]
                    child.proc = await asyncio.create_subprocess_exec(
                        sys.executable, "-m", "rl_export.worker.join_process", str(os.getpid()),
                        str(listening.fileno()), str(refusals),
                        env=child_env(self.settings, os.environ, **self._instance(child.index)),
                        stdin=asyncio.subprocess.DEVNULL,
                        pass_fds=(listening.fileno(), refusals),
                    )  # fmt: skip
                os.close(refusals)  # the child's copy stays
                exits[asyncio.create_task(child.proc.wait())] = child
                log.info("join process %d started (pid %d)", child.index, child.proc.pid)
            done, _ = await asyncio.wait([*exits, stopping], return_when=asyncio.FIRST_COMPLETED)
            for task in done:
                if task in exits:
                    # A child the broker refused said why: the worker ends with its line.
                    raise exits[task].refusal() or WorkerError(
                        f"join process {exits[task].index} exited with code {task.result()}"
                    )
        finally:
            stopping.cancel()
            try:
                await self._stop(list(exits))
            finally:  # cancelled too (the worker's grace ran out): no child outlives this
                self._kill()
                await self.http.close()
                for child in self.children:
                    child.close()

    async def _stop(self, exits: list[asyncio.Task[int]]) -> None:
        """SIGTERM: each child finishes its batch and commits, like a worker, for as long as
        the stop grace allows; the worker cancels this stage then, and :meth:`_kill` ends the
        children still running (each would cancel its own batch at the same moment)."""
        for _, proc in self._running():
            proc.terminate()
        if exits:
            await asyncio.wait(exits, timeout=self.settings.stop_grace_s)

    def _kill(self) -> None:
        """SIGKILL the children still running: like any SIGKILL, safe for exactly once."""
        for child, proc in self._running():
            log.warning("join process %d did not stop within %.0fs: killed", child.index,
                        self.settings.stop_grace_s)  # fmt: skip
            with contextlib.suppress(ProcessLookupError):
                proc.kill()

    def _running(self) -> list[tuple[_Child, asyncio.subprocess.Process]]:
        """The children whose process has not exited (as far as this event loop has seen)."""
        return [(c, c.proc) for c in self.children if c.proc and c.proc.returncode is None]

    async def _get(self, child: _Child, path: str) -> tuple[int, bytes] | None:
        if self.http is None or child.proc is None or child.proc.returncode is not None:
            return None
        try:
            async with self.http.get(f"http://{LOOPBACK}:{child.port}{path}") as response:
                return response.status, await response.read()
        except (ClientError, OSError, TimeoutError):
            return None  # not listening yet, or going away

    async def is_ready(self) -> bool:
        answers = await asyncio.gather(*(self._get(c, "/readyz") for c in self.children))
        return all(a is not None and a[0] == 200 for a in answers)

    async def metrics_text(self) -> bytes:
        answers = await asyncio.gather(*(self._get(c, "/metrics") for c in self.children))
        return sum_metrics([a[1].decode() for a in answers if a is not None and a[0] == 200])


def sum_metrics(texts: list[str]) -> bytes:
    """Prometheus texts of processes with the same metrics, as one text of their sums.

    Counters, histogram buckets, sums and counts, and gauges (table keys) all add up across
    the join processes, which own disjoint partitions. The ``_created`` timestamps do not
    add up, and are left out.
    """
    families: dict[str, Metric] = {}
    values: dict[str, dict[tuple[str, tuple[tuple[str, str], ...]], float]] = {}
    for text in texts:
        for family in text_string_to_metric_families(text):
            if family.name.endswith("_created"):
                continue
            if family.name not in families:
                families[family.name] = Metric(family.name, family.documentation, family.type)
                values[family.name] = {}
            for sample in family.samples:
                key = (sample.name, tuple(sorted(sample.labels.items())))
                values[family.name][key] = values[family.name].get(key, 0.0) + sample.value
    registry = CollectorRegistry()
    registry.register(_Families(families, values))
    return generate_latest(registry)


class _Families(Collector):
    def __init__(
        self,
        families: dict[str, Metric],
        values: dict[str, dict[tuple[str, tuple[tuple[str, str], ...]], float]],
    ) -> None:
        self.families = families
        self.values = values

    def collect(self) -> Iterable[Metric]:
        for name, family in self.families.items():
            for (sample, labels), value in self.values[name].items():
                family.add_sample(sample, dict(labels), value)
            yield family
