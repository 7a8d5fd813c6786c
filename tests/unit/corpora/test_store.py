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


async def test_local_chunks_read_ahead_and_close_early(tmp_path: Path) -> None:
    """The next chunk is read while this one is used; a reader that stops early waits for
    the read in flight and closes the file."""
    store = LocalStore(tmp_path)
    data = os.urandom(10_000)
    await store.put("a/b.jsonl", data)
    assert b"".join([c async for c in store.chunks("a/b.jsonl", 999)]) == data
    chunks = store.chunks("a/b.jsonl", 1000)
    first = await anext(chunks)
    assert first == data[:1000]
    await chunks.aclose()  # the second read was in flight
    assert not _open_files(tmp_path / "a" / "b.jsonl")
    assert b"".join([c async for c in store.chunks("a/b.jsonl", 10_000)]) == data


def _open_files(path: Path) -> list[str]:
    """This process's file descriptors open on ``path``."""
    fds = Path("/proc/self/fd")
    return [fd.name for fd in fds.iterdir() if fd.resolve() == path.resolve()]
