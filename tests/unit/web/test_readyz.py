"""/readyz: not ready while the store has failed for a while (checked in the background, not
per probe) or a warmed corpus's first pass is running."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import orjson
import pytest

from rl_export.index.follower import Followed
from rl_export.index.queryindex import CorpusKey
from rl_export.model.errors import KafkaAccessError
from rl_export.web.pages import readyz
from rl_export.web.services import Services
from rl_export.web.storehealth import StoreHealth


class _Store:
    def __init__(self, error: Exception | None = None) -> None:
        self.error = error
        self.checks = 0

    async def check(self) -> None:
        self.checks += 1
        if self.error is not None:
            raise self.error


class _Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _health(store: _Store, clock: _Clock | None = None) -> StoreHealth:
    health = StoreHealth(store, every_s=10, grace_s=45, clock=clock or _Clock())  # type: ignore[arg-type]
    asyncio.run(health.check_once())
    return health


def _answer(svc: Any) -> tuple[int, dict[str, Any]]:
    response = asyncio.run(readyz(svc))
    return response.status_code, orjson.loads(response.body)


def test_ready_only_once_the_warmed_corpora_are_indexed() -> None:
    cold = ["acme/bot/traces"]
    svc = SimpleNamespace(store_health=_health(_Store()), cold=lambda: list(cold),
                          labels_refused=lambda: None)  # fmt: skip
    assert _answer(svc) == (503, {"ready": False, "indexing": ["acme/bot/traces"]})
    cold.clear()
    assert _answer(svc) == (200, {"ready": True})


def test_a_store_that_fails_is_not_ready_and_keeps_its_error_to_the_log(
    caplog: pytest.LogCaptureFixture,
) -> None:
    error = OSError("connection refused by s3.internal.example:9000 /secret/path")
    svc = SimpleNamespace(store_health=_health(_Store(error)), cold=lambda: [],
                          labels_refused=lambda: None)  # fmt: skip
    assert _answer(svc) == (503, {"ready": False, "store": "unavailable"})
    assert "s3.internal.example" in caplog.text


def test_labels_the_acls_refuse_keep_the_instance_out_of_traffic() -> None:
    refused = KafkaAccessError("RL_EXPORT_KAFKA_SASL_USERNAME", "no Write on labels.submitted")
    why: list[KafkaAccessError | None] = [refused]
    svc = SimpleNamespace(store_health=_health(_Store()), cold=lambda: [],
                          labels_refused=lambda: why[0])  # fmt: skip
    assert _answer(svc) == (503, {"ready": False, "labels": "not allowed"})
    why[0] = None  # a later check passed: the ACL was granted
    assert _answer(svc) == (200, {"ready": True})


def test_not_ready_before_the_first_check() -> None:
    health = StoreHealth(_Store())  # type: ignore[arg-type]
    assert health.problem() == "the object store has not been checked yet"


def test_a_blip_keeps_the_instance_ready_and_probes_never_reach_the_store() -> None:
    store, clock = _Store(), _Clock()
    health = _health(store, clock)
    svc = SimpleNamespace(store_health=health, cold=lambda: [], labels_refused=lambda: None)
    for _ in range(5):
        assert _answer(svc) == (200, {"ready": True})
    assert store.checks == 1  # the probes read the last check's result
    store.error = OSError("503 Slow Down")
    clock.now += 10
    asyncio.run(health.check_once())  # one failed check: still ready
    assert _answer(svc) == (200, {"ready": True})
    clock.now += 40  # no success for 50 s: out of traffic (the reason goes to the log)
    asyncio.run(health.check_once())
    assert _answer(svc) == (503, {"ready": False, "store": "unavailable"})
    store.error = None
    asyncio.run(health.check_once())
    assert _answer(svc) == (200, {"ready": True})


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
