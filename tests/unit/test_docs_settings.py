"""The configuration guide's table of the main settings (``docs/guides/configuration.md``) names
real settings and gives the defaults they have. (The full table, generated from the settings
class, is checked by ``tests/packaging/test_docs.py``.)"""

from __future__ import annotations

import re
from pathlib import Path

from rl_export.runtime.settings import Settings

ROOT = Path(__file__).resolve().parents[2]
PREFIX = "RL_EXPORT_"
FIELDS = set(Settings.model_fields)


def table_rows() -> list[tuple[str, str]]:
    """The configuration table's (variable cell, default cell) pairs, as written."""
    text = (ROOT / "docs" / "guides" / "configuration.md").read_text(encoding="utf-8")
    section = text.split("# Configuration\n", 1)[1].split("\n## ", 1)[0]
    rows = []
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) >= 3 and cells[0].startswith(f"`{PREFIX}"):
            rows.append((cells[0], cells[1]))
    return rows


def setting_names(variables: str) -> list[str]:
    """The settings a cell names: `RL_EXPORT_SHARD_MAX_RECORDS` / `_BYTES` / `_AGE_S` is
    ``shard_max_records``, ``shard_max_bytes``, ``shard_max_age_s`` (a suffix replaces an end
    of the first name; a name that is no setting is returned as it was read)."""
    first, *rest = re.findall(r"`([A-Z0-9_]+)`", variables)
    stem = first.removeprefix(PREFIX).lower()
    names = [stem]
    for suffix in rest:
        end = suffix.lower()
        candidates = [stem[:i] + end for i, c in enumerate(stem) if c == "_"] + [end[1:]]
        names.append(next((c for c in candidates if c in FIELDS), end))
    return names


def written(value: object) -> str:
    """A default as the table writes it: ``60`` for 60.0, ``snappy`` for "snappy"."""
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


def test_the_table_is_found() -> None:
    assert len(table_rows()) > 20


def test_the_suffixes_of_a_row_are_read_as_whole_names() -> None:
    cell = "`RL_EXPORT_SHARD_MAX_RECORDS` / `_BYTES` / `_AGE_S`"
    assert setting_names(cell) == ["shard_max_records", "shard_max_bytes", "shard_max_age_s"]
    assert setting_names("`RL_EXPORT_WEB_PORT` / `_WEB_HOST`") == ["web_port", "web_host"]
    assert setting_names("`RL_EXPORT_WEB_PORT` / `_WEB_HOSTS`") == ["web_port", "_web_hosts"]


def test_every_variable_in_the_table_is_a_setting() -> None:
    unknown = [n for variables, _ in table_rows() for n in setting_names(variables)]
    assert [n for n in unknown if n not in FIELDS] == []


def test_every_literal_default_in_the_table_is_the_settings_default() -> None:
    """`5000` / `0.1` and `a`, `b` are checked; 64 MiB, 7 days and `<data dir>/...` are prose."""
    wrong = {}
    checked = 0
    for variables, defaults in table_rows():
        names = setting_names(variables)
        pieces = re.split(r" / |, ", defaults) if len(names) > 1 else [defaults]
        if len(pieces) != len(names):
            continue
        for name, piece in zip(names, pieces, strict=True):
            literal = re.fullmatch(r"`([^`<]*)`(?: \(.*\))?", piece.strip())
            if literal is None or name not in FIELDS:
                continue
            checked += 1
            default = written(Settings.model_fields[name].default)
            if default != literal.group(1):
                wrong[name] = (literal.group(1), default)
    assert checked >= 30
    assert wrong == {}
