"""The command line against the real broker: bad configuration is one line, not a traceback."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

from rl_export.model.codec import dumps_lines
from rl_export.runtime.net import free_port
from rl_export.runtime.settings import Settings
from rl_export.stream.topics import TopicSpec, ensure_topics
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
    assert_one_line_error(result, "--bootstrap", "host:port")
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
    dead = f"127.0.0.1:{free_port()}"
    env = settings_env(settings, RL_EXPORT_KAFKA_BOOTSTRAP=dead, RL_EXPORT_KAFKA_WAIT_S="0")
    result = run_cli("worker", env=env)
    assert_one_line_error(result, "RL_EXPORT_KAFKA_BOOTSTRAP", "no Kafka broker answered")


def test_a_worker_waits_for_its_broker_then_says_why_it_gave_up(settings: Settings) -> None:
    dead = f"127.0.0.1:{free_port()}"
    env = settings_env(settings, RL_EXPORT_KAFKA_BOOTSTRAP=dead, RL_EXPORT_KAFKA_WAIT_S="3")
    started = time.monotonic()
    result = run_cli("worker", env=env)
    assert time.monotonic() - started >= 3
    assert result.returncode != 0
    assert "Traceback" not in result.stderr
    assert "waiting for it" in result.stderr
    last = result.stderr.strip().splitlines()[-1]
    assert "RL_EXPORT_KAFKA_BOOTSTRAP" in last
    assert "no Kafka broker answered" in last


def test_a_worker_waiting_for_its_broker_stops_on_sigterm(settings: Settings) -> None:
    dead = f"127.0.0.1:{free_port()}"
    env = settings_env(settings, RL_EXPORT_KAFKA_BOOTSTRAP=dead, RL_EXPORT_KAFKA_WAIT_S="60")
    worker = subprocess.Popen(
        [sys.executable, "-m", "rl_export.cli", "worker"],
        stderr=subprocess.PIPE, text=True, env=env,
    )  # fmt: skip
    try:
        time.sleep(3)
        assert worker.poll() is None  # still waiting
        worker.send_signal(signal.SIGTERM)
        _, stderr = worker.communicate(timeout=15)
    finally:
        if worker.poll() is None:
            worker.kill()
            worker.wait()
    assert worker.returncode == 0, stderr
    assert "Traceback" not in stderr


def test_replay_then_verify_then_cat(tmp_path: Path) -> None:
    from rl_export.local.synthetic import generate

    events = tmp_path / "events.jsonl"
    events.write_bytes(dumps_lines(generate(30, seed=4)) + b"not json\n")
    store = tmp_path / "store"
    result = run_cli("replay", str(events), "--store", str(store), "--run-id", "backfill-1")
    assert result.returncode == 0, result.stderr
    assert "replay backfill-1:" in result.stdout
    assert "unroutable: 1" in result.stdout
    assert any(p.name.startswith("replay-backfill-1-") for p in store.rglob("*") if p.is_dir())

    result = run_cli("shards", "verify", "--store", str(store))
    assert result.returncode == 0, result.stderr
    result = run_cli("shards", "cat", "--store", str(store), "--org", "acme", "--project",
                     "support-bot", "--corpus", "traces", "--latest")  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert len(result.stdout.splitlines()) == 30

    # Corrupt one shard: verify says which, and exits non-zero.
    shard = next(p for p in store.rglob("*.jsonl") if "/data/" in str(p))
    shard.write_bytes(shard.read_bytes().replace(b'"revision":', b'"revision": ', 1))
    result = run_cli("shards", "verify", "--store", str(store))
    assert result.returncode == 1
    assert shard.name in result.stderr
    assert "Traceback" not in result.stderr


def test_shards_cat_without_a_corpus_is_one_line(tmp_path: Path) -> None:
    result = run_cli("shards", "cat", "--store", str(tmp_path))
    assert_one_line_error(result, "--org", "required")
    result = run_cli("shards", "ls", "--store", "s3://")
    assert_one_line_error(result, "--store", "bucket")


def test_a_closed_pipe_ends_a_command_quietly(tmp_path: Path) -> None:
    """`rl-export shards cat ... | head`: the reader goes away; exit 0, no traceback."""
    from rl_export.local.synthetic import generate

    events = tmp_path / "events.jsonl"
    events.write_bytes(dumps_lines(generate(200, seed=5)))
    store = tmp_path / "store"
    assert run_cli("replay", str(events), "--store", str(store)).returncode == 0
    proc = subprocess.Popen(
        [sys.executable, "-m", "rl_export.cli", "shards", "cat", "--store", str(store),
         "--org", "acme", "--project", "support-bot", "--corpus", "traces"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip
    assert proc.stdout is not None
    assert proc.stderr is not None
    assert proc.stdout.read(100).startswith(b'{"trace_id":')  # more than a pipe buffer follows
    proc.stdout.close()
    stderr = proc.stderr.read().decode()
    proc.stderr.close()
    assert proc.wait(60) == 0, stderr
    assert stderr == ""


RUBRIC_FILE = {
    "guidelines": "Rate *fairly*.",
    "questions": [
        {"name": "quality", "title": "Quality", "kind": "rating", "min": 1, "max": 4},
        {"name": "tone", "title": "Tone", "kind": "choice", "options": [
            {"value": "rude", "title": "Rude"}, {"value": "warm", "title": "Warm"}]},
    ],
}  # fmt: skip


def test_rubric_get_set_then_labels_of_it_in_records_exports_and_agreement(
    tmp_path: Path,
) -> None:
    """``rubric get|set``, then labels of version 1 replayed: their answers in the records, a
    CSV column per question, agreement per question, and a split by a field of few values
    warned about (issue 56)."""
    import orjson

    from rl_export.local.synthetic import generate

    store = tmp_path / "store"
    where = ["--org", "acme", "--project", "support-bot", "--store", str(store)]
    got = run_cli("rubric", "get", *where)
    assert got.returncode == 0, got.stderr
    assert orjson.loads(got.stdout)["version"] == 0
    rubric = tmp_path / "rubric.json"
    rubric.write_bytes(orjson.dumps(RUBRIC_FILE))
    made = run_cli("rubric", "set", str(rubric), *where)
    assert made.returncode == 0, made.stderr
    assert "rubric version 1 made" in made.stdout
    assert "unchanged" in run_cli("rubric", "set", str(rubric), *where).stdout
    shown = orjson.loads(run_cli("rubric", "get", *where).stdout)
    assert (shown["version"], [q["name"] for q in shown["questions"]]) == (1, ["quality", "tone"])
    bad = tmp_path / "bad.json"
    bad.write_bytes(orjson.dumps({"questions": [{"name": "Bad Name", "title": "x"}]}))
    assert_one_line_error(run_cli("rubric", "set", str(bad), *where), "FILE")

    events = generate(30, seed=4)
    first = next(e["trace_id"] for e in events if e["event_type"] == "trace.completed")
    for n, (who, answers) in enumerate((("ana", {"quality": 3, "tone": "warm"}),
                                        ("bo", {"quality": 1, "tone": "rude"}))):  # fmt: skip
        events.append(event("label.submitted", f"v1-{n}", "2026-01-01T00:00:00Z", labeler=who,
                            org="acme", project="support-bot", trace_id=first, rubric_version=1,
                            rubric=answers))  # fmt: skip
    lines = tmp_path / "events.jsonl"
    lines.write_bytes(dumps_lines(events))
    assert run_cli("replay", str(lines), "--store", str(store)).returncode == 0
    csv_file = tmp_path / "out.csv"
    result = run_cli("export", *where, "--source", "traces", "--format", "csv",
                     "-o", str(csv_file))  # fmt: skip
    assert result.returncode == 0, result.stderr
    import csv
    import io

    rows = {r["trace_id"]: r for r in csv.DictReader(io.StringIO(csv_file.read_text()))}
    assert rows[first]["answers.quality"] == "[3,1]"
    assert rows[first]["answers.tone"] == '["warm","rude"]'
    result = run_cli("export", *where, "--source", "traces", "--format", "trajectory",
                     "--split", "train", "--splits", "train=0.9,eval=0.1", "--split-by",
                     "scenario", "-o", str(tmp_path / "train.jsonl"))  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert "rl-export: warning: --split-by scenario has" in result.stderr
    report = orjson.loads(run_cli("agreement", *where, "--rubric-version", "1").stdout)
    assert report["by_question"]["rubric_version"] == 1
    assert report["by_question"]["questions"]["tone"]["level"] == "nominal"
    assert report["by_question"]["multi_labeled"] == 1
