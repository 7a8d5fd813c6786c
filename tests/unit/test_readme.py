"""The README is what a newcomer reads in five minutes: short, and its links lead somewhere.

Everything else lives in the docs site (``docs/``, built by ``make docs``).
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
MAX_LINES = 250


def test_the_readme_is_at_most_250_lines() -> None:
    lines = README.read_text(encoding="utf-8").splitlines()
    assert len(lines) <= MAX_LINES, f"README.md has {len(lines)} lines; move text to docs/"


def test_every_relative_link_of_the_readme_exists() -> None:
    text = README.read_text(encoding="utf-8")
    targets = [t.split("#", 1)[0] for t in re.findall(r"\]\(([^)\s]+)\)", text)]
    local = [t for t in targets if t and not re.match(r"^[a-z]+:", t)]
    assert len(local) >= 5  # the screenshots and the links into the docs
    assert [t for t in local if not (ROOT / t).exists()] == []
