"""``rl-export worker`` in a child process: start, readiness, metrics, kill, pause, resume.

Used by the integration tests, the soak and the restart benchmark. The worker's join
processes are its children; :meth:`WorkerProcess.tree` names them all, so a pause stops the
whole worker as a paused machine would.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import urllib.error
import urllib.request
from pathlib import Path

from rl_export.local.process import ManagedProcess, child_pids
from rl_export.runtime.childenv import child_env
from rl_export.runtime.net import free_port
from rl_export.runtime.settings import Settings


def settings_env(settings: Settings, **extra: str) -> dict[str, str]:
    """The environment that configures a child process exactly like ``settings``."""
    return child_env(settings, os.environ, **extra)


def descendants(pid: int) -> list[int]:
    """A process's children, their children, and so on."""
    found: list[int] = []
    with contextlib.suppress(FileNotFoundError, ProcessLookupError):
        for child in child_pids(pid):
            found += [child, *descendants(child)]
    return found


class WorkerProcess(ManagedProcess):
    """One ``rl-export worker`` with its own data dir (``<data_dir>/<label>``) and web port."""

    name = "rl-export worker"

    def __init__(
        self,
        settings: Settings,
        label: str,
        *,
        store: str | None = None,
        env: dict[str, str] | None = None,
    ) -> None:
        self.data_dir = settings.data_dir / label
        super().__init__(self.data_dir / "worker.log")
        self.web_port = free_port()
        self.env = settings_env(
            settings,
            RL_EXPORT_DATA_DIR=str(self.data_dir),
            RL_EXPORT_WORKER_WEB_PORT=str(self.web_port),
            RL_EXPORT_LOG_LEVEL="info",
            **({"RL_EXPORT_STATE_STORE": store} if store else {}),
            **(env or {}),
        )
        self.returncode: int | None = None

    def launch(self) -> None:
        """Start the process and return at once (see :meth:`ready`)."""
        self._spawn([sys.executable, "-m", "rl_export.cli", "worker"], env=self.env)

    def start(self, timeout_s: float = 90.0) -> WorkerProcess:
        self.launch()
        self._wait_until(self.ready, timeout_s, "/readyz answered 200")
        return self

    def start_and_wait_for_exit(self, timeout_s: float) -> int:
        """Run until the process exits by itself (a fault-injected crash); return its code."""
        self.launch()
        assert self.proc is not None
        try:
            self.returncode = self.proc.wait(timeout_s)
        finally:
            self.stop()
        return self.returncode

    def ready(self) -> bool:
        try:
            with urllib.request.urlopen(self.url("/readyz"), timeout=1) as response:
                return bool(response.status == 200)
        except (urllib.error.URLError, OSError):
            return False

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.web_port}{path}"

    def metric(self, name: str, **labels: str) -> float:
        """Read one sample from the worker's /metrics (0 when absent)."""
        with urllib.request.urlopen(self.url("/metrics"), timeout=5) as response:
            text = response.read().decode()
        want = name + ("{" + ",".join(f'{k}="{v}"' for k, v in sorted(labels.items())) + "}"
                       if labels else "")  # fmt: skip
        total = 0.0
        for line in text.splitlines():
            if line.startswith(want + " "):
                total += float(line.rsplit(" ", 1)[1])
        return total

    def tree(self) -> list[int]:
        """The worker's pid and its descendants' (its join processes)."""
        if self.proc is None:
            return []
        return [self.proc.pid, *descendants(self.proc.pid)]

    def kill(self) -> None:
        """SIGKILL: no shutdown, no final commit or flush (the join processes die with it)."""
        if self.proc is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.proc.pid, signal.SIGKILL)
            self.proc.wait(30)
            self.proc = None

    def pause(self) -> list[int]:
        """SIGSTOP the worker and its join processes, as a paused machine; return the pids."""
        pids = self.tree()
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGSTOP)
        return pids

    @staticmethod
    def resume(pids: list[int]) -> None:
        for pid in reversed(pids):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)


def log_tail(path: Path, lines: int = 20) -> str:
    """The end of a worker's log (empty when there is none)."""
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except FileNotFoundError:
        return ""
