"""Pool processes whose parent is killed: start a script that prints its pool's pids, kill
it, and see whether they end (``rl_export.runtime.orphans``)."""

from __future__ import annotations

import os
import subprocess
import sys
import time

from rl_export.runtime.orphans import PARENT_CHECK_S


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/status") as status:
            return not any(line.startswith("State:\tZ") for line in status)
    except FileNotFoundError:
        return False


def children_of_a_killed(script: str, *args: str) -> list[int]:
    """Run ``script``, read the pids it prints, kill it; the pids."""
    with subprocess.Popen(
        [sys.executable, "-c", script, *args], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
        text=True, env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
    ) as parent:  # fmt: skip
        try:
            assert parent.stdout is not None
            pids = [int(pid) for pid in parent.stdout.readline().split()]
            assert len(pids) == 2
            assert all(map(alive, pids))
        finally:
            parent.kill()
    return pids


def gone(pids: list[int]) -> bool:
    deadline = time.monotonic() + 20 * PARENT_CHECK_S
    while any(map(alive, pids)) and time.monotonic() < deadline:
        time.sleep(0.1)
    return not any(map(alive, pids))
