"""Corpus specs: what a continuous export holds (its name, reward source, format and filter)."""

from __future__ import annotations

import re
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from rl_export.common.records import SnapshotLines, render

SAFE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._\-]{0,127}$")
"""Org, project, corpus and topic names become path segments in the store."""


def check_name(kind: str, value: str) -> str:
    """Org, project, corpus and topic names become path segments: keep them safe."""
    if not SAFE_NAME.match(value):
        raise ValueError(f"{kind} {value!r} cannot name a folder (use letters, digits, . _ -)")
    return value


class CorpusSpec(BaseModel):
    """One continuous export: its name, reward source, format and filter."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str = Field(pattern=SAFE_NAME.pattern)
    source: Literal["human", "evaluator"] | None
    format: Literal["trajectory"] = "trajectory"
    filter: dict[str, Any] = Field(default_factory=dict)

    def matches(self, record: dict[str, Any]) -> bool:
        """True when every filter field equals the record's value."""
        return all(record.get(k) == v for k, v in self.filter.items())

    def record_for(self, snapshot: dict[str, Any]) -> dict[str, Any] | None:
        """The record this corpus holds for a snapshot: a record, a tombstone, or None.

        None means "not in this corpus" (not ready for the source, or filtered out); the
        writer turns that into a tombstone when the corpus holds the trace.
        """
        record = render(snapshot, self.source)
        if record is None or record.get("deleted"):
            return record
        return record if self.matches(record) else None

    def holds(self, snapshot: SnapshotLines) -> bool:
        """True when :meth:`record_for` is a record (not a tombstone, not None).

        The sink's way to the same answer without rendering the record as a dict.
        """
        source = self.source
        if not snapshot.ready(source):
            return False
        return not self.filter or all(
            snapshot.value(source, k) == v for k, v in self.filter.items()
        )


DEFAULT_CORPORA: tuple[CorpusSpec, ...] = (
    CorpusSpec(name="human", source="human"),
    CorpusSpec(name="evaluator", source="evaluator"),
    CorpusSpec(name="traces", source=None),
)
