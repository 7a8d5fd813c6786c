from __future__ import annotations

import os
from pathlib import Path

import pytest

from rl_export.corpora.store import LocalStore, MemoryStore, S3Store, open_store
from tests.store_contract import check_create_only_race, check_store_contract


async def test_memory_store_contract() -> None:
    await check_store_contract(MemoryStore())
    await check_create_only_race(MemoryStore())


async def test_local_store_contract(tmp_path: Path) -> None:
    store = LocalStore(tmp_path / "store")
    await check_store_contract(store)
    await check_create_only_race(store)


async def test_local_create_only_leaves_no_temporary_files(tmp_path: Path) -> None:
    store = LocalStore(tmp_path)
    await store.put_if_absent("a/b.json", b"1")
    with pytest.raises(Exception, match="exists"):
        await store.put_if_absent("a/b.json", b"2")
    assert sorted(os.listdir(tmp_path / "a")) == ["b.json"]
    assert await store.list() == ["a/b.json"]


def test_open_store_picks_the_implementation(tmp_path: Path) -> None:
    assert isinstance(open_store(str(tmp_path)), LocalStore)
    assert isinstance(open_store(f"file://{tmp_path}"), LocalStore)
    s3 = open_store("s3://my-bucket/corpora/v1")
    assert isinstance(s3, S3Store)
    assert (s3.bucket, s3.prefix) == ("my-bucket", "corpora/v1/")
