"""The erasure log: which traces were deleted (docs/concepts/corpora.md, "Versions").

A read at a past position (a pinned version, ``--as-of``, ``--from-manifest``) shows a corpus
as it was, but deletion wins over reproducibility: a trace deleted after that position is
left out of such reads too. A corpus's tombstones cannot say that (a tombstone also marks a
trajectory that stopped being ready, and compaction drops tombstones after their retention),
so the sink records each deletion once more, here: when a chain commits the tombstone of a
deleted trace, it first writes
``_erasures/<org>/<project>/<topic>-<partition>/<offset>.<id>.json`` (the offset of the
deletion's snapshot; ``<id>`` the trace id in unpadded base64url), ``{"trace_id", "org",
"project", "revision"}``. Every corpus of the partition writes the same bytes under the same
key, so the first write is the record and the others change nothing; written before the
commit that holds the tombstone, so a committed deletion always has its entry. The entries
are small and kept for good (deletions are rare), so the deletion stays in force after
the tombstones are gone, wherever the trace's records come from. Who reads the log:

- a read (:class:`~rl_export.export.latest.LatestView`, and the reader at a pinned
  version) leaves the traces it names out, at a past position and at the latest alike;
- a chain writer (:func:`~rl_export.corpora.chainstate.load_chain_state`) never takes a
  record of them again: a later backfill (``replay``) of a deleted trace writes nothing;
- compaction drops them, whatever a writer wrote while it did not yet know.

Each lists the project's entries once: the ids are in the keys, so a thousand deletions
cost one listing request, not a thousand reads. An id too long for a key (over
:data:`ID_IN_KEY` characters) has an entry ``<offset>.json`` without it, read for its body,
as every entry of an older log is.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
from collections.abc import Sequence

import orjson

from rl_export.corpora.commits import ChainError
from rl_export.corpora.store import ObjectStore
from rl_export.model.codec import dumps
from rl_export.model.errors import ObjectNotFoundError

ERASURES_ROOT = "_erasures"
READ_AT_ONCE = 32  # entries without the id in their key fetched concurrently
ID_IN_KEY = 300
"""The longest trace id (in characters) named in its entry's key (keys stay well under the
1,024 bytes S3 allows)."""
# ERASED_REVISION (rl_export.model.records) is also the revision of an erased trace's
# virtual tombstone in a view at a past position (rl_export.export.latest.LatestView).


def erasures_prefix(org: str, project: str) -> str:
    return f"{ERASURES_ROOT}/{org}/{project}/"


def erasure_key(org: str, project: str, stream: str, offset: int, trace_id: str) -> str:
    name = f"{offset:020d}"
    if len(trace_id) <= ID_IN_KEY:
        name += "." + base64.urlsafe_b64encode(trace_id.encode()).decode().rstrip("=")
    return f"{erasures_prefix(org, project)}{stream}/{name}.json"


def _id_in(key: str) -> str | None:
    """The trace id a key names (None: the key names none, or not one that decodes)."""
    _, dot, encoded = key.rpartition("/")[2].removesuffix(".json").partition(".")
    if not dot:
        return None
    try:
        return base64.urlsafe_b64decode(encoded + "=" * (-len(encoded) % 4)).decode()
    except (binascii.Error, ValueError):
        return None


async def record_erasures(
    store: ObjectStore, org: str, project: str, stream: str,
    erased: Sequence[tuple[int, str, int]],
) -> None:  # fmt: skip
    """Write the entries of some deletions, ``(offset, trace_id, revision)`` each, at once
    (idempotent: the same keys and bytes for every corpus)."""
    await asyncio.gather(*(
        store.put(
            erasure_key(org, project, stream, offset, trace_id),
            dumps({"trace_id": trace_id, "org": org, "project": project, "revision": revision}),
        )
        for offset, trace_id, revision in erased
    ))  # fmt: skip


async def erased_traces(store: ObjectStore, org: str, project: str) -> frozenset[str]:
    """The ids of every trace of the project whose deletion a chain has committed (or is
    about to): from the keys, and from the bodies of entries whose key does not name it.
    An entry that is not what :func:`record_erasures` writes is an error: a pinned read
    must not show a deleted trace because its entry could not be read (ChainError)."""
    found: set[str] = set()
    unnamed: list[str] = []
    for key in await store.list(erasures_prefix(org, project)):
        if key.endswith(".json"):
            trace_id = _id_in(key)
            if trace_id is None:
                unnamed.append(key)
            else:
                found.add(trace_id)
    for start in range(0, len(unnamed), READ_AT_ONCE):
        bodies = await asyncio.gather(
            *(_read(store, key) for key in unnamed[start : start + READ_AT_ONCE])
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
