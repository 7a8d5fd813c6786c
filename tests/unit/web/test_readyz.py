"""/readyz: not ready while the store fails or a warmed corpus's first pass is running."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import orjson
import pytest

from rl_export.web.follower import Followed
from rl_export.web.index import CorpusKey
from rl_export.web.pages import readyz
from rl_export.web.services import Services


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


def test_a_store_that_fails_is_not_ready_and_keeps_its_error_to_the_log(
    caplog: pytest.LogCaptureFixture,
) -> None:
    error = OSError("connection refused by s3.internal.example:9000 /secret/path")
    svc = SimpleNamespace(store=_Store(error), cold=lambda: [])
    assert _answer(svc) == (503, {"ready": False, "store": "unavailable"})
    assert "s3.internal.example" in caplog.text


def test_a_failed_first_pass_keeps_the_instance_out_of_traffic() -> None:
    """A pass that fails releases the corpus's waiting requests (first_pass is set), but the
    instance is ready only once a pass has completed."""
    followed = Followed(CorpusKey("acme", "bot", "traces"), asyncio.Event(), 0.0)
    svc = SimpleNamespace(warming=[followed])
    assert Services.cold(svc) == ["acme/bot/traces"]  # type: ignore[arg-type]
    followed.first_pass.set()
    followed.error = "disk full"
    assert Services.cold(svc) == ["acme/bot/traces"]  # type: ignore[arg-type]
    followed.passes = 1
    assert Services.cold(svc) == []  # type: ignore[arg-type]
