"""The README's configuration table names real settings and gives the defaults they have."""

from __future__ import annotations

import re
from pathlib import Path

from rl_export.common.settings import Settings

ROOT = Path(__file__).resolve().parents[2]
PREFIX = "RL_EXPORT_"


def table_rows() -> list[tuple[str, str]]:
    """The configuration table's (variable cell, default cell) pairs, as written."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    section = text.split("## Configuration\n", 1)[1].split("\n## ", 1)[0]
    rows = []
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) >= 3 and cells[0].startswith(f"`{PREFIX}"):
            rows.append((cells[0], cells[1]))
    return rows


def written(value: object) -> str:
    """A default as the table writes it: ``60`` for 60.0, ``snappy`` for "snappy"."""
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


def test_the_table_is_found() -> None:
    assert len(table_rows()) > 20


def test_every_variable_in_the_table_is_a_setting() -> None:
    fields = set(Settings.model_fields)
    unknown = []
    for variables, _ in table_rows():
        first, *rest = re.findall(r"`([A-Z0-9_]+)`", variables)
        names = [first.removeprefix(PREFIX).lower()]
        for suffix in rest:  # `_BYTES` after `RL_EXPORT_SHARD_MAX_RECORDS`: a name's end
            stem, end = names[0], suffix.lower()
            candidates = [stem[:i] + end for i, c in enumerate(stem) if c == "_"] + [end[1:]]
            names.append(next((c for c in candidates if c in fields), end))
        unknown += [n for n in names if n not in fields]
    assert unknown == []


def test_a_single_setting_has_the_default_the_table_gives() -> None:
    """Rows of one variable whose default is a literal (`5000`, not "7 days")."""
    wrong = {}
    checked = 0
    for variables, default in table_rows():
        names = re.findall(r"`([A-Z0-9_]+)`", variables)
        literal = re.fullmatch(r"`([^`]*)`(?: \(.*\))?", default)
        if len(names) != 1 or literal is None:
            continue
        field = Settings.model_fields[names[0].removeprefix(PREFIX).lower()]
        checked += 1
        if written(field.default) != literal.group(1):
            wrong[names[0]] = (literal.group(1), written(field.default))
    assert checked >= 10
    assert wrong == {}
