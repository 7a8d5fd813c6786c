"""Reading a corpus at a pinned version (DESIGN.md section 5, "Versions"): the same bytes
after new traffic, a re-score, compactions and expiry; ``shards verify`` checks versions;
the command line."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import pytest

from rl_export.cli import main
from rl_export.common.errors import NoDataError, VersionError
from rl_export.corpora.compaction import compact, expire
from rl_export.corpora.layout import ChainError, CorpusRef
from rl_export.corpora.shards import verify
from rl_export.corpora.store import LocalStore, MemoryStore, ObjectStore
from rl_export.corpora.versions import delete_version, version_key
from rl_export.export import write_export
from rl_export.export.latest import ViewPosition
from rl_export.export.versions import pin, pinned
from tests.exportdata import ORG, PROJECT, replay_events
from tests.factories import event
from tests.trainingdata import traffic

EVALUATOR = CorpusRef(ORG, PROJECT, "evaluator")


def rescore(trace: int, score: float) -> dict[str, Any]:
    tid = f"tr-{trace:04d}"
    return event(
        "evaluation.finished", f"e2-{tid}", "2026-01-02T00:00:00Z", org=ORG, project=PROJECT,
        trace_id=tid, evaluation_id=f"ev2-{tid}",
        results=[{"evaluator": "judge", "score": score, "passed": False, "reasoning": "again"}],
    )  # fmt: skip


async def export_at(store: ObjectStore, out: Path, name: str | None = None) -> str:
    """The sha256 of the export's bytes (of the version ``name``, else the latest view)."""
    at = None if name is None else (await pinned(store, EVALUATOR, name, None)).at
    summary = await write_export(store, EVALUATOR, format="trajectory", out=out, at=at)
    return summary.sha256


async def churn(store: ObjectStore, rounds: int) -> None:
    """New traffic, a re-score of an old trace, a compaction and an expiry with no retention
    left, ``rounds`` times."""
    for n in range(rounds):
        await replay_events(store, [*traffic(6, start=100 + 6 * n), rescore(n + 1, 0.05)],
                            f"more-{n}")  # fmt: skip
        assert await compact(store, EVALUATOR, writer="test") is not None
        await expire(store, EVALUATOR, keep_generations=1, retention_s=0, now=time.time() + 60)


async def test_a_version_reads_the_same_bytes_after_traffic_compactions_and_expiry(
    tmp_path: Path,
) -> None:
    store = MemoryStore()
    await replay_events(store, traffic(12), "one")
    await compact(store, EVALUATOR, writer="test")
    await replay_events(store, traffic(6, start=12), "two")  # a tail after the compaction
    pinned_at = await export_at(store, tmp_path / "at-pin.jsonl")
    version = await pin(store, EVALUATOR, "v1", "the first run")
    assert version.generation == 1
    assert version.ends

    await churn(store, 3)

    assert await export_at(store, tmp_path / "again.jsonl", "v1") == pinned_at
    assert await export_at(store, tmp_path / "latest.jsonl") != pinned_at
    report = await verify(store)
    assert report.ok, report.problems
    assert report.versions == 1
    assert report.summary().endswith(", 1 versions")

    # Deleting the version releases what only it kept: the next expiry removes it.
    await delete_version(store, EVALUATOR, "v1")
    deleted = await expire(store, EVALUATOR, keep_generations=1, retention_s=0,
                           now=time.time() + 60)  # fmt: skip
    assert EVALUATOR.compaction_key(1) in deleted
    assert (await verify(store)).ok


async def test_without_the_version_expiry_removes_what_it_read(tmp_path: Path) -> None:
    """The control of the test above: the same churn with no version pinned leaves the
    position unreadable, so keeping objects is what makes the bytes come back."""
    store = MemoryStore()
    await replay_events(store, traffic(12), "one")
    await compact(store, EVALUATOR, writer="test")
    await replay_events(store, traffic(6, start=12), "two")
    version = await pin(store, EVALUATOR, "v1")
    await delete_version(store, EVALUATOR, "v1")
    await churn(store, 3)
    assert EVALUATOR.compaction_key(1) not in await store.list(EVALUATOR.compacted_prefix())
    with pytest.raises(ChainError, match="no longer exists"):
        await write_export(store, EVALUATOR, format="trajectory", out=tmp_path / "x.jsonl",
                           at=ViewPosition.from_json(version.position()))  # fmt: skip


async def test_verify_names_a_version_that_no_longer_resolves() -> None:
    store = MemoryStore()
    await replay_events(store, traffic(12), "one")
    await compact(store, EVALUATOR, writer="test")
    await pin(store, EVALUATOR, "v1")
    await store.delete(EVALUATOR.compaction_key(1))  # behind expiry's back
    report = await verify(store)
    assert not report.ok
    assert any(p.startswith(f"{version_key(EVALUATOR, 'v1')}: its compaction") and "gone" in p
               for p in report.problems)  # fmt: skip


async def test_pinning_a_corpus_without_data_or_an_unknown_version_is_an_error() -> None:
    store = MemoryStore()
    with pytest.raises(NoDataError, match="nothing to pin"):
        await pin(store, EVALUATOR, "v1")
    with pytest.raises(VersionError, match=r"no version 'nope' of acme/bot/evaluator"):
        await pinned(store, EVALUATOR, "nope", None)


def test_the_command_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = tmp_path / "store"
    store = LocalStore(root)
    asyncio.run(replay_events(store, traffic(12), "one"))
    common = ["--store", str(root), "--org", ORG, "--project", PROJECT]
    assert main(["versions", "create", *common, "--corpus", "evaluator", "v1",
                 "--note", "run 7"]) == 0  # fmt: skip
    created = capsys.readouterr().out
    assert '"name":"v1"' in created
    assert '"note":"run 7"' in created
    assert main(["versions", "create", *common, "--corpus", "evaluator", "v1"]) == 2
    assert "version 'v1' of acme/bot/evaluator already exists" in capsys.readouterr().err
    pin_file = tmp_path / "pin.jsonl"
    assert main(["export", *common, "--source", "evaluator", "--format", "trajectory",
                 "-o", str(pin_file)]) == 0  # fmt: skip
    asyncio.run(replay_events(store, [*traffic(6, start=50), rescore(1, 0.05)], "two"))
    again = tmp_path / "again.jsonl"
    assert main(["export", *common, "--source", "evaluator", "--format", "trajectory",
                 "--version", "v1", "-o", str(again)]) == 0  # fmt: skip
    assert "read at version v1" in capsys.readouterr().err
    assert again.read_bytes() == pin_file.read_bytes()
    assert main(["export", *common, "--source", "evaluator", "--format", "trajectory",
                 "--as-of", "2999-01-01T00:00:00Z", "-o", str(again)]) == 0  # fmt: skip
    assert again.read_bytes() == pin_file.read_bytes()
    capsys.readouterr()
    assert main(["stats", *common, "--source", "evaluator", "--version", "v1"]) == 0
    assert '"records":12' in capsys.readouterr().out
    assert main(["versions", "list", *common, "--corpus", "evaluator"]) == 0
    assert capsys.readouterr().out.count('"name":') == 1
    assert main(["versions", "delete", *common, "--corpus", "evaluator", "v1"]) == 0
    capsys.readouterr()
    for argv, message in [
        (["stats", *common, "--source", "evaluator", "--version", "v1"],
         "rl-export: error: version: no version 'v1' of acme/bot/evaluator"),
        (["stats", *common, "--source", "evaluator", "--as-of", "yesterday"],
         "rl-export: error: --as-of: 'yesterday' is not an RFC 3339 time"),
        (["stats", *common, "--source", "evaluator", "--as-of", "2000-01-01T00:00:00Z"],
         "rl-export: error: version: no version created at or before 2000-01-01"),
        (["stats", *common, "--source", "evaluator", "--version", "a", "--as-of", "2000-01-01"],
         "rl-export: error: --version: give --version NAME or --as-of RFC3339, not both"),
        (["versions", "create", *common, "--corpus", "evaluator", "../x"],
         "rl-export: error: version: version name '../x' is not valid"),
    ]:  # fmt: skip
        assert main(argv) == 2
        assert capsys.readouterr().err.startswith(message)
    with pytest.raises(SystemExit) as exited:  # argparse's usage error, one line
        main(["versions", "show", *common, "--corpus", "evaluator"])
    assert exited.value.code == 2
    assert capsys.readouterr().err.startswith(
        "rl-export versions show: error: the following arguments are required: NAME"
    )
