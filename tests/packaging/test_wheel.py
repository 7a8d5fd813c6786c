"""The installed wheel holds the product, not the project's harnesses.

The benchmarks, the ceiling, the profile and the soak (``tests/perf/``, ``tests/soak/``) drive
the package from the checkout; a user who installs rl-export must not import them. The wheel
is built from a copy of what a source distribution holds, so the build leaves nothing in the
checkout.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
HARNESS = re.compile(
    r"(^|/)(bench\w*|soak\w*|ceiling\w*|profile|significance|faults|fold)(/|\.py$)"
)


@pytest.fixture(scope="module")
def wheel_names(tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    source = tmp_path_factory.mktemp("source")
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, source / name)
    shutil.copytree(
        ROOT / "services", source / "services",
        ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"),
    )  # fmt: skip
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
         "--quiet", "--wheel-dir", str(out), str(source)],
        check=True, capture_output=True, timeout=300,
    )  # fmt: skip
    [wheel] = out.glob("rl_export-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        return archive.namelist()


def test_the_wheel_holds_the_product(wheel_names: list[str]) -> None:
    for name in ("rl_export/cli/__init__.py", "rl_export/local/dev.py", "rl_export/local/broker.py",
                 "rl_export/corpora/chain.py", "rl_export/web/static/rl_export.js",
                 "rl_export/py.typed"):  # fmt: skip
        assert name in wheel_names


def test_the_wheel_holds_no_benchmark_soak_or_test_module(wheel_names: list[str]) -> None:
    shipped = [n for n in wheel_names if not n.startswith("rl_export-")]  # the .dist-info
    assert [n for n in shipped if not n.startswith("rl_export/")] == []
    assert [n for n in shipped if HARNESS.search(n)] == []


def test_the_pattern_catches_the_harnesses() -> None:
    """A test of the test: the names the harnesses had in the package match."""
    for name in ("rl_export/local/bench.py", "rl_export/local/bench_web.py",
                 "rl_export/local/soak_plan.py", "rl_export/local/ceiling_site/sitecustomize.py",
                 "rl_export/local/profile.py", "rl_export/local/significance.py"):  # fmt: skip
        assert HARNESS.search(name), name
    assert not HARNESS.search("rl_export/local/broker.py")
