"""A project's rubric versions in the object store (docs/guides/rubrics.md).

Version N of a project's rubric is the create-only object ``_rubrics/<org>/<project>/<N>.json``
(``{version, guidelines, questions, created_by, created_at}``); version 0 is built in
(:data:`~rl_export.model.rubrics.VERSION_0`) and never stored. A change makes version N + 1
with ``put_if_absent``: of two writers racing for the same N exactly one wins, the other reads
the winner and, when its own rubric differs, tries N + 2, so no version is ever overwritten and
labels always keep the meaning of theirs. Saving a rubric equal to the latest version makes
no new version.

:class:`RubricVersions` reads versions for the join (:class:`~rl_export.stream.rubriccheck.
RubricSource`), the sink's backfill and the web service; a version read is kept (they never
change), the latest version number for ``latest_cache_s`` seconds.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime

from pydantic import ValidationError

from rl_export.corpora.store import ObjectStore
from rl_export.model.codec import dumps, loads
from rl_export.model.errors import ObjectExistsError, ObjectNotFoundError, StoreError
from rl_export.model.events import format_utc
from rl_export.model.rubrics import VERSION_0, KnownRubrics, RubricSpec

PREFIX = "_rubrics/"
MAX_RACES = 16  # versions lost to other writers before a create gives up


def version_key(org: str, project: str, version: int) -> str:
    return f"{PREFIX}{org}/{project}/{version}.json"


def _number(key: str) -> int | None:
    stem = key.rsplit("/", 1)[-1].removesuffix(".json")
    return int(stem) if stem.isdigit() and stem == str(int(stem)) else None


@dataclass(frozen=True)
class StoredRubric:
    """One version as stored: its number, its content, who made it and when (version 0:
    nobody, never)."""

    version: int
    spec: RubricSpec
    created_by: str | None = None
    created_at: str | None = None

    def to_json(self) -> dict[str, object]:
        return {
            "version": self.version,
            **self.spec.model_dump(mode="json"),
            "created_by": self.created_by,
            "created_at": self.created_at,
        }


class RubricVersions:
    """Every project's rubric versions, read through from the store."""

    def __init__(
        self, store: ObjectStore, *, latest_cache_s: float = 2.0,
        clock: Callable[[], float] = time.monotonic, known: KnownRubrics | None = None,
    ) -> None:  # fmt: skip
        self.store = store
        self.latest_cache_s = latest_cache_s
        self.clock = clock
        self.known = known or KnownRubrics()
        self._stored: dict[tuple[str, str, int], StoredRubric] = {}
        self._latest: dict[tuple[str, str], tuple[float, int]] = {}

    async def fetch(self, org: str, project: str, version: int) -> RubricSpec | None:
        """The join's :class:`~rl_export.stream.rubriccheck.RubricSource`: a version's content,
        None when there is none."""
        found = await self.get(org, project, version)
        return None if found is None else found.spec

    async def get(self, org: str, project: str, version: int) -> StoredRubric | None:
        """Version ``version`` (None: there is none); StoreError when the store fails."""
        if version == 0:
            return StoredRubric(0, VERSION_0)
        if version < 0:
            return None
        key = (org, project, version)
        kept = self._stored.get(key)
        if kept is not None:
            return kept
        try:
            data = await self.store.get(version_key(org, project, version))
        except ObjectNotFoundError:
            return None
        found = _decode(data, version)
        if len(self._stored) >= self.known.limit:
            self._stored.clear()
        self._stored[key] = found
        self.known.add(org, project, version, found.spec)
        return found

    async def latest_version(self, org: str, project: str) -> int:
        """The newest version's number (0 when the project never changed its rubric)."""
        cached = self._latest.get((org, project))
        now = self.clock()
        if cached is not None and now - cached[0] < self.latest_cache_s:
            return cached[1]
        keys = await self.store.list(f"{PREFIX}{org}/{project}/")
        numbers = [n for k in keys if (n := _number(k)) is not None]
        latest = max(numbers, default=0)
        self._latest[(org, project)] = (now, latest)
        return latest

    async def latest(self, org: str, project: str) -> StoredRubric:
        """The project's current rubric (version 0 when it never changed it)."""
        version = await self.latest_version(org, project)
        found = await self.get(org, project, version)
        if found is None:  # listed a moment ago: a store that lost it
            raise StoreError(f"{version_key(org, project, version)} was listed but cannot be read")
        return found

    async def create(
        self, org: str, project: str, spec: RubricSpec, *, by: str, now: datetime
    ) -> tuple[StoredRubric, bool]:
        """Make ``spec`` the project's newest version; return it and whether it is new (an
        equal newest version is returned as it is)."""
        self._latest.pop((org, project), None)
        current = await self.latest(org, project)
        for _ in range(MAX_RACES):
            if current.spec == spec:
                return current, False
            version = current.version + 1
            made = StoredRubric(version, spec, by, format_utc(now))
            try:
                await self.store.put_if_absent(
                    version_key(org, project, version), dumps(made.to_json())
                )
            except ObjectExistsError:  # another writer made this version first: read it
                winner = await self.get(org, project, version)
                if winner is None:
                    raise StoreError(f"{version_key(org, project, version)} exists but cannot "
                                     "be read") from None  # fmt: skip
                current = winner
                continue
            self._stored[(org, project, version)] = made
            self.known.add(org, project, version, spec)
            self._latest[(org, project)] = (self.clock(), version)
            return made, True
        raise StoreError(f"{MAX_RACES} other writers changed the rubric of {org}/{project} "
                         "meanwhile; try again")  # fmt: skip


def _decode(data: bytes, version: int) -> StoredRubric:
    try:
        value = loads(data)
        if not isinstance(value, dict):
            raise TypeError("not an object")
        spec = RubricSpec.model_validate(
            {k: value[k] for k in ("guidelines", "questions") if k in value}
        )
    except (ValueError, TypeError, ValidationError) as exc:
        raise StoreError(f"rubric version {version} is not readable: {exc}") from None
    return StoredRubric(version, spec, value.get("created_by"), value.get("created_at"))
