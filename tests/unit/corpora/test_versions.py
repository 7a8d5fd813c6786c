"""Pinned versions as objects (DESIGN.md section 5, "Versions")."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from rl_export.corpora.layout import CorpusRef
from rl_export.corpora.store import MemoryStore
from rl_export.corpora.versions import (
    create_version,
    delete_version,
    get_version,
    list_versions,
    project_versions,
    version_as_of,
    version_key,
)
from rl_export.model.errors import VersionError

REF = CorpusRef("acme", "bot", "human")


async def test_a_version_is_a_create_only_object_under_versions() -> None:
    store = MemoryStore()
    made = await create_version(store, REF, "v1", generation=3, ends={"t-1": 9, "t-0": 4},
                                note="first run")  # fmt: skip
    assert version_key(REF, "v1") == "_versions/acme/bot/human/v1.json"
    assert await get_version(store, REF, "v1") == made
    assert made.position() == {"generation": 3, "ends": {"t-0": 4, "t-1": 9}}
    with pytest.raises(VersionError, match=r"^version: version 'v1' of acme/bot/human already"):
        await create_version(store, REF, "v1", generation=4, ends={})
    assert await get_version(store, REF, "v1") == made  # not rewritten


async def test_list_show_and_delete() -> None:
    store = MemoryStore()
    await create_version(store, REF, "b", generation=None, ends={"t-0": 2})
    await create_version(store, REF, "a", generation=1, ends={})
    other = CorpusRef("acme", "bot", "evaluator")
    await create_version(store, other, "a", generation=1, ends={})
    assert [v.name for v in await list_versions(store, REF)] == ["b", "a"]  # by creation
    assert sorted((v.corpus, v.name) for v in await project_versions(store, "acme", "bot")) == [
        ("evaluator", "a"), ("human", "a"), ("human", "b")]  # fmt: skip
    assert await project_versions(store, "acme", "other") == []
    await delete_version(store, REF, "b")
    assert [v.name for v in await list_versions(store, REF)] == ["a"]
    with pytest.raises(VersionError, match=r"no version 'b' of acme/bot/human"):
        await get_version(store, REF, "b")
    with pytest.raises(VersionError, match=r"no version 'b'"):
        await delete_version(store, REF, "b")


@pytest.mark.parametrize("name", ["", "../x", "a/b", ".hidden", "-x", "x" * 129, "a b"])
async def test_a_name_that_cannot_be_a_file_name_is_refused(name: str) -> None:
    with pytest.raises(VersionError, match="is not valid"):
        await create_version(MemoryStore(), REF, name, generation=None, ends={})


async def test_as_of_picks_the_newest_version_at_or_before_the_time() -> None:
    store = MemoryStore()
    first = await create_version(store, REF, "first", generation=1, ends={})
    second = await create_version(store, REF, "second", generation=2, ends={})
    versions = await list_versions(store, REF)
    assert version_as_of(versions, second.created()) == second
    assert version_as_of(versions, second.created() + timedelta(days=1)) == second
    if first.created() < second.created():
        assert version_as_of(versions, first.created()) == first
    with pytest.raises(VersionError, match="no version created at or before"):
        version_as_of(versions, first.created() - timedelta(seconds=1))
    with pytest.raises(VersionError, match="no version created"):
        version_as_of([], datetime.now(UTC))
