"""Real components for the integration tests, started once per test session.

* ``kafka``: the local single-node Apache Kafka (KRaft) of ``rl_export.local.broker``;
* ``s3``: SeaweedFS serving the S3 API, with ``AWS_ENDPOINT_URL`` pointed at it;
* ``settings``: per test, unique topic names and consumer groups on that broker.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from rl_export.local.broker import LocalKafka
from rl_export.local.seaweed import LOCAL_CREDENTIALS, LocalS3
from rl_export.runtime.net import free_port
from rl_export.runtime.settings import Settings


@pytest.fixture(scope="session")
def kafka(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalKafka]:
    broker = LocalKafka(tmp_path_factory.mktemp("kafka"), free_port(), heap="512m")
    broker.start()
    try:
        yield broker
    finally:
        broker.stop()


@pytest.fixture(scope="session")
def s3(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalS3]:
    server = LocalS3(tmp_path_factory.mktemp("seaweedfs"), bucket="rl-export-test")
    saved = {k: os.environ.get(k) for k in (*LOCAL_CREDENTIALS, "AWS_ENDPOINT_URL")}
    server.start()
    os.environ.update(LOCAL_CREDENTIALS)
    os.environ["AWS_ENDPOINT_URL"] = server.endpoint_url
    try:
        yield server
    finally:
        server.stop()
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


def run_settings(kafka: LocalKafka, run: str, data_dir: Path, store_url: str,
                 **extra: Any) -> Settings:  # fmt: skip
    """Settings of one run on the session's broker: topics and groups named after ``run``,
    four partitions, the table in memory. Quiet chains do not wait and every commit is
    worth compacting, as before those defaults (tests wait for the corpora to show what
    they sent): the tests of the defaults (web/test_fresh_traces.py) set them again."""
    fields: dict[str, Any] = {
        "corpus_max_age_s": 0.0,
        "compaction_min_commits": 1,
        "kafka_bootstrap": kafka.bootstrap,
        "topic_traces": f"{run}.traces.completed",
        "topic_evaluations": f"{run}.evaluations.finished",
        "topic_labels": f"{run}.labels.submitted",
        "topic_trajectories": f"{run}.trajectories",
        "topic_dead_letter": f"{run}.dead-letter",
        "topic_claims": f"{run}.claims",
        "topic_commits": f"{run}.corpus.commits",
        "partitions": 4,
        "app_id": f"{run}-join",
        "sink_group": f"{run}-sink",
        "data_dir": data_dir,
        "store_url": store_url,
        "state_store": "memory://",
    }
    return Settings(**{**fields, **extra})


@pytest.fixture
def settings(kafka: LocalKafka, tmp_path: Path) -> Settings:
    """Settings for one test: its own topics, consumer groups, data dir and local store."""
    return run_settings(kafka, unique("t"), tmp_path / "var", str(tmp_path / "store"))
