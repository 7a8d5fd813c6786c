"""A pair's snapshot as the ``comparisons`` corpus's line (docs/guides/comparisons.md).

The join's owner of a pair sends its snapshot on ``trajectories`` keyed by the pair's id
(:func:`rl_export.stream.comparisons.pair_snapshot`): the pair record, then ``"deleted":
false``; or the pair's tombstone. A value with a top-level ``pair_id`` is a pair's snapshot
(:func:`pair_lines`), any other a trace's. :class:`PairLines` answers what a chain writer
asks of a trace's :class:`~rl_export.model.records.SnapshotLines`, for the corpora whose
source is ``comparisons`` only: the sink gives it to them and a trace's snapshot to the
others.
"""

from __future__ import annotations

from typing import Any

import orjson

from rl_export.model.codec import dumps_line
from rl_export.model.pairs import COMPARISONS
from rl_export.model.records import CorpusSource
from rl_export.model.snapshots import SnapshotLines

_MARK = b'"pair_id":'


class PairLines(SnapshotLines):
    """A pair's snapshot: ready for the ``comparisons`` source while it has a vote."""

    def __init__(self, snapshot: dict[str, Any]) -> None:
        deleted = snapshot.get("deleted") is True
        record = {k: v for k, v in snapshot.items() if k != "deleted"}
        super().__init__({**record, "deleted": deleted, "human": None, "evaluator": None})
        self._record = record
        self._votes = bool(record.get("votes")) and not deleted

    def ready(self, source: CorpusSource | str) -> bool:
        return source == COMPARISONS and self._votes

    def line(self, source: CorpusSource | str) -> bytes:
        if not self.ready(source):
            raise ValueError(f"the pair's snapshot is not ready for {source!r}")
        return dumps_line(self._record)

    def value(self, source: CorpusSource | str, key: str) -> Any:
        return self._record.get(key)

    def fields(self) -> dict[str, Any]:
        return self._record

    @property
    def snapshot(self) -> dict[str, Any]:
        return self._record

    @property
    def updated_at(self) -> str:
        stamp: str = self._record["updated_at"]
        return stamp


def pair_lines(value: bytes) -> PairLines | None:
    """The pair's snapshot a ``trajectories`` value holds; None when it holds a trace's.
    Raises ValueError for a pair's snapshot whose fields have the wrong types."""
    if _MARK not in value:
        return None
    try:
        snapshot = orjson.loads(value)
    except orjson.JSONDecodeError:
        return None  # decoded as a trace's snapshot, which says what is wrong
    if type(snapshot) is not dict or "pair_id" not in snapshot:
        return None
    for key in ("trace_id", "org", "project", "pair_id", "trace_a", "trace_b"):
        if type(snapshot.get(key)) is not str:
            raise ValueError(f"a pair's {key} is not a string")
    revision = snapshot.get("revision")
    if type(revision) is not int or not 0 < revision < 2**63:
        raise ValueError("a pair's revision is not a count")
    if snapshot.get("deleted") is not True and (
        type(snapshot.get("votes")) is not list or type(snapshot.get("updated_at")) is not str
    ):
        raise ValueError("a live pair's votes or updated_at are missing")
    return PairLines(snapshot)
