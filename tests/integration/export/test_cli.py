"""``rl-export export`` and ``stats`` as people run them: the real command, exit codes,
stderr, stdout, no partial file; and exports from S3 with attachments over s3:// (plain http
refused)."""

from __future__ import annotations

import asyncio
import csv
import io
import json
import subprocess
import sys
import uuid
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from aiohttp import web

from rl_export.corpora.layout import CorpusRef
from rl_export.corpora.store import LocalStore, S3Store
from rl_export.export import write_export
from rl_export.export.attachments import AttachmentPolicy
from rl_export.local.seaweed import LocalS3
from rl_export.privacy.attachment_sources import parse_sources
from tests.exportdata import ORG, PROJECT, build_story, replay_events
from tests.records import trace_events


def rl_export(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[bytes]:
    argv = [sys.executable, "-m", "rl_export.cli", *args]
    return subprocess.run(argv, capture_output=True, timeout=120, check=False, cwd=cwd)


@pytest.fixture(scope="module")
def store_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("cli-store")
    asyncio.run(build_story(LocalStore(root)))
    return root


def base(store: Path, source: str = "evaluator") -> list[str]:
    return ["export", "--store", str(store), "--org", ORG, "--project", PROJECT,
            "--source", source]  # fmt: skip


def test_export_to_a_file_and_to_stdout(store_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "sft.jsonl"
    result = rl_export(*base(store_dir), "--format", "messages", "--passed", "true", "-o", str(out))
    assert result.returncode == 0, result.stderr
    assert b"exported 3 rows" in result.stderr
    rows = [json.loads(line) for line in out.read_bytes().splitlines()]
    assert len(rows) == 3
    assert all(list(r) == ["messages"] for r in rows)
    assert sorted(p.name for p in tmp_path.iterdir()) == [  # no temporary left
        "sft.jsonl", "sft.jsonl.manifest.json"]  # fmt: skip
    result = rl_export(*base(store_dir), "--format", "messages", "--passed", "true", "-o", "-")
    assert result.returncode == 0, result.stderr
    assert result.stdout == out.read_bytes()


def test_masks_rl_prompts_parquet_and_a_card(store_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "sft.jsonl"
    result = rl_export(*base(store_dir), "--format", "messages", "--mask-failed-turns",
                       "--mask-types", "goal_met", "--card", "-o", str(out))  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert b"0 failing outcomes named a turn outside their conversation" in result.stderr
    assert f"dataset card {tmp_path / 'README.md'}".encode() in result.stderr
    rows = [json.loads(line) for line in out.read_bytes().splitlines()]
    assert all(m["weight"] in (0, 1) for r in rows for m in r["messages"]
               if m["role"] == "assistant")  # fmt: skip
    assert '"mask_types":["goal_met"]' in (tmp_path / "README.md").read_text()
    prompts = tmp_path / "prompts.parquet"
    result = rl_export(*base(store_dir), "--format", "rl_prompts", "-o", str(prompts))
    assert result.returncode == 0, result.stderr
    import pyarrow.parquet as pq

    assert pq.read_table(prompts).column_names == [
        "data_source", "prompt", "ability", "reward_model", "extra_info"]  # fmt: skip
    result = rl_export(*base(store_dir), "--format", "rl_prompts", "-o", "-")
    assert all(json.loads(line)["ability"] == "agent" for line in result.stdout.splitlines())
    result = rl_export(*base(store_dir), "--format", "messages", "--card", "-o", "-")
    assert result.returncode == 2
    assert b"--card: writes README.md beside the output file" in result.stderr


def test_csv_with_columns_on_stdout(store_dir: Path) -> None:
    result = rl_export(*base(store_dir, "human"), "--format", "csv", "--columns",
                       "trace_id:id,rubric.safety:safety,reward", "-o", "-")  # fmt: skip
    assert result.returncode == 0, result.stderr
    rows = list(csv.DictReader(io.StringIO(result.stdout.decode(), newline="")))
    assert [list(r) for r in rows[:1]] == [["id", "safety", "reward"]]
    assert len(rows) == 3


def test_stats_prints_one_json_object(store_dir: Path) -> None:
    result = rl_export("stats", "--store", str(store_dir), "--org", ORG, "--project", PROJECT,
                       "--source", "evaluator", "--min-reward", "0.5")  # fmt: skip
    assert result.returncode == 0, result.stderr
    stats = json.loads(result.stdout)
    assert set(stats) == {"records", "avg_reward", "pass_rate", "human_labeled"}
    assert stats["records"] == 3


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--format", "xml"], "format: unknown format 'xml'"),
        (["--format", "csv", "--columns", "trace_id,colour"], "columns: no column 'colour'"),
        (["--format", "messages", "--min-reward", "abc"], "min-reward: 'abc' is not a number"),
        (["--format", "messages", "--since", "yesterday"], "since: expected an RFC 3339"),
        (["--format", "preference", "--pair-by", "colour"], "pair-by: no record field"),
        (["--format", "preference", "--margin", "lots"], "margin: 'lots' is not a number"),
        (["--format", "messages", "--margin", "0.2"], "margin: only applies"),
        (["--format"], "argument --format: expected one argument"),
        (["--format", "kto", "--mask-failed-turns"], "mask-failed-turns: only applies to"),
        (["--format", "messages", "--mask-types", "tone"], "mask-types: only applies with"),
        (["--format", "csv", "--card"], "card: a dataset card goes with"),
        (["--format", "messages", "--redact", "secrets,emails"], "redact: unknown kind 'emails'"),
        (["--format", "csv", "--redact", "none,ip"], "redact: 'none' cannot be combined"),
        (["--format", "messages", "--chat-style", "chatml"], "chat-style: unknown chat style"),
        (["--format", "trajectory", "--chat-style", "raw"], "chat-style: only applies to"),
        (["--format", "kto", "--system", "drop"], "system: unknown system mode 'drop'"),
        (["--format", "messages", "--completion", "rest"], "completion: only applies to"),
        (["--format", "preference", "--completion", "all"], "completion: 'all' is not turn"),
    ],
)
def test_bad_input_is_one_line_exit_2_and_no_file(
    store_dir: Path, tmp_path: Path, args: list[str], message: str
) -> None:
    out = tmp_path / "out.file"
    result = rl_export(*base(store_dir), *args, "-o", str(out))
    stderr = result.stderr.decode()
    assert result.returncode == 2, stderr
    assert len(stderr.strip().splitlines()) == 1, stderr
    assert message in stderr
    assert "Traceback" not in stderr
    assert not any(tmp_path.iterdir())


def test_chat_styles_and_an_empty_preference_export(store_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "sft.jsonl"
    result = rl_export(*base(store_dir), "--format", "messages", "--chat-style", "openai",
                       "--system", "merge", "-o", str(out))  # fmt: skip
    assert result.returncode == 0, result.stderr
    rows = [json.loads(line) for line in out.read_bytes().splitlines()]
    assert rows
    assert all(m["role"] != "system" for r in rows for m in r["messages"])
    calls = [c for r in rows for m in r["messages"] for c in m.get("tool_calls") or []]
    assert calls
    assert all(isinstance(c["function"]["arguments"], str) for c in calls)
    # No two trajectories share a prompt and a trace id: no pair, and stderr says why.
    out = tmp_path / "dpo.jsonl"
    result = rl_export(*base(store_dir), "--format", "preference", "--pair-by", "trace_id",
                       "-o", str(out))  # fmt: skip
    stderr = result.stderr.decode()
    assert result.returncode == 0, stderr
    assert out.read_bytes() == b""
    assert "no preference row: no two of the" in stderr
    assert "share a prompt" in stderr
    assert "Traceback" not in stderr


def test_unknown_source_and_no_data_say_so(store_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "out.jsonl"
    result = rl_export(*base(store_dir, "labels"), "--format", "messages", "-o", str(out))
    assert result.returncode == 2
    assert b"source: unknown source 'labels'" in result.stderr
    result = rl_export("export", "--store", str(store_dir), "--org", ORG, "--project", "nobody",
                       "--source", "human", "--format", "messages", "-o", str(out))  # fmt: skip
    assert result.returncode == 2
    assert b"no data for acme/nobody/human" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
    assert not any(tmp_path.iterdir())
    # Filters that match nothing: a valid, empty file, and exit 0.
    result = rl_export(*base(store_dir), "--format", "json", "--scenario", "none", "-o", str(out))
    assert result.returncode == 0, result.stderr
    assert json.loads(out.read_bytes()) == []


# --- S3 and http ----------------------------------------------------------------------------


@pytest.fixture
def http_files(tmp_path: Path) -> Iterator[str]:
    """A local HTTP server with one file (and 404 for anything else), on loopback."""
    loop = asyncio.new_event_loop()
    app = web.Application()

    async def report(_: web.Request) -> web.Response:
        return web.Response(body=b"%PDF-1.4 report")

    app.router.add_get("/report.pdf", report)
    runner = web.AppRunner(app)
    loop.run_until_complete(runner.setup())
    site = web.TCPSite(runner, "127.0.0.1", 0)
    loop.run_until_complete(site.start())
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    import threading

    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        loop.call_soon_threadsafe(loop.stop)
        thread.join(5)
        loop.run_until_complete(runner.cleanup())
        loop.close()


async def test_zip_from_s3_fetches_allowed_s3_attachments_only(
    s3: LocalS3, http_files: str, tmp_path: Path
) -> None:
    run = uuid.uuid4().hex[:8]
    store = S3Store(s3.bucket, f"export-{run}")
    uploads = S3Store(s3.bucket, f"uploads-{run}")
    try:
        await uploads.put("trace.png", b"\x89PNG fake")
        await uploads.put("big.png", b"x" * 2048)
        await uploads.put("notes.txt", b"key AKIAIOSFODNN7EXAMPLE here")
        await store.put("uploads/own.png", b"the store's own object")
        base = f"s3://{s3.bucket}/uploads-{run}/"
        attachments = [
            {"name": name, "uri": uri, "content_type": kind, "size": 9}
            for name, uri, kind in (
                ("trace.png", f"{base}trace.png", "image/png"),
                ("notes.txt", f"{base}notes.txt", "text/plain"),
                ("big.png", f"{base}big.png", "image/png"),
                ("gone.png", f"{base}gone.png", "image/png"),
                ("own.png", f"s3://{s3.bucket}/{store.prefix}uploads/own.png", "image/png"),
                ("report.pdf", f"{http_files}/report.pdf", "application/pdf"),
            )
        ]
        events = trace_events(1, score=0.9, passed=True, attachments=attachments)
        await replay_events(store, events, "s3")
        path = tmp_path / "out.zip"
        # Even with the whole bucket allowed, the store's own prefix stays closed.
        policy = AttachmentPolicy(sources=parse_sources(f"s3://{s3.bucket}/"), max_bytes=1024)
        summary = await write_export(store, CorpusRef(ORG, PROJECT, "evaluator"), format="zip",
                                     out=path, attachments=policy)  # fmt: skip
        assert (summary.records, summary.attachments, summary.attachment_errors) == (1, 2, 4)
        assert (summary.redactions["secrets"], summary.redactions["unscanned"]) == (1, 1)
        with zipfile.ZipFile(path) as archive:
            assert archive.read("files/tr-001/trace.png") == b"\x89PNG fake"
            assert archive.read("files/tr-001/notes.txt") == b"key [REDACTED:SECRETS] here"
            manifest = json.loads(archive.read("files/manifest.json"))
        assert [(m["name"], m["status"]) for m in manifest] == [
            ("trace.png", "fetched"), ("notes.txt", "fetched"), ("big.png", "too_large"),
            ("gone.png", "missing"), ("own.png", "not_allowed"), ("report.pdf", "not_allowed"),
        ]  # fmt: skip
    finally:
        await store.close()
        await uploads.close()


def test_redact_replaces_and_the_summary_counts(tmp_path: Path) -> None:
    root = tmp_path / "store"
    key, mail = "AKIAIOSFODNN7EXAMPLE", "jane.doe@acme-corp.com"
    events = trace_events(
        1, score=0.9, passed=True,
        messages=[{"role": "user", "content": f"key {key}, mail {mail}, twice {mail}"}],
    )  # fmt: skip
    asyncio.run(replay_events(LocalStore(root), events, "r"))
    out = tmp_path / "out.jsonl"
    result = rl_export(*base(root), "--format", "messages", "--redact", "pii", "-o", str(out))
    assert result.returncode == 0, result.stderr
    assert b"; redacted: email 2, phone 0, credit_card 0, iban 0, ip 0\n" in result.stderr
    assert json.loads(out.read_bytes())["messages"][0]["content"] == (
        f"key {key}, mail [REDACTED:EMAIL], twice [REDACTED:EMAIL]"
    )
    result = rl_export(*base(root), "--format", "messages", "-o", "-")  # the default: secrets
    assert b"; redacted: secrets 1\n" in result.stderr
    assert key.encode() not in result.stdout
    result = rl_export(*base(root), "--format", "messages", "--redact", "none", "-o", "-")
    assert b"nothing redacted (--redact none)" in result.stderr
    assert key.encode() in result.stdout
