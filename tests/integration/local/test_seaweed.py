"""The local SeaweedFS: it serves its bucket whatever AWS credentials this process holds."""

from __future__ import annotations

from pathlib import Path

import pytest

from rl_export.local.seaweed import LOCAL_CREDENTIALS, LocalS3


def test_a_server_started_with_credentials_in_the_environment_serves_its_bucket(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`weed` would take the AWS_* variables as an S3 identity and answer 403 to anonymous
    requests; a test session sets them for its clients before the soak starts a server."""
    for name, value in LOCAL_CREDENTIALS.items():
        monkeypatch.setenv(name, value)
    server = LocalS3(tmp_path / "seaweedfs", bucket="with-credentials-around")
    try:
        server.start(timeout_s=30)  # raises, with the last answer, when the bucket is refused
    finally:
        server.stop()
