"""Fetching attachments for ``zip`` exports: ``s3://`` through the store's S3 client (or one made
for that bucket), ``http(s)://`` with aiohttp, ``file://`` from the local disk.

A fetch that fails raises :class:`FetchError` with a one-line reason; the zip export lists
those in ``files/errors.json`` and goes on.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote, urlsplit

from rl_export.common.errors import RlExportError, StoreError
from rl_export.corpora.store import ObjectStore, S3Store

if TYPE_CHECKING:
    import aiohttp

MAX_ATTACHMENT_BYTES = 256 * 1024 * 1024


class FetchError(Exception):
    """An attachment could not be fetched; the message says why."""


class Fetcher:
    """Fetches attachment URIs; close it when done (it keeps an HTTP session and S3 clients)."""

    def __init__(self, store: ObjectStore, *, timeout_s: float = 30.0) -> None:
        self.store = store
        self.timeout_s = timeout_s
        self._http: aiohttp.ClientSession | None = None
        self._buckets: dict[str, S3Store] = {}

    async def fetch(self, uri: str) -> bytes:
        """The bytes behind ``uri``; FetchError when they cannot be had."""
        import aiohttp  # only zip exports pay for importing aiohttp

        parts = urlsplit(uri)
        scheme = parts.scheme.lower()
        try:
            if scheme == "s3":
                return await self._s3(parts.netloc, parts.path.lstrip("/"))
            if scheme in ("http", "https"):
                return await self._get_http(uri)
            if scheme == "file":
                return await asyncio.to_thread(_read_file, Path(unquote(parts.path)))
        except FetchError:
            raise
        except (RlExportError, StoreError, OSError, aiohttp.ClientError, TimeoutError) as exc:
            raise FetchError(f"{type(exc).__name__}: {exc}".strip()) from None
        raise FetchError(f"unsupported URI scheme {scheme or '(none)'!r}")

    async def _s3(self, bucket: str, key: str) -> bytes:
        if not bucket or not key:
            raise FetchError("an s3:// URI needs a bucket and a key")
        store = self.store if isinstance(self.store, S3Store) else self._buckets.get(bucket)
        if store is None:
            store = self._buckets[bucket] = S3Store(bucket)
        return await store.get_uri(bucket, key)

    async def _get_http(self, uri: str) -> bytes:
        import aiohttp

        if self._http is None:
            self._http = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=self.timeout_s))
        async with self._http.get(uri) as response:
            if response.status >= 400:
                raise FetchError(f"HTTP {response.status} {response.reason or ''}".strip())
            chunks: list[bytes] = []
            size = 0
            async for chunk in response.content.iter_chunked(1 << 16):
                size += len(chunk)
                if size > MAX_ATTACHMENT_BYTES:
                    raise FetchError(f"larger than {MAX_ATTACHMENT_BYTES} bytes")
                chunks.append(chunk)
            return b"".join(chunks)

    async def close(self) -> None:
        if self._http is not None:
            await self._http.close()
            self._http = None
        for store in self._buckets.values():
            await store.close()
        self._buckets = {}


def _read_file(path: Path) -> bytes:
    if not path.is_file():
        raise FetchError(f"no such file: {path}")
    if path.stat().st_size > MAX_ATTACHMENT_BYTES:
        raise FetchError(f"larger than {MAX_ATTACHMENT_BYTES} bytes")
    return path.read_bytes()


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
