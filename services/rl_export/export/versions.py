"""Reading a corpus at a pinned version (docs/concepts/corpora.md, "Versions").

:func:`pin` finds where the corpus is now (:meth:`~rl_export.export.latest.LatestView.locate`:
its latest compaction and every chain's end) and stores it as a version
(:mod:`rl_export.corpora.versions`); :func:`pinned` turns ``--version NAME`` or ``--as-of
TIME`` (the newest version created at or before that time) into the
:class:`~rl_export.export.latest.ViewPosition` an export, stats or the Hugging Face dataset
reads, the same machinery as ``--from-manifest``.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from rl_export.corpora.layout import CorpusRef
from rl_export.corpora.store import ObjectStore
from rl_export.corpora.versions import (
    Version,
    create_version,
    get_version,
    list_versions,
    version_as_of,
)
from rl_export.export.latest import LatestView, ViewPosition
from rl_export.model.errors import NoDataError, VersionError


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


async def pin(store: ObjectStore, ref: CorpusRef, name: str, note: str = "") -> Version:
    """Pin the corpus's current position as ``name``; NoDataError for a corpus with no data,
    VersionError for a name taken or not valid."""
    view = LatestView(store, ref)
    position = await view.locate()
    if position.generation is None and not position.ends:
        if not await view.exists():
            raise NoDataError("corpus", f"no data for {ref.root} in {store.url}: nothing to pin")
        position = await view.locate()  # its first commit landed after the first look
    return await create_version(
        store, ref, name, generation=position.generation, ends=dict(position.ends), note=note
    )


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
