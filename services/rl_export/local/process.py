"""Run a local server process we started ourselves: start, wait until ready, stop by pid.

Used by the local Kafka broker, the local S3 store and the stages of ``rl-export dev``.
Servers bind to 127.0.0.1 only. Every such child dies with the process that started it:
Linux sends it SIGTERM when its parent dies (PR_SET_PDEATHSIG, set by a small trampoline
before the real program is executed), so a SIGKILLed ``rl-export dev`` or test session
leaves no broker behind on its port.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from types import TracebackType

from rl_export.model.errors import LocalStackError


def child_pids(pid: int) -> list[int]:
    """The pids of a process's children (Linux: ``/proc/<pid>/task/*/children``)."""
    found: list[int] = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        found += [int(c) for c in (task / "children").read_text().split()]
    return found


# Runs in the child before the real program: ask Linux for SIGTERM when the parent dies
# (PR_SET_PDEATHSIG = 1; it survives execve), leave if the parent is already gone, then
# execute the program in this same process. A trampoline rather than Popen's preexec_fn,
# which is not safe in a process with threads.
_DIE_WITH_PARENT = (
    "import ctypes, os, signal, sys\n"
    "ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)\n"
    "if os.getppid() != int(sys.argv[1]):\n"
    "    sys.exit(1)\n"
    "os.execvp(sys.argv[2], sys.argv[2:])\n"
)


def dying_with_this_process(argv: Sequence[str]) -> list[str]:
    """``argv`` wrapped so that the child gets SIGTERM when this process dies.

    Linux ties the signal to the *thread* that starts the child: start it from a thread
    that lives as long as the child should (the main thread, or the event loop's).
    """
    if not sys.platform.startswith("linux"):
        return list(argv)
    return [sys.executable, "-S", "-c", _DIE_WITH_PARENT, str(os.getpid()), *argv]


def tail(path: Path, lines: int = 15) -> str:
    """Return the last lines of a log file (empty when it does not exist)."""
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except FileNotFoundError:
        return ""


class ManagedProcess:
    """A child process with its output in a log file, stopped with SIGTERM then SIGKILL."""

    name = "process"
    stop_timeout_s = 30.0

    def __init__(self, log_path: Path) -> None:
        self.log_path = log_path
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    def _spawn(self, argv: Sequence[str], env: dict[str, str] | None = None) -> None:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as log:
            # A session of its own: a Ctrl-C in the terminal reaches us, and we stop the
            # child in order, instead of both racing to shut down.
            self.proc = subprocess.Popen(
                dying_with_this_process(argv),
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=env,
                start_new_session=True,
            )

    def _wait_until(self, ready: Callable[[], bool], timeout_s: float, what: str) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc is not None and self.proc.poll() is not None:
                raise LocalStackError(
                    f"{self.name} exited with code {self.proc.returncode} before {what}; "
                    f"last lines of {self.log_path}:\n{tail(self.log_path)}"
                )
            if ready():
                return
            time.sleep(0.2)
        self.stop()
        raise LocalStackError(
            f"{self.name} did not become ready ({what}) within {timeout_s:.0f}s; "
            f"last lines of {self.log_path}:\n{tail(self.log_path)}"
        )

    def stop(self) -> None:
        """Stop the process we started (SIGTERM, then SIGKILL after the timeout)."""
        proc, self.proc = self.proc, None
        if proc is None or proc.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.kill(proc.pid, signal.SIGTERM)
        try:
            proc.wait(self.stop_timeout_s)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.kill(proc.pid, signal.SIGKILL)
            proc.wait(10)

    def __enter__(self) -> ManagedProcess:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
