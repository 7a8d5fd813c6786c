"""Reading a corpus at a pinned version (docs/concepts/corpora.md, "Versions").

:func:`pin` finds where the corpus is now (:meth:`~rl_export.export.latest.LatestView.locate`:
its latest compaction and every chain's end) and stores it as a version
(:mod:`rl_export.corpora.versions`); :func:`pinned` turns ``--version NAME`` or ``--as-of
TIME`` (the newest version created at or before that time) into the
:class:`~rl_export.export.latest.ViewPosition` an export, stats or the Hugging Face dataset
reads, the same machinery as ``--from-manifest``.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime

from rl_export.corpora.layout import CorpusRef
from rl_export.corpora.store import ObjectStore
from rl_export.corpora.table import pin_table
from rl_export.corpora.versions import (
    Version,
    create_version,
    get_version,
    list_versions,
    version_as_of,
    version_key,
)
from rl_export.export.latest import LatestView, ViewPosition
from rl_export.model.errors import NoDataError, ObjectNotFoundError, StoreError, VersionError
from rl_export.runtime.settings import Settings

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Pinned:
    """A version and the view position it names."""

    version: Version
    at: ViewPosition

    @property
    def name(self) -> str:
        return self.version.name


def parse_as_of(value: str, setting: str = "--as-of") -> datetime:
    """An RFC 3339 time with an offset or ``Z``; VersionError otherwise."""
    try:
        at = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        raise VersionError(f"{value[:80]!r} is not an RFC 3339 time", setting) from None
    if at.tzinfo is None:
        raise VersionError(f"{value[:80]!r} needs an offset or Z", setting)
    return at


async def pin(
    store: ObjectStore, ref: CorpusRef, name: str, note: str = "", *, fmt: str | None = None
) -> Version:
    """Pin the corpus's current position as ``name``; NoDataError for a corpus with no data,
    VersionError for a name taken or not valid.

    With ``fmt`` (the corpus's format: its table is kept), the corpus's open table is first
    written at that position and the version records its Delta version
    (:func:`~rl_export.corpora.table.pin_table`); a table that cannot be written is logged,
    and the version has none.
    """
    view = LatestView(store, ref)
    position = await view.locate()
    if position.generation is None and not position.ends:
        if not await view.exists():
            raise NoDataError("corpus", f"no data for {ref.root} in {store.url}: nothing to pin")
        position = await view.locate()  # its first commit landed after the first look
    delta_version = None
    if fmt is not None and not await _taken(store, ref, name):
        try:
            delta_version = await pin_table(
                store, ref, generation=position.generation, ends=position.ends, fmt=fmt
            )
        except StoreError as exc:
            log.error("version %s of %s has no Delta version: %s", name, ref.root, exc)
    return await create_version(
        store, ref, name, generation=position.generation, ends=dict(position.ends), note=note,
        delta_version=delta_version,
    )  # fmt: skip


def table_format(settings: Settings, corpus: str) -> str | None:
    """The format of a corpus whose table is kept (None: ``RL_EXPORT_TABLES`` is off)."""
    if not settings.tables:
        return None
    return {spec.name: spec.format for spec in settings.corpora}.get(corpus, "trajectory")


async def _taken(store: ObjectStore, ref: CorpusRef, name: str) -> bool:
    """Whether version ``name`` exists (its create fails: no table commit is wasted)."""
    try:
        await store.get(version_key(ref, name))
    except ObjectNotFoundError:
        return False
    return True


async def pinned(
    store: ObjectStore, ref: CorpusRef, name: str | None, as_of: datetime | None
) -> Pinned:
    """The version ``name``, or the newest created at or before ``as_of``; VersionError when
    there is none."""
    if name is not None:
        version = await get_version(store, ref, name)
    elif as_of is not None:
        version = version_as_of(await list_versions(store, ref), as_of)
    else:
        raise VersionError("give a version name or a time")
    return Pinned(version, ViewPosition.from_json(version.position()))
