"""Each subject's share of export work: 429 over it, freed on release, tenants apart."""

from __future__ import annotations

import threading

import pytest

from rl_export.web.errors import TooMany
from rl_export.web.limits import FailureLimit, SubjectLimit

ANA = ("acme", "bot", "ana")


def limit(n: int = 2) -> SubjectLimit:
    return SubjectLimit(n, kind="exports", what="direct exports running", retry_after_s=5)


def test_a_subject_gets_its_share_and_then_a_429_with_retry_after() -> None:
    shares = limit(2)
    held = [shares.acquire(ANA), shares.acquire(ANA)]
    with pytest.raises(TooMany) as refused:
        shares.acquire(ANA)
    assert refused.value.status == 429
    assert refused.value.retry_after_s == 5
    assert refused.value.kind == "exports"
    assert "2 direct exports running" in refused.value.detail
    held[0].release()
    assert shares.held(ANA) == 1
    shares.acquire(ANA)  # room again
    assert shares.held(ANA) == 2


def test_subjects_and_tenants_do_not_share_a_limit() -> None:
    shares = limit(1)
    shares.acquire(ANA)
    shares.acquire(("acme", "bot", "bo"))
    shares.acquire(("other-org", "bot", "ana"))  # the same name in another tenant
    shares.acquire(("acme", "other", "ana"))
    assert shares.total() == 4
    with pytest.raises(TooMany):
        shares.acquire(ANA)


def test_a_slot_releases_once_however_often_it_is_released() -> None:
    shares = limit(2)
    slot = shares.acquire(ANA)
    shares.acquire(ANA)
    slot.release()
    slot.release()
    assert not slot.held
    assert shares.held(ANA) == 1


def test_released_subjects_leave_the_table() -> None:
    shares = limit(1)
    for n in range(1000):
        shares.acquire(("acme", "bot", f"user-{n}")).release()
    assert shares.total() == 0
    assert shares._held == {}


def test_concurrent_acquires_never_exceed_the_share() -> None:
    shares = limit(3)
    granted: list[object] = []
    refused: list[TooMany] = []
    lock = threading.Lock()
    start = threading.Barrier(16)

    def one() -> None:
        start.wait()
        try:
            slot = shares.acquire(ANA)
        except TooMany as exc:
            with lock:
                refused.append(exc)
            return
        with lock:
            granted.append(slot)

    threads = [threading.Thread(target=one) for _ in range(16)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert (len(granted), len(refused)) == (3, 13)


def test_a_share_of_zero_is_refused() -> None:
    with pytest.raises(ValueError, match="at least 1"):
        limit(0)


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_an_address_over_its_failures_waits_for_the_window_to_end() -> None:
    clock = Clock()
    failures = FailureLimit(3, window_s=60, clock=clock)
    for _ in range(2):
        failures.note("10.0.0.1")
    assert failures.retry_after("10.0.0.1") == 0
    failures.note("10.0.0.1")
    clock.now = 15.0
    assert failures.retry_after("10.0.0.1") == 45
    assert failures.retry_after("10.0.0.2") == 0  # another address is not held back
    clock.now = 60.0
    assert failures.retry_after("10.0.0.1") == 0
    failures.note("10.0.0.1")  # a new window starts from one
    assert failures.retry_after("10.0.0.1") == 0


def test_the_addresses_remembered_are_bounded() -> None:
    failures = FailureLimit(1, max_addresses=50, clock=Clock())
    for n in range(500):
        failures.note(f"10.0.{n // 256}.{n % 256}")
    assert len(failures._seen) == 50
    assert failures.retry_after("10.0.1.243") > 0  # the latest are kept
    assert failures.retry_after("10.0.0.0") == 0  # the oldest forgotten
