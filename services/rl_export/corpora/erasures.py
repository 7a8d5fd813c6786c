"""The erasure log: which traces were deleted (docs/concepts/corpora.md, "Versions").

A read at a past position (a pinned version, ``--as-of``, ``--from-manifest``) shows a corpus
as it was, but deletion wins over reproducibility: a trace deleted after that position is
left out of such reads too. A corpus's tombstones cannot say that (a tombstone also marks a
trajectory that stopped being ready, and compaction drops tombstones after their retention),
so the sink records each deletion once more, here: when a chain commits the tombstone of a
deleted trace, it first writes ``_erasures/<org>/<project>/<topic>-<partition>/<offset>.json``
(the offset of the deletion's snapshot), ``{"trace_id", "org", "project", "revision"}``.
Every corpus of the partition writes the same bytes under the same key, so the first write
is the record and the others change nothing; written before the commit that holds the
tombstone, so a committed deletion always has its entry. The entries are small and kept
(deletions are rare); a project's are listed and read at the start of a pinned read.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import orjson

from rl_export.common.codec import dumps
from rl_export.common.errors import ObjectNotFoundError
from rl_export.corpora.layout import ChainError
from rl_export.corpora.store import ObjectStore

ERASURES_ROOT = "_erasures"
READ_AT_ONCE = 32  # entries fetched concurrently while a project's log is read
ERASED_REVISION = 1 << 62
"""The revision of an erased trace's virtual tombstone in a view at a past position
(:class:`~rl_export.export.latest.LatestView`): newer than any line's."""


def erasures_prefix(org: str, project: str) -> str:
    return f"{ERASURES_ROOT}/{org}/{project}/"


def erasure_key(org: str, project: str, stream: str, offset: int) -> str:
    return f"{erasures_prefix(org, project)}{stream}/{offset:020d}.json"


async def record_erasure(
    store: ObjectStore, org: str, project: str, *, stream: str, offset: int, trace_id: str,
    revision: int,
) -> None:  # fmt: skip
    """Write the entry of a deletion (idempotent: the same key and bytes for every corpus)."""
    body = {"trace_id": trace_id, "org": org, "project": project, "revision": revision}
    await store.put(erasure_key(org, project, stream, offset), dumps(body))


async def erased_traces(store: ObjectStore, org: str, project: str) -> frozenset[str]:
    """The ids of every trace of the project whose deletion a chain has committed (or is
    about to). An entry that is not what :func:`record_erasure` writes is an error: a
    pinned read must not show a deleted trace because its entry could not be read
    (ChainError)."""
    keys = [k for k in await store.list(erasures_prefix(org, project)) if k.endswith(".json")]
    found: set[str] = set()
    for start in range(0, len(keys), READ_AT_ONCE):
        bodies = await asyncio.gather(
            *(_read(store, key) for key in keys[start : start + READ_AT_ONCE])
        )
        found.update(trace_id for trace_id in bodies if trace_id is not None)
    return frozenset(found)


async def _read(store: ObjectStore, key: str) -> str | None:
    try:
        data = await store.get(key)
    except ObjectNotFoundError:  # never deleted; a store whose listing ran ahead of it
        return None
    try:
        trace_id = orjson.loads(data).get("trace_id")
    except (orjson.JSONDecodeError, AttributeError):
        trace_id = None
    if not isinstance(trace_id, str):
        raise ChainError(f"{key}: not an erasure entry")
    return trace_id


def note_erased(
    best: dict[bytes, tuple[int, bool]], erased: frozenset[bytes], keys: Sequence[bytes],
    revisions: Sequence[int], deleted: Sequence[bool],
) -> None:  # fmt: skip
    """Keep in ``best`` the best (revision, tombstone) of each erased trace among some lines
    (their keys, revisions and tombstone flags), so a view can say how many records the
    erasures left out: those whose best line in the view is a record."""
    if erased.isdisjoint(keys):
        return
    for key, revision, gone in zip(keys, revisions, deleted, strict=True):
        if key in erased:
            seen = (revision, bool(gone))
            if key not in best or seen > best[key]:
                best[key] = seen
