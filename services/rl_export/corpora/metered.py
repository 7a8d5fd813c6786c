"""A store that counts the objects it writes, per org, project and kind: what S3 bills.

The worker's sink and compaction write through a :class:`MeteredStore` around the real one;
each ``put``, ``put_if_absent`` and ``put_file`` counts one object in
``rl_export_objects_written_total{org, project, kind}`` (the org and project bounded:
:class:`~rl_export.runtime.metrics.ProjectLabels`), its kind read from the key
(:func:`kind_of`). The Delta tables are written by delta-rs, not through the store: their
files are counted by compaction from the table's commit (:mod:`rl_export.corpora.table`).
"""

from __future__ import annotations

from pathlib import Path

from prometheus_client import Counter

from rl_export.corpora.erasures import ERASURES_ROOT
from rl_export.corpora.store import ObjectStore
from rl_export.corpora.wrapped import StoreWrapper
from rl_export.runtime.metrics import OTHER, ProjectLabels


def kind_of(key: str) -> tuple[str, str, str]:
    """``(org, project, kind)`` of an object key (see the module's kinds)."""
    parts = key.split("/")
    if parts[0] == ERASURES_ROOT and len(parts) > 3:
        return parts[1], parts[2], "erasure"
    if len(parts) < 5 or parts[0].startswith("_"):
        return OTHER, OTHER, "other"
    org, project, folder = parts[0], parts[1], parts[3]
    if folder == "_manifest":
        return org, project, "commit"
    if folder == "_compacted":
        return org, project, "compaction"
    if folder == "_table":
        return org, project, "table"
    if folder == "data":
        return org, project, "sidecar" if key.endswith(".parquet") else "shard"
    return org, project, "other"


class MeteredStore(StoreWrapper):
    """Another store, every object written counted (see the module)."""

    def __init__(self, inner: ObjectStore, counter: Counter, projects: ProjectLabels) -> None:
        super().__init__(inner)
        self.counter = counter
        self.projects = projects

    def count(self, org: str, project: str, kind: str, n: int = 1) -> None:
        """Count ``n`` objects of ``kind`` written for a project (also the tables')."""
        if n > 0:
            self.counter.labels(*self.projects(org, project), kind).inc(n)

    def _wrote(self, key: str) -> None:
        self.count(*kind_of(key))

    async def put(self, key: str, data: bytes) -> None:
        await self.inner.put(key, data)
        self._wrote(key)

    async def put_if_absent(self, key: str, data: bytes) -> None:
        await self.inner.put_if_absent(key, data)
        self._wrote(key)

    async def put_file(self, key: str, path: Path) -> None:
        await self.inner.put_file(key, path)
        self._wrote(key)
