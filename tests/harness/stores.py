"""Object stores for unit tests that count what they are asked."""

from __future__ import annotations

from rl_export.corpora.store import MemoryStore


class CountingStore(MemoryStore):
    """A MemoryStore that counts its reads (``gets``) and listings (``lists``)."""

    def __init__(self) -> None:
        super().__init__()
        self.gets = 0
        self.lists = 0

    async def get(self, key: str) -> bytes:
        self.gets += 1
        return await super().get(key)

    async def list(self, prefix: str = "", start_after: str = "") -> list[str]:
        self.lists += 1
        return await super().list(prefix, start_after)
