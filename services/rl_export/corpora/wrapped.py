"""A store around another: every call passed on, so that a wrapper overrides only what it
changes (:class:`~rl_export.corpora.metered.MeteredStore` counts writes,
:class:`~rl_export.web.fresh.FreshStore` adds a virtual chain)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from pathlib import Path

from rl_export.corpora.store import CHUNK, ObjectStore


class StoreWrapper:
    """Another store, every call passed on (see the module)."""

    def __init__(self, inner: ObjectStore) -> None:
        self.inner = inner
        self.url = inner.url

    async def put(self, key: str, data: bytes) -> None:
        await self.inner.put(key, data)

    async def put_if_absent(self, key: str, data: bytes) -> None:
        await self.inner.put_if_absent(key, data)

    async def put_file(self, key: str, path: Path) -> None:
        await self.inner.put_file(key, path)

    async def get(self, key: str) -> bytes:
        return await self.inner.get(key)

    async def get_ranges(self, key: str, ranges: Sequence[tuple[int, int]]) -> list[bytes]:
        return await self.inner.get_ranges(key, ranges)

    def chunks(self, key: str, size: int = CHUNK) -> AsyncIterator[bytes]:
        return self.inner.chunks(key, size)

    async def sha256(self, key: str) -> str:
        return await self.inner.sha256(key)

    async def folders(self, prefix: str) -> list[str]:
        return await self.inner.folders(prefix)

    async def list(self, prefix: str = "", start_after: str = "") -> list[str]:
        return await self.inner.list(prefix, start_after)

    async def delete(self, key: str) -> None:
        await self.inner.delete(key)

    async def check(self) -> None:
        await self.inner.check()

    async def close(self) -> None:
        await self.inner.close()
