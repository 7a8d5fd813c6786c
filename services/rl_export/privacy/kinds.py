"""Redaction's kinds as users name them, and the counts an export reports
(docs/guides/redaction.md).

``--redact secrets,email`` / ``pii`` / ``all`` / ``none`` become the kinds in order; each
replaced substring becomes ``[REDACTED:KIND]`` and is counted per kind (the CLI's summary,
a job's status, the ``X-RL-Export-Redactions`` header).
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterable

from rl_export.model.errors import ExportError
from rl_export.privacy.detectors import (
    KINDS,
)

PII_KINDS: tuple[str, ...] = tuple(k for k in KINDS if k != "secrets")
ALIASES: dict[str, tuple[str, ...]] = {"none": (), "all": KINDS, "pii": PII_KINDS}
DEFAULT_REDACT = "secrets"


Counts = dict[str, int]


class RedactError(ExportError):
    """An unknown redaction kind; ``setting`` names where it was given (``redact``)."""


def placeholder(kind: str) -> str:
    """What a substring of ``kind`` becomes: ``[REDACTED:EMAIL]``."""
    return f"[REDACTED:{kind.upper()}]"


def parse_kinds(value: str | Iterable[str] | None, *, setting: str = "redact") -> tuple[str, ...]:
    """``secrets,email`` / ``pii`` / ``all`` / ``none`` (or a list of them) -> the kinds, in
    :data:`KINDS` order; None is the default (``secrets``). RedactError names ``setting``."""
    if value is None:
        value = DEFAULT_REDACT
    items = value.split(",") if isinstance(value, str) else list(value)
    names = [str(i).strip().lower() for i in items if str(i).strip()]
    chosen: set[str] = set()
    for name in names:
        if name in ALIASES:
            if name == "none" and len(names) > 1:
                raise RedactError(setting, "'none' cannot be combined with other kinds")
            chosen.update(ALIASES[name])
        elif name in KINDS:
            chosen.add(name)
        else:
            raise RedactError(
                setting,
                f"unknown kind {name!r} (kinds: {', '.join(KINDS)}; or pii, all, none)",
            )
    return tuple(k for k in KINDS if k in chosen)


def add_counts(total: Counter[str] | dict[str, int], counts: Counts) -> None:
    """Add ``counts`` into ``total``."""
    for kind, n in counts.items():
        total[kind] = total.get(kind, 0) + n


def counts_header(counts: Counts) -> str:
    """The ``X-RL-Export-Redactions`` value: every kind asked for, in order, as JSON."""
    return json.dumps(counts, separators=(",", ":"))
