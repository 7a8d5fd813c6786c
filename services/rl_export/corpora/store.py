"""Object storage behind one small interface: a local directory, S3, or memory (for tests).

Keys are relative, ``/``-separated paths (``<org>/<project>/<corpus>/...``). The interface is
what the sink, compaction and the reader need, no more:

* ``put`` writes or replaces an object (data objects are named by content hash, so a retry
  writes the same bytes under the same name);
* ``put_if_absent`` is the create-only write that commits a shard: whoever creates a key first
  wins, and a later writer gets :class:`ObjectExistsError` instead of overwriting it;
* ``get``, ``list`` (optionally only the keys after one: a chain from a position on),
  ``folders`` (the names one level below a prefix: the chains of a corpus, without listing
  every commit), ``delete`` and ``check`` (a readiness probe);
* ``chunks`` reads an object as a stream of byte chunks, so an export holds one chunk of a
  large compaction part at a time, never the whole object;
* ``put_file`` writes or replaces an object from a local file without holding it in memory
  (S3: a multipart upload), for the web service's export jobs.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import io
import os
import shutil
import uuid
from collections.abc import AsyncIterator, Callable, Iterable, Sequence
from pathlib import Path
from typing import Any, Protocol, TypeVar

from rl_export.model.errors import ObjectExistsError, ObjectNotFoundError, StoreError
from rl_export.runtime.storeurl import StoreLocation, parse_store_url

T = TypeVar("T")
CHUNK = 1 << 20
RANGE_SPAN = 8 << 20
"""Ranges of one object this close together are read with one GET (S3 charges by request)."""
"""Bytes per chunk of :meth:`ObjectStore.chunks`."""


def check_key(key: str) -> str:
    """Return ``key`` if it is a safe relative object key; raise ValueError otherwise."""
    if not key or key.startswith("/") or key.endswith("/"):
        raise ValueError(f"object key must be a relative path to a file, got {key!r}")
    if any(part in ("", ".", "..") for part in key.split("/")):
        raise ValueError(f"object key has an empty, '.' or '..' segment: {key!r}")
    return key


class ObjectStore(Protocol):
    """What every store offers. All methods are coroutines; ``close`` releases connections."""

    url: str

    async def put(self, key: str, data: bytes) -> None: ...
    async def put_if_absent(self, key: str, data: bytes) -> None: ...
    async def get(self, key: str) -> bytes: ...
    async def get_ranges(self, key: str, ranges: Sequence[tuple[int, int]]) -> list[bytes]: ...
    def chunks(self, key: str, size: int = CHUNK) -> AsyncIterator[bytes]: ...
    async def sha256(self, key: str) -> str: ...
    async def put_file(self, key: str, path: Path) -> None: ...
    async def folders(self, prefix: str) -> list[str]: ...
    async def list(self, prefix: str = "", start_after: str = "") -> list[str]: ...
    async def delete(self, key: str) -> None: ...
    async def check(self) -> None: ...
    async def close(self) -> None: ...


class MemoryStore:
    """An in-memory store for unit tests; same semantics as the real ones."""

    def __init__(self) -> None:
        self.url = "memory://"
        self.objects: dict[str, bytes] = {}

    async def put(self, key: str, data: bytes) -> None:
        self.objects[check_key(key)] = bytes(data)

    async def put_file(self, key: str, path: Path) -> None:
        self.objects[check_key(key)] = await asyncio.to_thread(path.read_bytes)

    async def put_if_absent(self, key: str, data: bytes) -> None:
        if check_key(key) in self.objects:
            raise ObjectExistsError(f"{key} already exists")
        self.objects[key] = bytes(data)

    async def get(self, key: str) -> bytes:
        try:
            return self.objects[check_key(key)]
        except KeyError:
            raise ObjectNotFoundError(f"{key} not found") from None

    async def get_ranges(self, key: str, ranges: Sequence[tuple[int, int]]) -> list[bytes]:
        data = await self.get(key)
        return [_cut(key, data[start : start + length], length) for start, length in ranges]

    async def chunks(self, key: str, size: int = CHUNK) -> AsyncIterator[bytes]:
        data = await self.get(key)
        for start in range(0, len(data), size):
            yield data[start : start + size]

    async def sha256(self, key: str) -> str:
        """The hex sha256 of the object's bytes (as stored)."""
        return hashlib.sha256(await self.get(key)).hexdigest()

    async def folders(self, prefix: str) -> list[str]:
        return _folders(prefix, self.objects)

    async def list(self, prefix: str = "", start_after: str = "") -> list[str]:
        return sorted(k for k in self.objects if k.startswith(prefix) and k > start_after)

    async def delete(self, key: str) -> None:
        self.objects.pop(check_key(key), None)

    async def check(self) -> None:
        return None

    async def close(self) -> None:
        return None


def _cut(key: str, data: bytes, length: int) -> bytes:
    """A range's bytes; StoreError when the object is shorter than the range."""
    if len(data) != length:
        raise StoreError(f"{key}: {len(data)} bytes where a range of {length} was asked")
    return data


def _folders(prefix: str, keys: Iterable[str]) -> list[str]:
    """The names one level below ``prefix`` (which ends with ``/``) among ``keys``."""
    return sorted({k[len(prefix) :].split("/", 1)[0] for k in keys
                   if k.startswith(prefix) and "/" in k[len(prefix) :]})  # fmt: skip


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class LocalStore:
    """A directory on the local file system.

    ``put_if_absent`` writes a temporary file, fsyncs it, then hard-links it to the final
    name: ``link`` fails with EEXIST when another writer won, and never exposes a partly
    written file, so a crash cannot leave an empty commit. The folder is fsynced after.
    """

    _TMP = ".tmp"

    def __init__(self, root: Path) -> None:
        self.root = root
        self.url = f"file://{root}"

    def _path(self, key: str) -> Path:
        return self.root / check_key(key)

    def _write_tmp(self, final: Path, data: bytes) -> Path:
        final.parent.mkdir(parents=True, exist_ok=True)
        tmp = final.parent / f"{self._TMP}-{final.name}-{uuid.uuid4().hex}"
        with open(tmp, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        return tmp

    def _put(self, key: str, data: bytes) -> None:
        final = self._path(key)
        tmp = self._write_tmp(final, data)
        os.replace(tmp, final)
        _fsync_dir(final.parent)

    def _put_file(self, key: str, path: Path) -> None:
        final = self._path(key)
        final.parent.mkdir(parents=True, exist_ok=True)
        tmp = final.parent / f"{self._TMP}-{final.name}-{uuid.uuid4().hex}"
        try:
            shutil.copyfile(path, tmp)
            with open(tmp, "rb") as fh:
                os.fsync(fh.fileno())
            os.replace(tmp, final)
        finally:
            tmp.unlink(missing_ok=True)
        _fsync_dir(final.parent)

    def _put_if_absent(self, key: str, data: bytes) -> None:
        final = self._path(key)
        tmp = self._write_tmp(final, data)
        try:
            os.link(tmp, final)
        except FileExistsError:
            raise ObjectExistsError(f"{key} already exists") from None
        finally:
            tmp.unlink(missing_ok=True)
        _fsync_dir(final.parent)

    def _get(self, key: str) -> bytes:
        try:
            return self._path(key).read_bytes()
        except FileNotFoundError:
            raise ObjectNotFoundError(f"{key} not found in {self.url}") from None

    def _get_ranges(self, key: str, ranges: Sequence[tuple[int, int]]) -> list[bytes]:
        try:
            fd = os.open(self._path(key), os.O_RDONLY)
        except FileNotFoundError:
            raise ObjectNotFoundError(f"{key} not found in {self.url}") from None
        try:
            return [_cut(key, os.pread(fd, length, start), length) for start, length in ranges]
        finally:
            os.close(fd)

    def _folders(self, prefix: str) -> list[str]:
        # "" is the root: its folders are read, not found among every key of the store.
        base = self.root / prefix.rstrip("/") if prefix else self.root
        if (prefix and not prefix.endswith("/")) or not base.is_dir():
            return _folders(prefix, self._list(prefix, ""))
        return sorted(entry.name for entry in os.scandir(base) if entry.is_dir())

    def _list(self, prefix: str, start_after: str = "") -> list[str]:
        # Walk only the deepest folder the prefix names, then filter by the rest.
        head = prefix.rsplit("/", 1)[0] if "/" in prefix else ""
        base = self.root / head if head else self.root
        if not base.is_dir():
            return []
        keys = []
        for dirpath, _dirs, files in os.walk(base):
            for name in files:
                if name.startswith(self._TMP):
                    continue
                key = Path(dirpath, name).relative_to(self.root).as_posix()
                if key.startswith(prefix) and key > start_after:
                    keys.append(key)
        return sorted(keys)

    def _open(self, key: str) -> io.BufferedReader:
        try:
            return open(self._path(key), "rb")
        except FileNotFoundError:
            raise ObjectNotFoundError(f"{key} not found in {self.url}") from None

    def _sha256(self, key: str) -> str:
        with self._open(key) as fh:
            return hashlib.file_digest(fh, "sha256").hexdigest()

    def _delete(self, key: str) -> None:
        self._path(key).unlink(missing_ok=True)

    def _check(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        if not os.access(self.root, os.W_OK):
            raise StoreError(f"store directory {self.root} is not writable")

    async def _io(self, fn: Callable[..., T], *args: Any) -> T:
        """Run a file operation off the event loop; OS errors become StoreError."""
        try:
            return await asyncio.to_thread(fn, *args)
        except StoreError:
            raise
        except OSError as exc:
            raise StoreError(f"{self.url}: {exc}") from exc

    async def put(self, key: str, data: bytes) -> None:
        await self._io(self._put, key, data)

    async def put_if_absent(self, key: str, data: bytes) -> None:
        await self._io(self._put_if_absent, key, data)

    async def put_file(self, key: str, path: Path) -> None:
        await self._io(self._put_file, key, path)

    async def get(self, key: str) -> bytes:
        return await self._io(self._get, key)

    async def get_ranges(self, key: str, ranges: Sequence[tuple[int, int]]) -> list[bytes]:
        """Byte ranges ``(start, length)`` of an object, in order (one open, a read each)."""
        return await self._io(self._get_ranges, key, ranges)

    async def chunks(self, key: str, size: int = CHUNK) -> AsyncIterator[bytes]:
        """The object's bytes in chunks; the next chunk is read in a thread while the
        caller works on this one (a read lets go of the GIL)."""
        fh = await self._io(self._open, key)
        loop = asyncio.get_running_loop()
        reading: asyncio.Future[bytes] | None = loop.run_in_executor(None, fh.read, size)
        try:
            while reading is not None:
                try:
                    chunk = await reading
                except OSError as exc:
                    raise StoreError(f"{self.url}: {exc}") from exc
                finally:
                    reading = None
                if not chunk:
                    return
                reading = loop.run_in_executor(None, fh.read, size)
                yield chunk
        finally:
            if reading is not None:  # closed early: let the read in flight end first
                with contextlib.suppress(Exception):
                    await reading
            fh.close()

    async def sha256(self, key: str) -> str:
        """The hex sha256 of the object, read and hashed in one thread (``file_digest``: one
        buffer reused; the thread lets go of the GIL for both, so it runs beside the caller's
        work)."""
        return await self._io(self._sha256, key)

    async def folders(self, prefix: str) -> list[str]:
        return await self._io(self._folders, prefix)

    async def list(self, prefix: str = "", start_after: str = "") -> list[str]:
        return await self._io(self._list, prefix, start_after)

    async def delete(self, key: str) -> None:
        await self._io(self._delete, key)

    async def check(self) -> None:
        await self._io(self._check)

    async def close(self) -> None:
        return None


def _error_code(exc: Exception) -> tuple[str, int]:
    response: dict[str, Any] = getattr(exc, "response", None) or {}
    code = str(response.get("Error", {}).get("Code", ""))
    status = int(response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0) or 0)
    return code, status


class S3Store:
    """A bucket and key prefix on S3 or any S3-compatible store (``AWS_ENDPOINT_URL``).

    Create-only writes use ``If-None-Match: *``: the store answers 412 when the key exists.
    A 409 means a concurrent conditional write to the same key is in flight; we retry, and
    the retry then sees 412 (the other writer won) or succeeds (it failed).
    """

    _CONFLICT_RETRIES = 5

    def __init__(self, bucket: str, prefix: str = "", endpoint_url: str | None = None) -> None:
        import aioboto3  # imported here so local-only use does not pay for botocore

        self.bucket = bucket
        self.prefix = f"{prefix.strip('/')}/" if prefix.strip("/") else ""
        self.endpoint_url = endpoint_url or os.environ.get("AWS_ENDPOINT_URL") or None
        self.url = f"s3://{bucket}/{self.prefix}".rstrip("/")
        self._session = aioboto3.Session()
        self._stack = contextlib.AsyncExitStack()
        self._client: Any = None
        self._lock = asyncio.Lock()

    async def _c(self) -> Any:
        if self._client is None:
            async with self._lock:
                if self._client is None:
                    from botocore.config import Config

                    config = Config(
                        retries={"max_attempts": 5, "mode": "standard"},
                        connect_timeout=5,
                        read_timeout=30,
                    )
                    self._client = await self._stack.enter_async_context(
                        self._session.client("s3", endpoint_url=self.endpoint_url, config=config)
                    )
        return self._client

    def _key(self, key: str) -> str:
        return self.prefix + check_key(key)

    def _wrap(self, exc: Exception, what: str) -> StoreError:
        code, status = _error_code(exc)
        where = f"{self.url} (endpoint {self.endpoint_url or 'AWS default'})"
        if code or status:
            return StoreError(f"{what} failed on {where}: {code or status} {exc}")
        return StoreError(f"{what} failed on {where}: {type(exc).__name__}: {exc}")

    async def put(self, key: str, data: bytes) -> None:
        full, client = self._key(key), await self._c()
        try:
            await client.put_object(Bucket=self.bucket, Key=full, Body=data)
        except Exception as exc:
            raise self._wrap(exc, f"put {key}") from exc

    async def put_file(self, key: str, path: Path) -> None:
        full, client = self._key(key), await self._c()
        try:
            await client.upload_file(str(path), self.bucket, full)  # multipart when large
        except Exception as exc:
            raise self._wrap(exc, f"upload {key}") from exc

    async def put_if_absent(self, key: str, data: bytes) -> None:
        full, client = self._key(key), await self._c()
        for attempt in range(self._CONFLICT_RETRIES):
            try:
                await client.put_object(Bucket=self.bucket, Key=full, Body=data, IfNoneMatch="*")
                return
            except Exception as exc:
                code, status = _error_code(exc)
                if status == 412 or code == "PreconditionFailed":
                    raise ObjectExistsError(f"{key} already exists") from None
                if status == 409 and attempt + 1 < self._CONFLICT_RETRIES:
                    await asyncio.sleep(0.05 * 2**attempt)
                    continue
                raise self._wrap(exc, f"create-only put {key}") from exc

    async def get(self, key: str) -> bytes:
        return await self._get(key)

    async def _get(self, key: str, byte_range: str | None = None) -> bytes:
        """The object's bytes, or those of ``byte_range`` (``start-end``, inclusive)."""
        full, client = self._key(key), await self._c()
        extra = {} if byte_range is None else {"Range": f"bytes={byte_range}"}
        try:
            response = await client.get_object(Bucket=self.bucket, Key=full, **extra)
            async with response["Body"] as body:
                data: bytes = await body.read()
                return data
        except Exception as exc:
            code, status = _error_code(exc)
            if status == 404 or code in ("NoSuchKey", "404"):
                raise ObjectNotFoundError(f"{key} not found in {self.url}") from None
            what = f"get {key}" + ("" if byte_range is None else f" bytes {byte_range}")
            raise self._wrap(exc, what) from exc

    async def get_ranges(self, key: str, ranges: Sequence[tuple[int, int]]) -> list[bytes]:
        """Byte ranges ``(start, length)`` of an object, in order: one ranged GET over them
        all when they lie within :data:`RANGE_SPAN`, else one per range, at once."""
        if not ranges:
            return []
        low = min(start for start, _ in ranges)
        high = max(start + length for start, length in ranges)
        if high - low <= RANGE_SPAN:
            data = await self._range(key, low, high)
            return [_cut(key, data[s - low : s - low + n], n) for s, n in ranges]
        found = await asyncio.gather(*(self._range(key, s, s + n) for s, n in ranges))
        return [_cut(key, data, n) for data, (_, n) in zip(found, ranges, strict=True)]

    async def _range(self, key: str, start: int, end: int) -> bytes:
        return b"" if end <= start else await self._get(key, f"{start}-{end - 1}")

    async def chunks(self, key: str, size: int = CHUNK) -> AsyncIterator[bytes]:
        full, client = self._key(key), await self._c()
        try:
            response = await client.get_object(Bucket=self.bucket, Key=full)
        except Exception as exc:
            code, status = _error_code(exc)
            if status == 404 or code in ("NoSuchKey", "404"):
                raise ObjectNotFoundError(f"{key} not found in {self.url}") from None
            raise self._wrap(exc, f"get {key}") from exc
        body = response["Body"]  # aiobotocore's StreamingBody (entering it gives the response)
        async with body:
            chunks = body.iter_chunks(size)
            while True:
                try:
                    chunk: bytes = await anext(chunks)
                except StopAsyncIteration:
                    return
                except Exception as exc:
                    raise self._wrap(exc, f"read {key}") from exc
                yield chunk

    async def sha256(self, key: str) -> str:
        """The hex sha256 of the object, streamed (each chunk hashed in a thread)."""
        digest = hashlib.sha256()
        async for chunk in self.chunks(key):
            await asyncio.to_thread(digest.update, chunk)
        return digest.hexdigest()

    async def get_uri(self, bucket: str, key: str, *, max_bytes: int | None = None) -> bytes:
        """An object of any bucket this store's client can read (attachments' ``s3://``):
        its first ``max_bytes`` bytes at most (all of it by default)."""
        client = await self._c()
        try:
            response = await client.get_object(Bucket=bucket, Key=key)
            async with response["Body"] as body:
                if max_bytes is None:
                    data: bytes = await body.read()
                    return data
                chunks: list[bytes] = []
                size = 0
                while size < max_bytes and (chunk := await body.content.read(max_bytes - size)):
                    chunks.append(chunk)
                    size += len(chunk)
                return b"".join(chunks)
        except Exception as exc:
            code, status = _error_code(exc)
            if status == 404 or code in ("NoSuchKey", "404"):
                raise ObjectNotFoundError(f"s3://{bucket}/{key} not found") from None
            raise self._wrap(exc, f"get s3://{bucket}/{key}") from exc

    async def folders(self, prefix: str) -> list[str]:
        client = await self._c()
        full = self.prefix + prefix
        names: list[str] = []
        try:
            paginator = client.get_paginator("list_objects_v2")
            async for page in paginator.paginate(Bucket=self.bucket, Prefix=full, Delimiter="/"):
                names.extend(
                    p["Prefix"][len(full) :].rstrip("/") for p in page.get("CommonPrefixes", [])
                )
        except Exception as exc:
            raise self._wrap(exc, f"list folders of {prefix!r}") from exc
        return sorted(names)

    async def list(self, prefix: str = "", start_after: str = "") -> list[str]:
        client = await self._c()
        keys: list[str] = []
        after = {"StartAfter": self.prefix + start_after} if start_after else {}
        try:
            paginator = client.get_paginator("list_objects_v2")
            pages = paginator.paginate(Bucket=self.bucket, Prefix=self.prefix + prefix, **after)
            async for page in pages:
                keys.extend(obj["Key"][len(self.prefix) :] for obj in page.get("Contents", []))
        except Exception as exc:
            raise self._wrap(exc, f"list {prefix!r}") from exc
        return sorted(keys)

    async def delete(self, key: str) -> None:
        full, client = self._key(key), await self._c()
        try:
            await client.delete_object(Bucket=self.bucket, Key=full)
        except Exception as exc:
            raise self._wrap(exc, f"delete {key}") from exc

    async def check(self) -> None:
        client = await self._c()
        try:
            await client.head_bucket(Bucket=self.bucket)
        except Exception as exc:
            raise self._wrap(exc, "head bucket") from exc

    async def close(self) -> None:
        await self._stack.aclose()
        self._client = None


def open_store(url: str | StoreLocation) -> ObjectStore:
    """Open the store a URL names (``file:///abs``, a path, or ``s3://bucket/prefix``)."""
    location = parse_store_url(url) if isinstance(url, str) else url
    if location.kind == "s3":
        return S3Store(location.bucket, location.prefix)
    assert location.path is not None
    return LocalStore(location.path)
