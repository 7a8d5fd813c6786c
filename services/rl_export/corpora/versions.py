"""Pinned corpus versions (docs/concepts/corpora.md, "Versions").

A version names a position of one corpus: its compaction ``generation`` (None: none yet) and,
per chain, the offset after the last commit it holds (``ends``), the same position an export's
lineage manifest records. It is one create-only object
``_versions/<org>/<project>/<corpus>/<name>.json``: the first create of a name wins, a second
is a :class:`VersionError`, and nothing rewrites it. :func:`expire
<rl_export.corpora.compaction.expire>` keeps every object a live version needs (its
compaction's folder, and every commit from that compaction's positions on); deleting the
version releases them.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from datetime import datetime

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from rl_export.corpora.commits import ChainError
from rl_export.corpora.layout import CorpusRef, utc_now
from rl_export.corpora.store import ObjectStore
from rl_export.model.codec import dumps
from rl_export.model.errors import ObjectExistsError, ObjectNotFoundError, VersionError

VERSIONS_ROOT = "_versions"
NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
NOTE_MAX = 2000


class Version(BaseModel):
    """What ``_versions/<org>/<project>/<corpus>/<name>.json`` holds."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str
    org: str
    project: str
    corpus: str
    note: str = ""
    created_at: str
    generation: int | None = Field(default=None, ge=1)
    ends: dict[str, int] = {}
    # The Delta version of the corpus's table that holds this position (DESIGN.md section
    # 13); None when no table version does (no table, or it could not be written).
    delta_version: int | None = Field(default=None, ge=0)

    def position(self) -> dict[str, object]:
        """The position as :meth:`~rl_export.export.latest.ViewPosition.to_json` gives it."""
        return {"generation": self.generation, "ends": dict(sorted(self.ends.items()))}

    def created(self) -> datetime:
        return datetime.fromisoformat(self.created_at.replace("Z", "+00:00"))


def check_version_name(name: str) -> str:
    """A version name becomes a file name: letters, digits, ``.``, ``_``, ``-`` (at most 128,
    not starting with a dot or dash)."""
    if not NAME.match(name):
        raise VersionError(
            f"version name {name[:80]!r} is not valid (letters, digits, . _ -; at most 128, "
            "starting with a letter or digit)"
        )
    return name


def versions_prefix(ref: CorpusRef) -> str:
    return f"{VERSIONS_ROOT}/{ref.root}/"


def version_key(ref: CorpusRef, name: str) -> str:
    return f"{versions_prefix(ref)}{check_version_name(name)}.json"


async def create_version(
    store: ObjectStore,
    ref: CorpusRef,
    name: str,
    *,
    generation: int | None,
    ends: dict[str, int],
    note: str = "",
    delta_version: int | None = None,
) -> Version:
    """Pin ``(generation, ends)`` of ``ref`` as ``name``; VersionError when it exists."""
    if len(note) > NOTE_MAX:
        raise VersionError(f"the note has {len(note)} characters, at most {NOTE_MAX}")
    version = Version(
        name=check_version_name(name), org=ref.org, project=ref.project, corpus=ref.corpus,
        note=note, created_at=utc_now(), generation=generation, ends=dict(sorted(ends.items())),
        delta_version=delta_version,
    )  # fmt: skip
    try:
        # Without a Delta version the object is as it was before tables (older readers).
        body = version.model_dump(
            mode="json", exclude={"delta_version"} if delta_version is None else None
        )
        await store.put_if_absent(version_key(ref, name), dumps(body))
    except ObjectExistsError:
        raise VersionError(
            f"version {name!r} of {ref.root} already exists (versions are never rewritten: "
            "delete it first or pick another name)"
        ) from None
    return version


def _parse(key: str, data: bytes) -> Version:
    try:
        return Version.model_validate_json(data)
    except ValidationError as exc:
        raise VersionError(f"{key} is not a version ({exc.errors()[0]['msg']})") from None


async def get_version(store: ObjectStore, ref: CorpusRef, name: str) -> Version:
    """The version ``name`` of ``ref``; VersionError when there is none."""
    key = version_key(ref, name)
    try:
        data = await store.get(key)
    except ObjectNotFoundError:
        raise VersionError(
            f"no version {name!r} of {ref.root} (rl-export versions list shows them)"
        ) from None
    return _parse(key, data)


async def list_versions(store: ObjectStore, ref: CorpusRef) -> list[Version]:
    """Every version of ``ref``, oldest first (then by name)."""
    return await _listed(store, versions_prefix(ref))


async def project_versions(store: ObjectStore, org: str, project: str) -> list[Version]:
    """Every version of every corpus of a project, oldest first (then by corpus and name)."""
    return await _listed(store, f"{VERSIONS_ROOT}/{org}/{project}/")


async def _listed(store: ObjectStore, prefix: str) -> list[Version]:
    found = []
    for key in await store.list(prefix):
        if not key.endswith(".json"):
            continue
        try:
            data = await store.get(key)
        except ObjectNotFoundError:  # deleted while listing
            continue
        found.append(_parse(key, data))
    return sorted(found, key=lambda v: (v.created(), v.corpus, v.name))


async def all_versions(store: ObjectStore) -> list[tuple[str, Version | VersionError]]:
    """Every version object in the store, each parsed or the reason it is not (verify)."""
    out: list[tuple[str, Version | VersionError]] = []
    for key in await store.list(f"{VERSIONS_ROOT}/"):
        try:
            out.append((key, _parse(key, await store.get(key))))
        except ObjectNotFoundError:
            continue
        except VersionError as exc:
            out.append((key, exc))
    return out


def version_as_of(versions: list[Version], at: datetime) -> Version:
    """The newest version created at or before ``at``; VersionError when none is."""
    before = [v for v in versions if v.created() <= at]
    if not before:
        raise VersionError(f"no version created at or before {at.isoformat()}")
    return max(before, key=lambda v: (v.created(), v.name))


async def delete_version(store: ObjectStore, ref: CorpusRef, name: str) -> Version:
    """Delete the version ``name`` (what only it needed goes at the next expiry)."""
    version = await get_version(store, ref, name)
    await store.delete(version_key(ref, name))
    return version


def check_chain_end(
    ref: CorpusRef, stream: str, position: int, end: int | None, offsets: Iterable[int]
) -> None:
    """After a walk of a chain stopped at ``position``: a read up to a version's (or view's)
    ``end`` must have reached it exactly; a read of the latest must have found no commit
    beyond (``offsets``: the chain's listed first offsets), which would be a gap. Either
    failing is a ChainError naming the chain."""
    if end is not None:
        if position != end:
            raise ChainError(
                f"{ref.manifest_prefix(stream)}: the version ends at offset {end}, the chain "
                f"reaches {position}"
            )
        return
    later = min((offset for offset in offsets if offset > position), default=None)
    if later is not None:
        raise ChainError(
            f"{ref.manifest_prefix(stream)}: no commit at offset {position} but commits from "
            f"{later} on (a gap, or history the chain no longer holds)"
        )
