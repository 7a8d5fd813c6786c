"""One test body for every ObjectStore: memory and local in the unit tests, S3 in integration."""

from __future__ import annotations

import asyncio
import hashlib
import tempfile
from pathlib import Path

import pytest

from rl_export.corpora.store import ObjectStore
from rl_export.model.errors import ObjectExistsError, ObjectNotFoundError, StoreError


async def check_store_contract(store: ObjectStore) -> None:
    """Exercise every method of the interface and the create-only semantics."""
    await store.check()
    assert await store.list("acme/") == []

    await store.put("acme/bot/human/data/t-0/a.jsonl", b'{"a":1}\n')
    await store.put("acme/bot/human/data/t-0/a.jsonl", b'{"a":2}\n')  # put replaces
    assert await store.get("acme/bot/human/data/t-0/a.jsonl") == b'{"a":2}\n'

    await store.put_if_absent("acme/bot/human/_manifest/t-0/00000000000000000000.json", b"w1")
    with pytest.raises(ObjectExistsError):
        await store.put_if_absent("acme/bot/human/_manifest/t-0/00000000000000000000.json", b"w2")
    assert await store.get("acme/bot/human/_manifest/t-0/00000000000000000000.json") == b"w1"

    await store.put("acme/bot/evaluator/x.json", b"{}")
    await store.put("acme/botany/human/y.json", b"{}")
    assert await store.list("acme/bot/") == [
        "acme/bot/evaluator/x.json",
        "acme/bot/human/_manifest/t-0/00000000000000000000.json",
        "acme/bot/human/data/t-0/a.jsonl",
    ]
    assert await store.list("acme/bot/human/_manifest/t-0/0000") == [
        "acme/bot/human/_manifest/t-0/00000000000000000000.json"
    ]

    # From a position on, and the folders one level down.
    await store.put_if_absent("acme/bot/human/_manifest/t-0/00000000000000000007.json", b"w")
    await store.put_if_absent("acme/bot/human/_manifest/t-1/00000000000000000000.json", b"w")
    assert await store.list(
        "acme/bot/human/_manifest/t-0/", "acme/bot/human/_manifest/t-0/00000000000000000000"
    ) == [
        "acme/bot/human/_manifest/t-0/00000000000000000000.json",
        "acme/bot/human/_manifest/t-0/00000000000000000007.json",
    ]
    assert await store.list(
        "acme/bot/human/_manifest/t-0/", "acme/bot/human/_manifest/t-0/00000000000000000000.json"
    ) == ["acme/bot/human/_manifest/t-0/00000000000000000007.json"]
    assert await store.folders("acme/bot/human/_manifest/") == ["t-0", "t-1"]
    assert await store.folders("acme/bot/") == ["evaluator", "human"]
    assert await store.folders("acme/none/") == []
    assert await store.folders("") == ["acme"]  # the top level: the orgs
    await store.delete("acme/bot/human/_manifest/t-0/00000000000000000007.json")
    await store.delete("acme/bot/human/_manifest/t-1/00000000000000000000.json")

    with pytest.raises(ObjectNotFoundError):
        await store.get("acme/bot/missing.json")

    # Byte ranges (start, length), in the order asked: the web index's bodies.
    await store.put("acme/bot/human/data/t-0/b.jsonl", b"0123456789")
    assert await store.get_ranges("acme/bot/human/data/t-0/b.jsonl", [(7, 3), (0, 2), (4, 0)]) == [
        b"789", b"01", b"",
    ]  # fmt: skip
    assert await store.get_ranges("acme/bot/human/data/t-0/b.jsonl", []) == []
    with pytest.raises(StoreError):  # past the end: never a short body
        await store.get_ranges("acme/bot/human/data/t-0/b.jsonl", [(8, 5)])
    with pytest.raises(ObjectNotFoundError):
        await store.get_ranges("acme/bot/missing.json", [(0, 1)])
    await store.delete("acme/bot/human/data/t-0/b.jsonl")

    big = bytes(range(256)) * 50
    await store.put("acme/bot/human/data/t-0/big.jsonl", big)
    chunks = [c async for c in store.chunks("acme/bot/human/data/t-0/big.jsonl", 1000)]
    assert b"".join(chunks) == big
    assert max(len(c) for c in chunks) <= 1000
    assert len(chunks) >= len(big) // 1000
    # The sha256 of the stored bytes (a view verifies objects whose lines it took from a
    # sidecar this way), over more than one read buffer; an empty object's too.
    assert (
        await store.sha256("acme/bot/human/data/t-0/big.jsonl") == hashlib.sha256(big).hexdigest()
    )
    huge = bytes(range(251)) * 9000  # past one 1 MiB buffer
    await store.put("acme/bot/human/data/t-0/huge.jsonl", huge)
    assert (
        await store.sha256("acme/bot/human/data/t-0/huge.jsonl") == hashlib.sha256(huge).hexdigest()
    )
    await store.delete("acme/bot/human/data/t-0/huge.jsonl")
    await store.put("acme/bot/human/data/t-0/empty.jsonl", b"")
    assert await store.sha256("acme/bot/human/data/t-0/empty.jsonl") == hashlib.sha256().hexdigest()
    await store.delete("acme/bot/human/data/t-0/empty.jsonl")
    with pytest.raises(ObjectNotFoundError):
        await store.sha256("acme/bot/missing.json")
    with pytest.raises(ObjectNotFoundError):
        _ = [c async for c in store.chunks("acme/bot/missing.json")]
    await store.delete("acme/bot/human/data/t-0/big.jsonl")

    with tempfile.TemporaryDirectory() as folder:  # put_file: from a file, replacing
        path = Path(folder) / "export.csv"
        path.write_bytes(big)
        await store.put_file("_exports/acme/bot/j/export.csv", path)
        path.write_bytes(b"again")
        await store.put_file("_exports/acme/bot/j/export.csv", path)
    assert await store.get("_exports/acme/bot/j/export.csv") == b"again"
    await store.delete("_exports/acme/bot/j/export.csv")

    await store.delete("acme/bot/evaluator/x.json")
    await store.delete("acme/bot/evaluator/x.json")  # deleting twice is fine
    assert "acme/bot/evaluator/x.json" not in await store.list("acme/")

    for bad in ("", "/abs", "a/../b", "a//b", "dir/"):
        with pytest.raises(ValueError, match="key"):
            await store.put(bad, b"x")


async def check_create_only_race(store: ObjectStore, writers: int = 8) -> None:
    """Concurrent create-only writers of one key: exactly one wins, the object is its bytes."""
    key = "race/_manifest/t-0/00000000000000000042.json"

    async def attempt(n: int) -> int | None:
        try:
            await store.put_if_absent(key, f"writer-{n}".encode())
        except ObjectExistsError:
            return None
        return n

    results = await asyncio.gather(*(attempt(n) for n in range(writers)))
    winners = [r for r in results if r is not None]
    assert len(winners) == 1
    assert await store.get(key) == f"writer-{winners[0]}".encode()
