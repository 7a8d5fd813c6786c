"""``rl-export ratings`` over a local store: its JSON shape, and one line with exit 2 for bad
input. (The votes themselves reach records through the join's ``label.compared``: the
integration test of comparisons runs the command over them.)"""

from __future__ import annotations

import asyncio
from pathlib import Path

import orjson
import pytest

from rl_export.cli import main
from rl_export.corpora.store import LocalStore
from tests.exportdata import ORG, PROJECT, replay_events
from tests.trainingdata import traffic


def test_ratings_of_traces_without_comparisons(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = tmp_path / "store"
    asyncio.run(replay_events(LocalStore(root), traffic(6), "one"))
    common = ["--store", str(root), "--org", ORG, "--project", PROJECT]
    assert main(["ratings", *common]) == 0
    assert orjson.loads(capsys.readouterr().out) == {
        "ratings": [], "agreement": {"pairs": 0, "percent": None, "alpha": None}
    }  # fmt: skip


THIS = ["--org", ORG, "--project", PROJECT]


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--org", ORG, "--project", "nope"], f"no traces corpus for {ORG}/nope"),
        ([*THIS, "--min-reward", "x"], "min-reward"),
        ([*THIS, "--version", "v1", "--as-of", "2026-01-01T00:00:00Z"], "not both"),
        ([*THIS, "--version", "v9"], "v9"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], flags: list[str], message: str
) -> None:
    root = tmp_path / "store"
    asyncio.run(replay_events(LocalStore(root), traffic(2), "one"))
    assert main(["ratings", "--store", str(root), *flags]) == 2
    err = capsys.readouterr().err
    assert err.startswith("rl-export: error: ")
    assert message in err
    assert err.count("\n") == 1
