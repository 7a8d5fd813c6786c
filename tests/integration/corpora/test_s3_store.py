"""The object-store contract against SeaweedFS over S3 (the same body as the unit tests)."""

from __future__ import annotations

import uuid

import pytest

from rl_export.corpora.store import S3Store, open_store
from rl_export.local.seaweed import LocalS3
from rl_export.model.errors import StoreError
from tests.store_contract import check_create_only_race, check_store_contract


async def test_s3_store_contract(s3: LocalS3) -> None:
    store = open_store(f"s3://{s3.bucket}/contract-{uuid.uuid4().hex[:8]}")
    try:
        await check_store_contract(store)
        await check_create_only_race(store)
    finally:
        await store.close()


async def test_s3_objects_are_read_back_byte_for_byte(s3: LocalS3) -> None:
    store = S3Store(s3.bucket, f"bytes-{uuid.uuid4().hex[:8]}")
    payload = bytes(range(256)) * 4096  # 1 MiB of every byte value
    try:
        await store.put("a/blob.bin", payload)
        assert await store.get("a/blob.bin") == payload
        assert await store.list("a/") == ["a/blob.bin"]
    finally:
        await store.close()


async def test_prefixes_isolate_stores_in_one_bucket(s3: LocalS3) -> None:
    one = S3Store(s3.bucket, f"one-{uuid.uuid4().hex[:8]}")
    two = S3Store(s3.bucket, f"two-{uuid.uuid4().hex[:8]}")
    try:
        await one.put("k.json", b"1")
        assert await two.list() == []
        await two.put_if_absent("k.json", b"2")  # same key, other prefix: no conflict
        assert await one.get("k.json") == b"1"
    finally:
        await one.close()
        await two.close()


async def test_a_missing_bucket_fails_the_readiness_check(s3: LocalS3) -> None:
    store = S3Store("no-such-bucket-here")
    try:
        with pytest.raises(StoreError, match="no-such-bucket-here"):
            await store.check()
    finally:
        await store.close()
