"""The docs site builds with ``--strict`` (a broken link or anchor fails), offline, and its
reference pages name everything the code defines.

The site is built once for the module, the way ``make docs`` builds it, into a temporary
folder. The reference pages are generated from the code by ``docs/hooks/reference.py``;
these tests read the built HTML and enumerate the code on their own: every ``RL_EXPORT_*``
setting, every command and subcommand of the parser, every API route, every schema file.
"""

from __future__ import annotations

import argparse
import html
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from rl_export.cli import build_parser
from rl_export.runtime.settings import Settings, env_name
from rl_export.web.api.routes import export, label

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("site")
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)],
        cwd=ROOT, capture_output=True, text=True, timeout=300, check=False,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "WARNING" not in done.stderr, done.stderr
    return out


def text_of(site: Path, page: str) -> str:
    """A built page's text, tags dropped and entities decoded."""
    raw = (site / page / "index.html").read_text(encoding="utf-8")
    return html.unescape(re.sub(r"<[^>]+>", "", raw))


def command_names(parser: argparse.ArgumentParser, prefix: str = "rl-export") -> list[str]:
    """Every command and subcommand: subparsers (nested too) and an ``action`` positional's
    choices (``tokens create``, ``shards verify``)."""
    names = []
    for action in parser._actions:  # argparse has no public accessor for its actions
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                names.append(f"{prefix} {name}")
                names += command_names(sub, f"{prefix} {name}")
        elif action.dest == "action" and action.choices and not action.option_strings:
            names += [f"{prefix} {choice}" for choice in action.choices]
    return names


def test_the_site_builds_offline_with_every_section(site: Path) -> None:
    pages = (
        "getting-started", "guides/labeling", "guides/agreement", "guides/exports",
        "guides/trainers", "guides/redaction", "guides/kubernetes", "guides/operating",
        "operations/runbook", "concepts/architecture", "concepts/exactly-once",
        "concepts/join-rules", "performance", "faults",
    )  # fmt: skip
    for page in pages:
        assert (site / page / "index.html").exists(), page
    home = (site / "index.html").read_text(encoding="utf-8")
    assert "fonts.googleapis" not in home  # no web fonts: the site reads the same offline


def test_every_setting_is_in_the_settings_reference(site: Path) -> None:
    page = text_of(site, "reference/settings")
    missing = [env_name(n) for n in Settings.model_fields if env_name(n) not in page]
    assert len(Settings.model_fields) > 40
    assert missing == []


def test_every_setting_has_help_for_the_reference() -> None:
    assert [n for n, f in Settings.model_fields.items() if not f.description] == []


def test_every_command_and_subcommand_is_in_the_cli_reference(site: Path) -> None:
    page = text_of(site, "reference/cli")
    names = command_names(build_parser())
    assert {"rl-export export", "rl-export shards verify", "rl-export tokens create"} <= set(names)
    assert [n for n in names if n not in page] == []


def test_every_route_is_in_the_api_reference(site: Path) -> None:
    page = text_of(site, "reference/api")
    routes = [
        f"{method} {route.path}"
        for router in (export.router, label.router)
        for route in router.routes
        for method in sorted(getattr(route, "methods", ()))
    ]
    assert len(routes) >= 10
    assert [r for r in routes if r not in page] == []


def test_every_schema_is_in_the_schemas_reference(site: Path) -> None:
    page = text_of(site, "reference/schemas")
    files = sorted((ROOT / "schemas").glob("*.schema.json"))
    assert files
    for path in files:
        assert path.name in page
        assert (site / "reference" / "schemas" / path.name).read_bytes() == path.read_bytes()
