"""Fetching attachments for ``zip`` exports, only where docs/guides/security.md allows it.

An attachment's ``uri`` is untrusted. :meth:`Fetcher.fetch` gives a status and, when
``fetched``, the bytes:

1. The URI is normalised and checked against the allowed prefixes
   (:mod:`rl_export.privacy.attachment_sources`; ``RL_EXPORT_ATTACHMENT_SOURCES``) and the
   store's own bucket and prefix: ``not_allowed`` otherwise, before any I/O.
2. ``s3://``: read through the store's S3 client (or one made for that bucket), at most the
   byte cap plus one; a missing object is ``missing``.
3. ``https://``: the host is resolved (the resolver can be injected, for tests only: it is a
   constructor argument, never a setting) and every address must be public (``not_allowed``
   otherwise; an IP literal is checked the same way). The connection goes to the checked
   addresses (aiohttp is handed a resolver that knows only them), with TLS, SNI and
   certificate verification against the URI's host name; no proxy from the environment, no
   redirect followed (a 3xx is ``failed``), 404/410 are ``missing``.
4. At most ``RL_EXPORT_ATTACHMENT_MAX_BYTES`` per attachment and
   ``RL_EXPORT_ATTACHMENT_MAX_TOTAL_BYTES`` over the export (``too_large`` past either).

Errors are the fixed texts of :data:`MESSAGES`: they name no host, address or path, so a
manifest does not tell which files or services exist.
"""

from __future__ import annotations

import asyncio
import ipaddress
import mimetypes
import socket
import ssl
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from rl_export.corpora.store import ObjectStore, S3Store
from rl_export.model.errors import ObjectNotFoundError, RlExportError, StoreError
from rl_export.privacy.attachment_sources import (
    AttachmentSource,
    NotAllowed,
    Target,
    allowed,
    is_public,
    normalise,
    store_source,
)

if TYPE_CHECKING:
    from rl_export.runtime.settings import Settings

MIB = 1024 * 1024

Status = Literal["fetched", "not_allowed", "missing", "too_large", "failed"]
MESSAGES: dict[Status, str] = {
    "not_allowed": "the URI is not under an allowed attachment source",
    "missing": "the attachment does not exist",
    "too_large": "the attachment is over the size limit of an attachment or of the export",
    "failed": "the attachment could not be fetched",
}

Resolve = Callable[[str, int], Awaitable[list[str]]]
"""host, port -> the addresses it resolves to (text)."""


async def system_resolve(host: str, port: int) -> list[str]:
    """The host's addresses from the system resolver."""
    loop = asyncio.get_running_loop()
    infos = await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return [str(info[4][0]) for info in infos]


@dataclass(frozen=True)
class AttachmentPolicy:
    """What a zip export may fetch; the default fetches nothing."""

    sources: tuple[AttachmentSource, ...] = ()
    max_bytes: int = 16 * MIB
    max_total_bytes: int = 256 * MIB
    timeout_s: float = 30.0

    @classmethod
    def from_settings(cls, settings: Settings) -> AttachmentPolicy:
        return cls(
            sources=settings.attachment_prefixes,
            max_bytes=settings.attachment_max_bytes,
            max_total_bytes=settings.attachment_max_total_bytes,
        )


class _Refused(Exception):
    def __init__(self, status: Status) -> None:
        super().__init__(status)
        self.status: Status = status


def _pinned_resolver(host: str, addresses: list[str]) -> Any:
    """An aiohttp resolver that answers ``host`` with the addresses already checked (as
    dialled)."""
    from aiohttp.abc import AbstractResolver, ResolveResult

    class Pinned(AbstractResolver):
        async def resolve(
            self, name: str, port: int = 0, family: socket.AddressFamily = socket.AF_INET
        ) -> list[ResolveResult]:
            if name != host:
                raise OSError("not the checked host")
            return [
                ResolveResult(
                    hostname=name,
                    host=address,
                    port=port,
                    family=socket.AF_INET6 if ":" in address else socket.AF_INET,
                    proto=0,
                    flags=socket.AI_NUMERICHOST,
                )
                for address in addresses
            ]

        async def close(self) -> None:
            return None

    return Pinned()


class Fetcher:
    """Fetches attachment URIs under a policy; close it when done (it keeps S3 clients).

    ``resolve``, ``dial`` and ``ssl_context`` are constructor arguments for tests only (no
    setting or request reaches them): a test resolves a host to a public address, dials a
    loopback TLS server in its place and trusts that server's CA. The address check runs on
    what ``resolve`` returns and the certificate is verified against the URI's host name,
    whatever they are."""

    def __init__(
        self,
        store: ObjectStore,
        policy: AttachmentPolicy | None = None,
        *,
        resolve: Resolve = system_resolve,
        dial: Callable[[str], str] = str,
        ssl_context: ssl.SSLContext | None = None,
    ) -> None:
        self.store = store
        self.policy = policy or AttachmentPolicy()
        self.resolve = resolve
        self.dial = dial
        self.ssl_context = ssl_context
        self.used_bytes = 0
        self._own = store_source(store.bucket, store.prefix) if isinstance(store, S3Store) else (
            None)  # fmt: skip
        self._buckets: dict[str, S3Store] = {}

    def check(self, uri: object) -> Target:
        """The normalised target of an allowed URI; raises for any other."""
        if not isinstance(uri, str):
            raise _Refused("not_allowed")
        try:
            target = normalise(uri)
        except NotAllowed:
            raise _Refused("not_allowed") from None
        if not allowed(target, self.policy.sources, self._own):
            raise _Refused("not_allowed")
        return target

    async def fetch(self, uri: object) -> tuple[Status, bytes | None]:
        """(status, bytes when fetched) of an attachment URI."""
        try:
            target = self.check(uri)
            limit = min(self.policy.max_bytes, self.policy.max_total_bytes - self.used_bytes)
            if limit <= 0:
                raise _Refused("too_large")
            async with asyncio.timeout(self.policy.timeout_s):
                if target.scheme == "s3":
                    data = await self._s3(target, limit)
                else:
                    data = await self._https(target, limit)
        except _Refused as refused:
            return refused.status, None
        except ObjectNotFoundError:
            return "missing", None
        except (RlExportError, StoreError, OSError, TimeoutError, ValueError):
            return "failed", None
        except Exception as exc:  # aiohttp's errors, imported lazily
            if _is_client_error(exc):
                return "failed", None
            raise
        self.used_bytes += len(data)
        return "fetched", data

    async def _s3(self, target: Target, limit: int) -> bytes:
        store = self.store if isinstance(self.store, S3Store) else self._buckets.get(target.host)
        if store is None:
            store = self._buckets[target.host] = S3Store(target.host)
        data = await store.get_uri(target.host, target.key, max_bytes=limit + 1)
        if len(data) > limit:
            raise _Refused("too_large")
        return data

    async def _https(self, target: Target, limit: int) -> bytes:
        import aiohttp  # only zip exports with an https source pay for importing aiohttp

        if _is_ip(target.host):
            addresses = [target.host]  # an IP literal: aiohttp does not resolve it
        else:
            addresses = await self.resolve(target.host, target.port)
        if not addresses or not all(is_public(a) for a in addresses):
            raise _Refused("not_allowed")
        context = self.ssl_context or ssl.create_default_context()
        connector = aiohttp.TCPConnector(
            resolver=_pinned_resolver(target.host, [self.dial(a) for a in addresses]),
            ssl=context,
            use_dns_cache=False,
        )
        async with (
            aiohttp.ClientSession(connector=connector, trust_env=False) as session,
            session.get(target.url, allow_redirects=False) as response,
        ):
            if response.status in (404, 410):
                raise _Refused("missing")
            if response.status != 200:
                raise _Refused("failed")
            if response.content_length is not None and response.content_length > limit:
                raise _Refused("too_large")
            chunks: list[bytes] = []
            size = 0
            async for chunk in response.content.iter_chunked(1 << 16):
                size += len(chunk)
                if size > limit:
                    raise _Refused("too_large")
                chunks.append(chunk)
            return b"".join(chunks)

    async def close(self) -> None:
        for store in self._buckets.values():
            await store.close()
        self._buckets = {}


def _is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


def _is_client_error(exc: Exception) -> bool:
    import aiohttp

    return isinstance(exc, aiohttp.ClientError)


_TEXT_TYPES = ("application/json", "application/x-ndjson", "application/jsonl")


def is_text(content_type: object, name: object) -> bool:
    """Whether an attachment is text to redact: ``text/*`` or JSON, by its declared content
    type, else by its name's extension."""
    kind = content_type if isinstance(content_type, str) and content_type.strip() else None
    if kind is None and isinstance(name, str):
        kind = mimetypes.guess_type(name, strict=False)[0]
    if kind is None:
        return False
    kind = kind.split(";", 1)[0].strip().lower()
    return kind.startswith("text/") or kind in _TEXT_TYPES or kind.endswith("+json")


def safe_segment(text: str) -> str:
    """A file or folder name inside the archive: no separators, no dot-only names."""
    cleaned = "".join("_" if c in "/\\\0" or ord(c) < 32 else c for c in text).strip()
    if cleaned in ("", ".", ".."):
        cleaned = cleaned.replace(".", "_") or "_"
    return cleaned[:200]


def archive_paths(trace_id: str, attachments: list[Any]) -> list[str]:
    """``files/<trace_id>/<name>`` for each attachment, unique within the trace."""
    folder = safe_segment(trace_id)
    seen: set[str] = set()
    out = []
    for n, attachment in enumerate(attachments):
        name = attachment.get("name") if isinstance(attachment, dict) else None
        base = safe_segment(name if isinstance(name, str) else f"attachment-{n}")
        candidate, k = base, 1
        while candidate in seen:
            k += 1
            candidate = f"{k}-{base}"
        seen.add(candidate)
        out.append(f"files/{folder}/{candidate}")
    return out
