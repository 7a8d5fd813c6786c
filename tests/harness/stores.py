"""Object stores for unit tests that count what they are asked."""

from __future__ import annotations

from rl_export.corpora.store import MemoryStore


class CountingStore(MemoryStore):
    """A MemoryStore that counts its reads (``gets``)."""

    def __init__(self) -> None:
        super().__init__()
        self.gets = 0

    async def get(self, key: str) -> bytes:
        self.gets += 1
        return await super().get(key)
