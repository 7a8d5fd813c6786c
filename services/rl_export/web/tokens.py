"""API tokens: created and revoked by ``rl-export tokens``, checked by every web instance.

A token is ``rlx_<id>_<secret>``: ``id`` (12 hex digits) names its record, ``secret`` (32
random bytes, URL-safe base64) proves it. The record lives in the object store under
``_tokens/<id>.json``, so every instance sees it, and holds the token's subject, org,
project and scopes and the SHA-256 of the secret, never the secret: a plain hash is enough
for 256 random bits (nothing to guess), and a stolen store does not give working tokens.

Checking a token (:class:`TokenVerifier`): split it (a malformed token is refused without
any I/O), read the record (cached for ``web_token_cache_s`` in a bounded cache, an unknown id
in another, so a flood of made-up ids never pushes out the records of real tokens, and
concurrent checks of one id share one read: an id costs at most one store read per cache
period), compare the secret's hash in constant time (``hmac.compare_digest``), and refuse a
revoked or expired record. Whether an id names a token at all can also be asked of the
listing of the records' keys (:meth:`TokenVerifier.listed`: at most one listing a second,
shared by every request), which costs no read per id: the web service asks it for the
requests of an address over its limit of unknown tokens, so that their made-up ids cost
nothing while a real token from the same address is still served. A revocation rewrites
the record; every instance stops accepting the token within the cache time. A token expires
``expires_at`` (``tokens create --expires-in``, default 90 days; ``never``: no expiry).
Tokens are never logged: errors name the token's id at most.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import re
import secrets
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta
from typing import Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from rl_export.corpora.store import ObjectStore
from rl_export.formats.specs import SAFE_NAME
from rl_export.model.codec import dumps, loads
from rl_export.model.errors import ObjectNotFoundError
from rl_export.model.events import UtcDatetime

T = TypeVar("T")
Scope = Literal["label", "export", "admin", "raw", "review"]
SCOPES: tuple[Scope, ...] = ("label", "export", "admin", "raw", "review")
EXPLICIT: tuple[Scope, ...] = ("raw", "review")
"""Scopes ``admin`` does not imply: reading with less redaction, and deciding disputed traces."""
PREFIX = "_tokens/"
LIST_EVERY_S = 1.0  # the least time between two listings of the token ids (TokenVerifier.listed)
_TOKEN = re.compile(r"^rlx_([0-9a-f]{12})_([A-Za-z0-9_\-]{43})$")
_SUBJECT = re.compile(r"^[^\x00-\x1f\x7f]{1,200}$")


class TokenError(ValueError):
    """A token request that cannot be met (bad subject, scope, org or project)."""


class TokenRecord(BaseModel):
    """What the store keeps of a token."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    id: str = Field(pattern=r"^[0-9a-f]{12}$")
    org: str = Field(pattern=SAFE_NAME.pattern)
    project: str = Field(pattern=SAFE_NAME.pattern)
    subject: str = Field(pattern=_SUBJECT.pattern)
    scopes: tuple[Scope, ...] = Field(min_length=1)
    created_at: UtcDatetime
    revoked_at: UtcDatetime | None = None
    expires_at: UtcDatetime | None = None  # None: never (records made before expiry existed)
    secret_sha256: str = Field(pattern=r"^[0-9a-f]{64}$")


class Caller(BaseModel):
    """Who is calling: the token's subject, org/project and scopes."""

    model_config = ConfigDict(frozen=True)

    token_id: str
    subject: str
    org: str
    project: str
    scopes: tuple[Scope, ...]

    def allows(self, scope: Scope) -> bool:
        """``admin`` holds both ``label`` and ``export``; ``raw`` (reading with a redaction
        weaker than the project's default) and ``review`` (the review queue and its
        decisions) are held only when given."""
        return scope in self.scopes or ("admin" in self.scopes and scope not in EXPLICIT)


def parse_scopes(text: str) -> tuple[Scope, ...]:
    """``label,export`` -> ("label", "export"); TokenError for anything else."""
    found: list[Scope] = []
    for item in (part.strip() for part in text.split(",")):
        if not item:
            continue
        scope = next((s for s in SCOPES if s == item), None)
        if scope is None:
            raise TokenError(f"unknown scope {item!r} (scopes: {', '.join(SCOPES)})")
        if scope not in found:
            found.append(scope)
    if not found:
        raise TokenError(f"no scope given (scopes: {', '.join(SCOPES)})")
    return tuple(found)


DEFAULT_EXPIRY = "90d"
_DURATION = re.compile(r"^([1-9][0-9]{0,5})([dhms])$")
_UNIT_S = {"d": 86_400, "h": 3_600, "m": 60, "s": 1}


def parse_expiry(text: str) -> timedelta | None:
    """``90d``, ``12h``, ``30m``, ``45s`` -> the duration; ``never`` -> None; TokenError else."""
    value = text.strip().lower()
    if value == "never":
        return None
    found = _DURATION.match(value)
    if found is None:
        raise TokenError(
            f"--expires-in {text!r}: give a whole number of days, hours, minutes or seconds "
            "(90d, 12h, 30m, 45s) or never"
        )
    return timedelta(seconds=int(found.group(1)) * _UNIT_S[found.group(2)])


def secret_hash(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


def split_token(token: str) -> tuple[str, str] | None:
    """(id, secret) of a well-formed token, else None."""
    found = _TOKEN.match(token)
    return (found.group(1), found.group(2)) if found else None


def new_token(
    org: str, project: str, subject: str, scopes: tuple[Scope, ...], now: datetime, *,
    expires_in: timedelta | None = None,
) -> tuple[TokenRecord, str]:  # fmt: skip
    """A fresh token and its record (pure but for the randomness)."""
    for kind, value in (("org", org), ("project", project)):
        if not SAFE_NAME.match(value):
            raise TokenError(f"{kind} {value!r} is not a valid name (letters, digits, . _ -)")
    if not _SUBJECT.match(subject):
        raise TokenError(f"subject {subject!r} must be 1 to 200 printable characters")
    token_id = secrets.token_hex(6)
    secret = secrets.token_urlsafe(32)
    record = TokenRecord(
        id=token_id, org=org, project=project, subject=subject, scopes=scopes,
        created_at=now, secret_sha256=secret_hash(secret),
        expires_at=None if expires_in is None else now + expires_in,
    )  # fmt: skip
    return record, f"rlx_{token_id}_{secret}"


class TokenStore:
    """Token records in the object store."""

    def __init__(self, store: ObjectStore) -> None:
        self.store = store

    @staticmethod
    def key(token_id: str) -> str:
        return f"{PREFIX}{token_id}.json"

    async def create(
        self, org: str, project: str, subject: str, scopes: tuple[Scope, ...], now: datetime,
        *, expires_in: timedelta | None = None,
    ) -> tuple[TokenRecord, str]:  # fmt: skip
        """A new token; ``expires_in`` None: it never expires."""
        record, token = new_token(org, project, subject, scopes, now, expires_in=expires_in)
        await self.store.put_if_absent(self.key(record.id), dumps(record.model_dump(mode="json")))
        return record, token

    async def get(self, token_id: str) -> TokenRecord | None:
        """The record, or None when there is none (or it is unreadable)."""
        try:
            data = await self.store.get(self.key(token_id))
        except ObjectNotFoundError:
            return None
        try:
            return TokenRecord.model_validate(loads(data))
        except (ValueError, ValidationError):
            return None

    async def ids(self) -> list[str]:
        """Every token id the store holds a record for (one listing, no record read)."""
        out = []
        for key in await self.store.list(PREFIX):
            name = key[len(PREFIX) :]
            if name.endswith(".json") and "/" not in name:
                out.append(name[: -len(".json")])
        return out

    async def list(self) -> list[TokenRecord]:
        out = []
        for key in await self.store.list(PREFIX):
            name = key[len(PREFIX) :]
            if name.endswith(".json") and "/" not in name:
                record = await self.get(name[: -len(".json")])
                if record is not None:
                    out.append(record)
        return sorted(out, key=lambda r: (r.created_at, r.id))

    async def revoke(self, token_id: str, now: datetime) -> TokenRecord:
        """Mark the token revoked (the record stays, for the audit); TokenError if unknown."""
        record = await self.get(token_id)
        if record is None:
            raise TokenError(f"no token with id {token_id!r}")
        if record.revoked_at is None:
            record = record.model_copy(update={"revoked_at": now})
            await self.store.put(self.key(token_id), dumps(record.model_dump(mode="json")))
        return record


def _remember(cache: OrderedDict[str, T], key: str, value: T, most: int) -> None:
    cache[key] = value
    cache.move_to_end(key)
    while len(cache) > most:
        cache.popitem(last=False)


class TokenRejected(Exception):
    """A token that does not grant access; ``reason`` is a metrics label, ``detail`` for people."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(detail)
        self.reason = reason
        self.detail = detail


class TokenVerifier:
    """Checks bearer tokens against the store, with a short, bounded cache (see the module)."""

    def __init__(
        self,
        tokens: TokenStore,
        cache_s: float,
        clock: Callable[[], float] = time.monotonic,
        *,
        max_entries: int = 10_000,
        wall: Callable[[], datetime] = lambda: datetime.now(UTC),
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        self.tokens = tokens
        self.cache_s = cache_s
        self.clock = clock
        self.wall = wall
        self.sleep = sleep
        self.max_entries = max_entries
        self._cache: OrderedDict[str, tuple[float, TokenRecord]] = OrderedDict()
        self._unknown: OrderedDict[str, float] = OrderedDict()  # ids with no record: when read
        self._reading: dict[str, asyncio.Future[TokenRecord | None]] = {}
        self._ids: frozenset[str] = frozenset()  # every token id, as last listed
        self._listed_at: float | None = None
        self._listing: asyncio.Future[None] | None = None

    def known(self, token: str) -> bool:
        """Whether checking ``token`` needs no store read now (malformed, or its id cached,
        with a record or without)."""
        parts = split_token(token)
        if parts is None:
            return True
        now = self.clock()
        found = self._cache.get(parts[0])
        if found is not None and now - found[0] < self.cache_s:
            return True
        unknown = self._unknown.get(parts[0])
        return unknown is not None and now - unknown < self.cache_s

    async def listed(self, token: str) -> bool:
        """Whether the token's id names a token record, from the listing of the records'
        keys: listed again when the id is not in the last listing, at most once every
        :data:`LIST_EVERY_S` (a request waits for the next one), and one listing answers
        every request waiting for it. So ids made up at any rate cost one listing a
        second, and a token made since the last listing is found."""
        parts = split_token(token)
        if parts is None:
            return False
        if parts[0] not in self._ids:
            await self._list_ids()
        return parts[0] in self._ids

    async def _list_ids(self) -> None:
        if self._listing is not None:  # another request lists now: share its listing
            await asyncio.shield(self._listing)
            return
        listing: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._listing = listing
        try:
            if self._listed_at is not None:
                wait = self._listed_at + LIST_EVERY_S - self.clock()
                if wait > 0:
                    await self.sleep(wait)
            ids = await self.tokens.ids()  # StoreError goes up: the API answers 503
            self._ids, self._listed_at = frozenset(ids), self.clock()
        except BaseException as exc:
            listing.set_exception(exc)
            listing.exception()  # retrieved: nobody else may be waiting
            raise
        else:
            listing.set_result(None)
        finally:
            self._listing = None

    async def _record(self, token_id: str) -> TokenRecord | None:
        now = self.clock()
        cached = self._cache.get(token_id)
        if cached is not None and now - cached[0] < self.cache_s:
            return cached[1]
        unknown = self._unknown.get(token_id)
        if unknown is not None and now - unknown < self.cache_s:
            return None
        pending = self._reading.get(token_id)
        if pending is not None:  # another request reads this id now: share its answer
            return await asyncio.shield(pending)
        reading: asyncio.Future[TokenRecord | None] = asyncio.get_running_loop().create_future()
        self._reading[token_id] = reading
        try:
            record = await self.tokens.get(token_id)  # StoreError goes up: the API answers 503
        except BaseException as exc:
            reading.set_exception(exc)
            reading.exception()  # retrieved: nobody else may be waiting
            raise
        else:
            reading.set_result(record)
        finally:
            del self._reading[token_id]
        # Bounded, each cache on its own: the oldest read goes first.
        if record is None:
            self._cache.pop(token_id, None)
            _remember(self._unknown, token_id, now, self.max_entries)
        else:
            self._unknown.pop(token_id, None)
            _remember(self._cache, token_id, (now, record), self.max_entries)
        return record

    async def verify(self, token: str) -> Caller:
        """The caller a token names; :class:`TokenRejected` when it grants nothing."""
        parts = split_token(token)
        if parts is None:
            raise TokenRejected("malformed", "the token is not an rl-export token (rlx_...)")
        token_id, secret = parts
        record = await self._record(token_id)
        # Hash and compare even when there is no record, so timing says nothing either way.
        expected = record.secret_sha256 if record is not None else "0" * 64
        matches = hmac.compare_digest(secret_hash(secret), expected)
        if record is None or not matches:
            raise TokenRejected("unknown", "unknown token")
        if record.revoked_at is not None:
            raise TokenRejected("revoked", f"token {token_id} was revoked")
        if record.expires_at is not None and self.wall() >= record.expires_at:
            raise TokenRejected(
                "expired",
                f"token {token_id} expired at {record.expires_at.isoformat()}; ask for a new "
                "one (rl-export tokens create)",
            )
        return Caller(
            token_id=record.id, subject=record.subject, org=record.org, project=record.project,
            scopes=record.scopes,
        )  # fmt: skip


__all__ = [
    "SCOPES",
    "Caller",
    "Scope",
    "TokenError",
    "TokenRecord",
    "TokenRejected",
    "TokenStore",
    "TokenVerifier",
    "new_token",
    "parse_expiry",
    "parse_scopes",
    "split_token",
]
