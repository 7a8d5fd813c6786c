"""``rl-export dev``: its broker and stages die with it, whether it is stopped or killed."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from rl_export.local.process import child_pids
from rl_export.runtime.net import free_port, port_open


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"  # a zombie has exited
    except FileNotFoundError:
        return False


def descendants(pid: int) -> list[int]:
    found = []
    for child in child_pids(pid):
        found += [child, *descendants(child)]
    return found


# SIGHUP (about 17 s, a stop in order like the other stops tested here) runs in make soak.
@pytest.mark.parametrize(
    "sig", [pytest.param(signal.SIGHUP, marks=pytest.mark.soak), signal.SIGKILL]
)
def test_the_broker_and_the_stages_die_with_dev(tmp_path: Path, sig: signal.Signals) -> None:
    """SIGHUP (its terminal closed) stops the stack in order; SIGKILL leaves nothing either."""
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("RL_EXPORT_")}
    env |= {"RL_EXPORT_WORKER_WEB_PORT": str(free_port()), "RL_EXPORT_JOIN_PROCESSES": "1",
            "RL_EXPORT_WEB_METRICS_PORT": str(free_port()),
            "RL_EXPORT_STORE_URL": str(tmp_path / "store")}  # fmt: skip
    dev = subprocess.Popen(
        [sys.executable, "-m", "rl_export.cli", "dev", "--rate", "0", "--port", str(port),
         "--data-dir", str(tmp_path / "var")],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env, start_new_session=True,
    )  # fmt: skip
    assert dev.stdout is not None
    try:
        output = []
        for line in dev.stdout:
            output.append(line.decode())
            if b"Press Ctrl-C" in line:
                break
        assert port_open(port), "".join(output)
        children = descendants(dev.pid)
        assert len(children) >= 2, children  # the broker and the worker (and its join)
        os.kill(dev.pid, sig)
        dev.wait(90)
        deadline = time.monotonic() + 60
        while any(alive(p) for p in children) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert [p for p in children if alive(p)] == []
        assert not port_open(port)
        if sig == signal.SIGHUP:  # stopped in order, like Ctrl-C
            assert dev.returncode == 0
            assert "stopped." in dev.stdout.read().decode()
    finally:
        if dev.poll() is None:
            dev.kill()
            dev.wait()
        dev.stdout.close()
