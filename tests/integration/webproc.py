"""Run ``rl-export web`` in child processes for the tests, and talk to it."""

from __future__ import annotations

import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from typing import Any

import httpx

from rl_export.local.process import ManagedProcess
from rl_export.runtime.net import free_port
from rl_export.runtime.settings import Settings
from tests.integration.workers import settings_env


class WebProcess(ManagedProcess):
    """One ``rl-export web`` with its own data dir (its own index) and port."""

    name = "rl-export web"

    def __init__(self, settings: Settings, label: str, **env: str) -> None:
        self.data_dir = settings.data_dir / label
        super().__init__(self.data_dir / "web.log")
        self.port = free_port()
        self.metrics_port = free_port()
        self.env = settings_env(
            settings,
            RL_EXPORT_DATA_DIR=str(self.data_dir),
            RL_EXPORT_WEB_PORT=str(self.port),
            RL_EXPORT_WEB_METRICS_PORT=str(self.metrics_port),
            RL_EXPORT_LOG_LEVEL="info",
            **env,
        )

    def start(self, timeout_s: float = 60.0) -> WebProcess:
        self._spawn([sys.executable, "-m", "rl_export.cli", "web"], env=self.env)
        self._wait_until(self.ready, timeout_s, "/readyz answered 200")
        return self

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def ready(self) -> bool:
        try:
            with urllib.request.urlopen(self.base + "/readyz", timeout=1) as response:
                return bool(response.status == 200)
        except (urllib.error.URLError, OSError):
            return False

    def client(self, token: str | None = None, *, org: str = "acme",
               project: str = "bot") -> httpx.Client:  # fmt: skip
        """A client whose relative URLs are under ``/api/v1/<org>/<project>/``."""
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        return httpx.Client(
            base_url=f"{self.base}/api/v1/{org}/{project}/", headers=headers, timeout=60
        )

    def metrics(self) -> str:
        return httpx.get(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=10).text


def wait_for(what: str, check: Callable[[], Any], timeout_s: float = 60.0,
             every_s: float = 0.25) -> Any:  # fmt: skip
    """Poll ``check`` until it returns something truthy; fail naming ``what``."""
    deadline = time.monotonic() + timeout_s
    last: Any = None
    while time.monotonic() < deadline:
        last = check()
        if last:
            return last
        time.sleep(every_s)
    raise AssertionError(f"timed out after {timeout_s:.0f}s waiting for {what} (last: {last!r})")
