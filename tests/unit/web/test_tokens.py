"""Tokens: only a hash is stored, checking is cached, revocation takes the cache time."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta

import pytest

from rl_export.corpora.store import MemoryStore
from rl_export.model.codec import loads
from rl_export.web.tokens import (
    Caller,
    Scope,
    TokenError,
    TokenRejected,
    TokenStore,
    TokenVerifier,
    parse_expiry,
    parse_scopes,
    split_token,
)
from tests.harness.stores import CountingStore

NOW = datetime(2026, 1, 1, tzinfo=UTC)


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_scopes_parse_and_admin_holds_both() -> None:
    assert parse_scopes("label, export,label") == ("label", "export")
    for bad in ("", "read", "label,write"):
        with pytest.raises(TokenError):
            parse_scopes(bad)


def test_raw_is_held_only_when_given_never_through_admin() -> None:
    assert parse_scopes("export,raw") == ("export", "raw")

    def caller(*scopes: Scope) -> Caller:
        return Caller(token_id="0" * 12, subject="s", org="o", project="p", scopes=scopes)

    admin = caller("admin")
    assert admin.allows("label")
    assert admin.allows("export")
    assert not admin.allows("raw")
    assert caller("export", "raw").allows("raw")
    assert caller("admin", "raw").allows("raw")


async def test_the_store_holds_a_hash_never_the_token() -> None:
    store = MemoryStore()
    record, token = await TokenStore(store).create("acme", "bot", "ana", ("label",), NOW)
    parts = split_token(token)
    assert parts is not None
    assert parts[0] == record.id
    stored = store.objects[f"_tokens/{record.id}.json"]
    assert parts[1].encode() not in stored
    assert token.encode() not in stored
    assert loads(stored)["secret_sha256"] == record.secret_sha256
    assert [r.id for r in await TokenStore(store).list()] == [record.id]


@pytest.mark.parametrize(
    ("org", "subject"), [("a/b", "ana"), ("", "ana"), ("acme", ""), ("acme", "x\ny")]
)
async def test_bad_token_requests_are_refused(org: str, subject: str) -> None:
    with pytest.raises(TokenError):
        await TokenStore(MemoryStore()).create(org, "bot", subject, ("label",), NOW)


async def test_verify_gives_the_caller_and_refuses_everything_else() -> None:
    store = MemoryStore()
    tokens = TokenStore(store)
    _, token = await tokens.create("acme", "bot", "ana", ("label", "export"), NOW)
    verifier = TokenVerifier(tokens, cache_s=5)
    caller = await verifier.verify(token)
    assert (caller.subject, caller.org, caller.project) == ("ana", "acme", "bot")
    assert caller.allows("label")
    assert caller.allows("export")
    assert not caller.allows("admin")
    token_id, secret = split_token(token) or ("", "")
    wrong_secret = f"rlx_{token_id}_{'A' * 43}"
    for bad, reason in [
        ("nope", "malformed"),
        (token + "x", "malformed"),
        (wrong_secret, "unknown"),
        (f"rlx_{'0' * 12}_{secret}", "unknown"),
    ]:
        with pytest.raises(TokenRejected) as caught:
            await verifier.verify(bad)
        assert caught.value.reason == reason
        assert secret not in caught.value.detail  # fmt: skip


async def test_checks_are_cached_and_a_revocation_lands_within_the_cache_time() -> None:
    store = CountingStore()
    tokens = TokenStore(store)
    record, token = await tokens.create("acme", "bot", "ana", ("admin",), NOW)
    clock = Clock()
    verifier = TokenVerifier(tokens, cache_s=5, clock=clock)
    for _ in range(10):
        assert (await verifier.verify(token)).allows("label")
    assert store.gets == 1
    await tokens.revoke(record.id, NOW)
    clock.now = 4.9
    await verifier.verify(token)  # still cached
    clock.now = 5.1
    with pytest.raises(TokenRejected) as caught:
        await verifier.verify(token)
    assert caught.value.reason == "revoked"
    listed = await tokens.list()
    assert listed[0].revoked_at == NOW
    with pytest.raises(TokenError):
        await tokens.revoke("0" * 12, NOW)


async def test_unknown_ids_are_cached_too() -> None:
    store = CountingStore()
    verifier = TokenVerifier(TokenStore(store), cache_s=5, clock=Clock())
    for _ in range(5):
        with pytest.raises(TokenRejected):
            await verifier.verify(f"rlx_{'1' * 12}_{'B' * 43}")
    assert store.gets == 1


# --- odd requests and expiry (DESIGN.md section 10) ------------------------------------------


async def test_a_malformed_token_is_refused_without_reading_the_store() -> None:
    store = CountingStore()
    verifier = TokenVerifier(TokenStore(store), 60)
    for bad in ("", "Bearer", "rlx_", "rlx_zzzzzzzzzzzz_" + "a" * 43, "x" * 10_000):
        assert verifier.known(bad)
        with pytest.raises(TokenRejected) as refused:
            await verifier.verify(bad)
        assert refused.value.reason == "malformed"
    assert store.gets == 0


async def test_the_cache_of_unknown_ids_is_bounded_and_never_pushes_out_real_tokens() -> None:
    store = CountingStore()
    tokens = TokenStore(store)
    _, real = await tokens.create("acme", "bot", "ana", ("label",), NOW)
    verifier = TokenVerifier(tokens, 60, Clock(), max_entries=100)
    await verifier.verify(real)
    for n in range(1_000):
        with pytest.raises(TokenRejected):
            await verifier.verify(f"rlx_{n:012x}_" + "a" * 43)
    assert len(verifier._unknown) == 100
    assert store.gets == 1_001
    assert verifier.known(real)  # the flood did not push the real token's record out
    await verifier.verify(real)
    assert store.gets == 1_001


async def test_listed_asks_the_listing_not_the_records_at_most_once_a_second() -> None:
    class SlowListing(CountingStore):
        async def list(self, prefix: str = "", start_after: str = "") -> list[str]:
            await asyncio.sleep(0.01)
            return await super().list(prefix, start_after)

    store = SlowListing()
    tokens = TokenStore(store)
    clock = Clock()
    slept: list[float] = []

    async def sleep(seconds: float) -> None:  # the clock moves as a real sleep would
        slept.append(seconds)
        clock.now += seconds

    verifier = TokenVerifier(tokens, 5, clock, sleep=sleep)
    made_up = [f"rlx_{n:012x}_" + "b" * 43 for n in range(50)]
    # At once: one listing answers them all, and no record is read.
    assert not any(await asyncio.gather(*(verifier.listed(t) for t in made_up)))
    assert (store.lists, store.gets) == (1, 0)
    # A token made since the last listing is found by the next, a second after it.
    _, real = await tokens.create("acme", "bot", "bo", ("label",), NOW)
    clock.now += 0.25
    assert await verifier.listed(real)
    assert store.lists == 2
    assert slept == [pytest.approx(0.75)]
    assert await verifier.listed(real)  # in the listing: none more
    assert store.lists == 2
    # One after another, made-up ids list again, never twice within a second.
    started = clock.now
    for token in made_up[:10]:
        assert not await verifier.listed(token)
    assert store.lists == 12
    assert clock.now - started >= 10 * 1.0 - 1e-9
    assert store.gets == 0
    assert not await verifier.listed("nope")


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("90d", 90 * 86_400), ("12h", 43_200), ("30m", 1_800), ("45s", 45), ("never", None)],
)
def test_expiry_durations(text: str, seconds: int | None) -> None:
    found = parse_expiry(text)
    assert (found.total_seconds() if found is not None else None) == seconds


@pytest.mark.parametrize("bad", ["", "90", "0d", "-1d", "1w", "1.5h", "9999999d", "forever"])
def test_bad_expiry_durations_are_refused(bad: str) -> None:
    with pytest.raises(TokenError, match="--expires-in"):
        parse_expiry(bad)


async def test_an_expired_token_is_refused_as_expired() -> None:
    wall = [NOW]
    verifier = TokenVerifier(TokenStore(MemoryStore()), 60, Clock(), wall=lambda: wall[0])
    _, token = await verifier.tokens.create("acme", "bot", "ana", ("label",), NOW,
                                            expires_in=timedelta(hours=12))  # fmt: skip
    wall[0] = NOW + timedelta(hours=11, minutes=59)
    assert (await verifier.verify(token)).subject == "ana"
    wall[0] = NOW + timedelta(hours=12)
    with pytest.raises(TokenRejected) as refused:
        await verifier.verify(token)
    assert refused.value.reason == "expired"
    assert token not in refused.value.detail


async def test_a_token_without_expiry_never_expires() -> None:
    verifier = TokenVerifier(TokenStore(MemoryStore()), 60, Clock(),
                             wall=lambda: NOW + timedelta(days=100_000))  # fmt: skip
    record, token = await verifier.tokens.create("acme", "bot", "ana", ("label",), NOW)
    assert record.expires_at is None
    assert (await verifier.verify(token)).subject == "ana"
