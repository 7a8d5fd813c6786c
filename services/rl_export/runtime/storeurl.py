"""Parse object-store URLs: ``file:///abs/path``, a plain path, or ``s3://bucket/prefix``."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Literal
from urllib.parse import urlsplit

# S3 bucket naming rules (the subset every S3-compatible store accepts).
_BUCKET = re.compile(r"^[a-z0-9][a-z0-9.\-]{1,61}[a-z0-9]$")


@dataclass(frozen=True)
class StoreLocation:
    """Where a store lives: a local directory, or a bucket and key prefix on S3."""

    kind: Literal["file", "s3"]
    path: Path | None = None
    bucket: str = ""
    prefix: str = ""

    def __str__(self) -> str:
        if self.kind == "file":
            return f"file://{self.path}"
        return f"s3://{self.bucket}/{self.prefix}".rstrip("/")


def parse_store_url(url: str) -> StoreLocation:
    """Return the location a store URL names; raise ValueError saying what is wrong."""
    text = url.strip()
    if not text:
        raise ValueError("store URL is empty")
    if "://" not in text:
        return StoreLocation(kind="file", path=Path(text).expanduser().resolve())
    parts = urlsplit(text)
    if parts.scheme == "file":
        if parts.netloc not in ("", "localhost"):
            raise ValueError(f"file URL must be file:///absolute/path, got {url!r}")
        if not parts.path.startswith("/"):
            raise ValueError(f"file URL needs an absolute path, got {url!r}")
        return StoreLocation(kind="file", path=Path(parts.path))
    if parts.scheme == "s3":
        bucket = parts.netloc
        if not _BUCKET.match(bucket):
            raise ValueError(f"s3 URL needs a valid bucket name (3-63 of a-z 0-9 . -), got {url!r}")
        if parts.query or parts.fragment:
            raise ValueError(f"s3 URL takes no query or fragment, got {url!r}")
        return StoreLocation(kind="s3", bucket=bucket, prefix=parts.path.strip("/"))
    raise ValueError(f"unsupported store URL scheme {parts.scheme!r} (use file:// or s3://)")
