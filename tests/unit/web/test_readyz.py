"""/readyz: not ready while the store fails or a warmed corpus's first pass is running."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import orjson

from rl_export.web.pages import readyz


class _Store:
    def __init__(self, error: Exception | None = None) -> None:
        self.error = error

    async def check(self) -> None:
        if self.error is not None:
            raise self.error


def _answer(svc: Any) -> tuple[int, dict[str, Any]]:
    response = asyncio.run(readyz(svc))
    return response.status_code, orjson.loads(response.body)


def test_ready_only_once_the_warmed_corpora_are_indexed() -> None:
    cold = ["acme/bot/traces"]
    svc = SimpleNamespace(store=_Store(), cold=lambda: list(cold))
    assert _answer(svc) == (503, {"ready": False, "indexing": ["acme/bot/traces"]})
    cold.clear()
    assert _answer(svc) == (200, {"ready": True})


def test_a_store_that_fails_is_not_ready_and_says_why() -> None:
    svc = SimpleNamespace(store=_Store(OSError("connection refused")), cold=lambda: [])
    assert _answer(svc) == (503, {"ready": False, "store": "connection refused"})
