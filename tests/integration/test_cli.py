"""The command line against the real broker: bad configuration is one line, not a traceback."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from rl_export.codec import dumps_lines
from rl_export.process import free_port
from rl_export.settings import Settings
from rl_export.topics import TopicSpec, ensure_topics
from tests.factories import event
from tests.integration.workers import settings_env


def run_cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "rl_export.cli", *args],
        capture_output=True, text=True, timeout=60, env=env, check=False,
    )  # fmt: skip


def assert_one_line_error(result: subprocess.CompletedProcess[str], *needles: str) -> None:
    assert result.returncode != 0
    assert "Traceback" not in result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    for needle in needles:
        assert needle in lines[0]


def test_produce_publishes_a_file(settings: Settings, tmp_path: Path) -> None:
    path = tmp_path / "e.jsonl"
    path.write_bytes(dumps_lines([event("trace.completed"), event("label.skipped", "e-2")]))
    result = run_cli(
        "produce", str(path), "--bootstrap", settings.kafka_bootstrap, env=settings_env(settings)
    )
    assert result.returncode == 0, result.stderr
    assert "published 2 events, skipped 0 lines" in result.stdout


def test_unreachable_broker_is_one_line(tmp_path: Path) -> None:
    path = tmp_path / "e.jsonl"
    path.write_bytes(dumps_lines([event("trace.completed")]))
    result = run_cli("produce", str(path), "--bootstrap", f"127.0.0.1:{free_port()}")
    assert_one_line_error(result, "RL_EXPORT_KAFKA_BOOTSTRAP", "no Kafka broker answered")


def test_malformed_bootstrap_is_one_line(tmp_path: Path) -> None:
    result = run_cli("produce", str(tmp_path / "x.jsonl"), "--bootstrap", "no-port")
    assert_one_line_error(result, "RL_EXPORT_KAFKA_BOOTSTRAP", "host:port")
    assert result.returncode == 2


def test_malformed_store_url_is_one_line() -> None:
    result = run_cli("dev", "--rate", "0", env={"PATH": "/usr/bin:/bin",
                                                "RL_EXPORT_STORE_URL": "ftp://x/y"})  # fmt: skip
    assert_one_line_error(result, "RL_EXPORT_STORE_URL", "unsupported store URL scheme")


def test_missing_file_is_one_line() -> None:
    result = run_cli("produce", "/nonexistent/events.jsonl", "--bootstrap", "127.0.0.1:9")
    assert_one_line_error(result, "no such file: /nonexistent/events.jsonl")


def test_differing_partition_counts_are_one_line(settings: Settings, tmp_path: Path) -> None:
    import asyncio

    asyncio.run(ensure_topics(settings.kafka_bootstrap, [TopicSpec(settings.topic_traces, 1, {})]))
    path = tmp_path / "e.jsonl"
    path.write_bytes(dumps_lines([event("trace.completed")]))
    result = run_cli("produce", str(path), env=settings_env(settings))
    assert_one_line_error(result, "RL_EXPORT_PARTITIONS", f"{settings.topic_traces} has 1")
    result = run_cli("worker", env=settings_env(settings))
    assert_one_line_error(result, "RL_EXPORT_PARTITIONS", f"{settings.topic_traces} has 1")


def test_a_worker_with_an_unreachable_broker_is_one_line(settings: Settings) -> None:
    env = settings_env(settings, RL_EXPORT_KAFKA_BOOTSTRAP=f"127.0.0.1:{free_port()}")
    result = run_cli("worker", env=env)
    assert_one_line_error(result, "RL_EXPORT_KAFKA_BOOTSTRAP", "no Kafka broker answered")
