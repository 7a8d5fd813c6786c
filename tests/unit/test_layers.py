"""The package's rooms and their floors: imports only point down (STYLE.md point 1).

The ground floor, bottom up: ``model`` (events, records, encoding, errors), ``privacy``
(redaction, the attachment policy), ``formats`` (the shapes rows take, filters, corpus specs),
``runtime`` (settings, metrics, process plumbing) and ``kafka`` (how clients connect). Then
the stages: ``stream`` joins events; ``corpora`` writes and reads what the stream emits;
``export`` renders corpora for trainers and ``labeling`` holds the team's labeling rules (both
read corpora, neither imports the other); ``index`` is the web service's read model of the
corpora. ``worker``, ``web`` and ``local`` are processes built from the stages (and never
import each other); ``cli``, ``hf`` and the package's own ``__init__`` (the trainers' short
imports) sit on top. A module may import its own room and any lower floor, nothing else.
"""

from __future__ import annotations

import ast
import shutil
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "services" / "rl_export"

LAYERS: dict[str, int] = {
    "model": 0,
    "privacy": 1,
    "formats": 2,
    "runtime": 3,
    "kafka": 4,
    "stream": 5,
    "corpora": 6,
    "export": 7,
    "labeling": 7,
    "index": 8,
    "worker": 9,
    "web": 9,
    "local": 9,
    "cli": 10,
    "hf": 10,
    "__init__": 10,
}


def _ours(name: str) -> bool:
    """A module of the package (not ``rl_export_native``, the join's native core, which
    is a package of its own)."""
    return name == "rl_export" or name.startswith("rl_export.")


def package_of(module: str) -> str:
    """``rl_export.stream.join`` -> ``stream``; ``rl_export`` -> ``__init__``."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def modules(package: Path = PACKAGE) -> list[tuple[str, Path]]:
    out = []
    for path in sorted(package.rglob("*.py")):
        relative = path.relative_to(package.parent).with_suffix("")
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
            found += [(node.lineno, a.name) for a in node.names if _ours(a.name)]
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: resolve against this module's package
                base = package.split(".")
                base = base[: len(base) - node.level + 1]
                target = ".".join([*base, node.module] if node.module else base)
            else:
                target = node.module or ""
            if target == "rl_export":  # ``from rl_export import x``: x may be a subpackage
                found += [(node.lineno, f"rl_export.{a.name}") for a in node.names]
            elif _ours(target):
                found.append((node.lineno, target))
    return found


def allowed(source: str, target: str) -> bool:
    """May module ``source`` import module ``target``?"""
    src, dest = package_of(source), package_of(target)
    return dest in (src, "__version__") or LAYERS[dest] < LAYERS[src]


def violations(package: Path = PACKAGE) -> list[str]:
    problems = []
    for module, path in modules(package):
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
        ("rl_export.stream.join", "rl_export.model.events", True),
        ("rl_export.runtime.settings", "rl_export.corpora.layout", False),
        ("rl_export.worker.main", "rl_export.local.process", False),
        ("rl_export.cli", "rl_export.worker.main", True),
        ("rl_export.stream.loop", "rl_export.stream.processor", True),
        ("rl_export.corpora.sink", "rl_export", False),
    ],
)
def test_the_rule_itself(source: str, target: str, expected: bool) -> None:
    """The check catches an upward or a sideways import (a test of the test)."""
    assert allowed(source, target) is expected


def test_a_planted_upward_import_is_found(tmp_path: Path) -> None:
    """A copy of the package with one upward import planted fails the check, naming it."""
    copy = tmp_path / "rl_export"
    shutil.copytree(PACKAGE, copy, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    assert violations(copy) == []
    target = copy / "model" / "codec.py"
    target.write_text(target.read_text() + "\nfrom rl_export.web.app import create_app\n")
    (problem,) = violations(copy)
    assert problem.startswith("rl_export.model.codec (layer 0, model) imports rl_export.web.app")


MAX_LINES = 600


def test_no_module_is_over_600_lines() -> None:
    """One role per module: a module past 600 lines holds more than one (issues 35, 52)."""
    long = {
        str(path.relative_to(PACKAGE)): n
        for path in PACKAGE.rglob("*.py")
        if (n := len(path.read_text().splitlines())) > MAX_LINES
    }
    assert long == {}


def test_no_room_holds_over_a_fifth_of_the_package() -> None:
    """A room past 20 % of the package's Python lines is a ground floor in disguise (issue 52)."""
    lines: dict[str, int] = {}
    for path in PACKAGE.rglob("*.py"):
        room = path.relative_to(PACKAGE).parts[0].removesuffix(".py")
        lines[room] = lines.get(room, 0) + len(path.read_text().splitlines())
    total = sum(lines.values())
    assert {room: round(n / total, 3) for room, n in lines.items() if n > total / 5} == {}


def test_every_room_says_what_it_holds_and_what_it_may_import() -> None:
    """Each room's ``__init__`` docstring names what it holds and the rooms it may import."""
    silent = []
    for init in sorted(PACKAGE.glob("*/__init__.py")):
        doc = ast.get_docstring(ast.parse(init.read_text())) or ""
        if "import" not in doc.lower():
            silent.append(init.parent.name)
    assert silent == []
