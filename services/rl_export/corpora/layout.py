"""Corpora in object storage: names and the layout under the store root (docs/concepts/corpora.md).

A *corpus* is a named continuous export ``(reward source, format, filter)`` of one
org/project. Under the store root::

    <org>/<project>/<corpus>/data/<topic>-<partition>/<from_offset:020d>-<sha256[:16]>.jsonl[.gz]
    <org>/<project>/<corpus>/_manifest/<topic>-<partition>/<from_offset:020d>.json
    <org>/<project>/<corpus>/_compacted/<generation:020d>/part-<n:05d>-<sha256[:16]>.jsonl[.gz]
    <org>/<project>/<corpus>/_compacted/<generation:020d>/tombstones-<sha256[:16]>.jsonl.gz
    <org>/<project>/<corpus>/_compacted/<generation:020d>/holdings/<partitioner>-<partitions>/<p:05d>-<sha256[:16]>.json.gz
    <org>/<project>/<corpus>/_compacted/<generation:020d>/_compaction.json

The commits under ``_manifest/``, the objects they name and the chains they form:
:mod:`rl_export.corpora.commits`; what a compaction wrote under ``_compacted/``:
:mod:`rl_export.corpora.compacted`; what a corpus holds per trace, as its chain writers
rebuild it: :mod:`rl_export.corpora.chainstate`.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Literal

from rl_export.corpora.store import ObjectStore

SCHEMA_VERSION = 3
"""The record schema of the objects this code writes. 2: records carry ``labels``. A compaction
copies the records it keeps as they were written, so it may hold records of version 1, which
lack ``labels``: readers treat a missing ``labels`` as unknown."""
OFFSET_WIDTH = 20
Compression = Literal["none", "gzip"]


@dataclass(frozen=True)
class CorpusRef:
    """Which corpus: ``<org>/<project>/<corpus>``."""

    org: str
    project: str
    corpus: str

    @property
    def root(self) -> str:
        return f"{self.org}/{self.project}/{self.corpus}"

    def stream(self, topic: str, partition: int) -> str:
        return f"{topic}-{partition}"

    def manifest_root(self) -> str:
        return f"{self.root}/_manifest/"

    def manifest_prefix(self, stream: str) -> str:
        return f"{self.root}/_manifest/{stream}/"

    def manifest_key(self, stream: str, from_offset: int) -> str:
        return f"{self.manifest_prefix(stream)}{from_offset:0{OFFSET_WIDTH}d}.json"

    def data_key(self, stream: str, from_offset: int, sha256: str, compression: Compression) -> str:
        suffix = ".jsonl.gz" if compression == "gzip" else ".jsonl"
        return f"{self.root}/data/{stream}/{from_offset:0{OFFSET_WIDTH}d}-{sha256[:16]}{suffix}"

    def compacted_prefix(self) -> str:
        return f"{self.root}/_compacted/"

    def compaction_key(self, generation: int) -> str:
        return f"{self.compacted_prefix()}{generation:0{OFFSET_WIDTH}d}/_compaction.json"

    def key(self, relative: str) -> str:
        """The store key of a path relative to the corpus folder (a commit's ``shard``)."""
        return f"{self.root}/{relative}"

    def relative(self, key: str) -> str:
        return key.removeprefix(self.root + "/")


def parse_stream(stream: str) -> tuple[str, int]:
    """Split ``<topic>-<partition>``."""
    topic, _, partition = stream.rpartition("-")
    return topic, int(partition)


async def list_corpora(store: ObjectStore, prefix: str = "") -> list[CorpusRef]:
    """Every corpus with at least one commit or compaction under ``prefix``."""
    found = set()
    for key in await store.list(prefix):
        parts = key.split("/")
        if len(parts) >= 5 and parts[3] in ("_manifest", "_compacted"):
            found.add(CorpusRef(parts[0], parts[1], parts[2]))
    return sorted(found, key=lambda r: r.root)


def utc_now() -> str:
    return datetime.now(UTC).isoformat().replace("+00:00", "Z")
