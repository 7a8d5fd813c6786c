"""Abuse: an export never writes over a file it did not make (DESIGN.md section 10), as people
run it: ``rl-export export --card -o train.jsonl`` in a folder that has a README.md of its
own (the repository's root, as the README's tour once did) is refused in one line, exit 2,
and leaves every file as it was; the same export again over its own files, and ``-o -``, go
on working."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path

import pytest

from rl_export.corpora.store import LocalStore
from tests.exportdata import ORG, PROJECT, build_story

PRECIOUS = b"# Our project\n\nWritten by people. An export must never replace it.\n"


def rl_export(*args: str, cwd: Path) -> subprocess.CompletedProcess[bytes]:
    argv = [sys.executable, "-m", "rl_export.cli", *args]
    return subprocess.run(argv, capture_output=True, timeout=120, check=False, cwd=cwd)


@pytest.fixture(scope="module")
def store_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("files-store")
    asyncio.run(build_story(LocalStore(root)))
    return root


def export(store: Path, *extra: str) -> list[str]:
    return ["export", "--store", str(store), "--org", ORG, "--project", PROJECT, "--source",
            "evaluator", "--format", "messages", *extra]  # fmt: skip


def files(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())}


def test_a_card_beside_a_readme_of_its_own_is_refused_and_the_readme_unchanged(
    store_dir: Path, tmp_path: Path
) -> None:
    (tmp_path / "README.md").write_bytes(PRECIOUS)
    before = files(tmp_path)
    result = rl_export(*export(store_dir, "--card", "-o", "train.jsonl"), cwd=tmp_path)
    assert result.returncode == 2, result.stderr
    lines = result.stderr.decode().splitlines()
    assert len(lines) == 1, lines
    assert "README.md exists and is not the dataset card of an export to train.jsonl" in lines[0]
    assert "Traceback" not in result.stderr.decode()
    assert files(tmp_path) == before  # the README as it was, and no train.jsonl either
    # Without --card the README is not the export's business: the file is written beside it.
    result = rl_export(*export(store_dir, "-o", "train.jsonl"), cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "README.md").read_bytes() == PRECIOUS


def test_a_users_file_at_the_output_is_refused_and_an_exports_own_is_written_again(
    store_dir: Path, tmp_path: Path
) -> None:
    mine = tmp_path / "mine.jsonl"
    mine.write_bytes(b'{"hand": "made"}\n')
    result = rl_export(*export(store_dir, "-o", str(mine)), cwd=tmp_path)
    assert result.returncode == 2, result.stderr
    assert f"{mine} exists and was not written by an export to it".encode() in result.stderr
    assert mine.read_bytes() == b'{"hand": "made"}\n'
    # Its own output, card and manifest: the same export again, as often as wanted.
    out = tmp_path / "sft" / "train.jsonl"
    out.parent.mkdir()
    for _ in range(3):
        result = rl_export(*export(store_dir, "--card", "-o", str(out)), cwd=tmp_path)
        assert result.returncode == 0, result.stderr
    assert sorted(files(out.parent)) == ["README.md", "train.jsonl", "train.jsonl.manifest.json"]
    again = rl_export("export", "--store", str(store_dir), "--from-manifest",
                      f"{out}.manifest.json", "-o", str(out), cwd=tmp_path)  # fmt: skip
    assert again.returncode == 0, again.stderr
    # To stdout nothing is written beside anything.
    piped = rl_export(*export(store_dir, "-o", "-"), cwd=tmp_path)
    assert piped.returncode == 0, piped.stderr
    assert piped.stdout == out.read_bytes()
