"""The package's layers: imports only point down (STYLE.md point 1).

``common`` is the ground every stage may import; ``stream`` joins events; ``corpora`` writes
and reads what the stream emits; ``export`` renders corpora for trainers and ``labeling``
holds the team's labeling rules (both read corpora, neither imports the other); ``worker``, ``web``
and ``local`` are processes built from the stages (and never import each other); ``cli`` and
the package's own ``__init__`` (the trainers' short imports) sit on top. A module may import
its own package and any lower layer, nothing else.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "services" / "rl_export"

LAYERS: dict[str, int] = {
    "common": 0,
    "stream": 1,
    "corpora": 2,
    "export": 3,
    "labeling": 3,
    "worker": 4,
    "web": 4,
    "local": 4,
    "cli": 5,
    "hf": 5,
    "__init__": 5,
}


def package_of(module: str) -> str:
    """``rl_export.stream.join`` -> ``stream``; ``rl_export`` -> ``__init__``."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def modules() -> list[tuple[str, Path]]:
    out = []
    for path in sorted(PACKAGE.rglob("*.py")):
        relative = path.relative_to(PACKAGE.parent).with_suffix("")
        name = ".".join(relative.parts)
        out.append((name.removesuffix(".__init__"), path))
    return out


def imported(path: Path, module: str) -> list[tuple[int, str]]:
    """(line, module) of every rl_export import in a file, TYPE_CHECKING ones included."""
    tree = ast.parse(path.read_text(), str(path))
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names if a.name.startswith("rl_export")]
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: resolve against this module's package
                base = package.split(".")
                base = base[: len(base) - node.level + 1]
                target = ".".join([*base, node.module] if node.module else base)
            else:
                target = node.module or ""
            if target == "rl_export":  # ``from rl_export import x``: x may be a subpackage
                found += [(node.lineno, f"rl_export.{a.name}") for a in node.names]
            elif target.startswith("rl_export"):
                found.append((node.lineno, target))
    return found


def allowed(source: str, target: str) -> bool:
    """May module ``source`` import module ``target``?"""
    src, dest = package_of(source), package_of(target)
    return dest in (src, "__version__") or LAYERS[dest] < LAYERS[src]


def violations() -> list[str]:
    problems = []
    for module, path in modules():
        source = package_of(module)
        if source not in LAYERS:
            problems.append(f"{module}: package {source!r} has no layer in LAYERS")
            continue
        for line, target in imported(path, module):
            dest = package_of(target)
            if dest not in LAYERS and dest != "__version__":
                problems.append(f"{path.name}:{line} imports {target}, which has no layer")
            elif not allowed(module, target):
                problems.append(
                    f"{module} (layer {LAYERS[source]}, {source}) imports {target} "
                    f"(layer {LAYERS[dest]}, {dest}) at line {line}"
                )
    return problems


def test_every_import_points_down() -> None:
    assert violations() == []


def test_every_module_opens_with_a_docstring_saying_its_role() -> None:
    missing = []
    for module, path in modules():
        tree = ast.parse(path.read_text())
        doc = ast.get_docstring(tree)
        if not doc or not doc.strip():
            missing.append(module)
    assert missing == []


@pytest.mark.parametrize(
    ("source", "target", "expected"),
    [
        ("rl_export.stream.join", "rl_export.common.events", True),
        ("rl_export.common.settings", "rl_export.corpora.layout", False),
        ("rl_export.worker.main", "rl_export.local.process", False),
        ("rl_export.cli", "rl_export.worker.main", True),
        ("rl_export.stream.loop", "rl_export.stream.processor", True),
        ("rl_export.corpora.sink", "rl_export", False),
    ],
)
def test_the_rule_itself(source: str, target: str, expected: bool) -> None:
    """The check catches an upward or a sideways import (a test of the test)."""
    assert allowed(source, target) is expected


MAX_LINES = 700


def test_no_module_is_over_700_lines() -> None:
    """One role per module: a module past 700 lines holds more than one (issue 35)."""
    long = {
        str(path.relative_to(PACKAGE)): n
        for path in PACKAGE.rglob("*.py")
        if (n := len(path.read_text().splitlines())) > MAX_LINES
    }
    assert long == {}
