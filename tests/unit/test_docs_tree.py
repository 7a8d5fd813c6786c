"""The architecture page's module tree names every module of the package (it is how newcomers
find them): ``docs/concepts/architecture.md``, under ``services/rl_export/``."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "services" / "rl_export"
PAGE = ROOT / "docs" / "concepts" / "architecture.md"


def tree_entries() -> set[str]:
    """The tree's entries, as paths relative to the package (``stream/loop.py``)."""
    text = PAGE.read_text(encoding="utf-8")
    block = text.split("services/rl_export/\n", 1)[1].split("```", 1)[0]
    entries: set[str] = set()
    folders: list[str] = []  # the folder open at each depth
    for line in block.splitlines():
        match = re.match(r"^((?:│   |    )*)[├└]── (\S+)", line)
        if not match:
            continue
        depth, name = len(match.group(1)) // 4, match.group(2)
        folders = folders[:depth]
        path = "/".join([*folders, name.rstrip("/")])
        entries.add(path)
        if name.endswith("/"):
            folders.append(name.rstrip("/"))
    return entries


def test_every_module_has_a_line_in_the_tree() -> None:
    entries = tree_entries()
    modules = {
        str(p.relative_to(PACKAGE))
        for p in PACKAGE.rglob("*.py")
        if p.name != "__init__.py" or p.parent == PACKAGE
    }
    # web/api/routes/ is one line naming its two modules.
    missing = sorted(
        m for m in modules if m not in entries and not any(
            m.startswith(e + "/") and e.endswith("routes") for e in entries
        )
    )  # fmt: skip
    assert not missing, f"modules missing from the tree of docs/concepts/architecture.md: {missing}"


def test_every_line_of_the_tree_is_a_module_or_folder() -> None:
    gone = sorted(e for e in tree_entries() if not (PACKAGE / e).exists())
    assert not gone, f"the tree of docs/concepts/architecture.md names what is not there: {gone}"
