"""Which attachment URIs an export may fetch (docs/guides/security.md): pure checks, no I/O.

An attachment's ``uri`` comes from an untrusted event. It is fetched only when, once
normalised, it starts with one of the prefixes of ``RL_EXPORT_ATTACHMENT_SOURCES`` (a comma
list of ``s3://bucket/prefix/`` and ``https://host[:port]/prefix/``; empty: nothing is
fetched), and never when it points into the store's own bucket and prefix.

Normalising (:func:`normalise`) refuses what could make the text and the fetch disagree:
any scheme but ``s3`` and ``https``, user information (``https://allowed@evil/``),
backslashes, control characters, a percent-encoding that still holds ``%`` once decoded
(double encoding), an ``s3`` key with ``.``/``..``/empty segments (S3 keys are literal); an
``https`` path is percent-decoded, its dot segments resolved (``..`` above the root refused),
and encoded again, so the URL fetched is the URL checked. Scheme and host are compared in
lower case, a host's trailing dot dropped, the https port defaulted to 443.

:func:`is_public` decides whether an address may be connected to: only globally routed
unicast addresses; loopback, private, link-local (with the metadata address
169.254.169.254), shared (100.64/10), multicast, reserved and unspecified addresses are
refused, and so are the IPv4 addresses inside IPv4-mapped, 6to4, NAT64 and Teredo IPv6
forms, and fd00:ec2::254.
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass
from typing import Literal
from urllib.parse import quote, unquote, urlsplit

__all__ = [
    "AttachmentSource",
    "NotAllowed",
    "Target",
    "allowed",
    "is_public",
    "normalise",
    "parse_sources",
]

Scheme = Literal["s3", "https"]
_CONTROL = re.compile(r"[\x00-\x20\x7f]")
_HOST = re.compile(r"^[a-z0-9]([a-z0-9\-]{0,61}[a-z0-9])?(\.[a-z0-9]([a-z0-9\-]{0,61}[a-z0-9])?)*$")
_BUCKET = re.compile(r"^[a-z0-9][a-z0-9.\-]{1,61}[a-z0-9]$")
_NAT64 = (ipaddress.ip_network("64:ff9b::/96"), ipaddress.ip_network("64:ff9b:1::/48"))


class NotAllowed(ValueError):
    """A URI (or a source prefix) that is refused; the message names no host or path."""


@dataclass(frozen=True)
class Target:
    """A normalised URI: ``host`` is the bucket for ``s3``; ``path`` starts with ``/`` and
    is decoded (https) or literal (s3); ``query`` is kept for https (signed URLs)."""

    scheme: Scheme
    host: str
    port: int
    path: str
    query: str = ""

    @property
    def url(self) -> str:
        """The URL to fetch: exactly what was checked, encoded again."""
        if self.scheme == "s3":
            return f"s3://{self.host}{self.path}"
        port = "" if self.port == 443 else f":{self.port}"
        host = f"[{self.host}]" if ":" in self.host else self.host
        query = f"?{self.query}" if self.query else ""
        return f"https://{host}{port}{quote(self.path, safe='/-._~!$&()*+,;=:@')}{query}"

    @property
    def key(self) -> str:
        """An ``s3`` target's object key."""
        return self.path[1:]


@dataclass(frozen=True)
class AttachmentSource:
    """One allowed prefix: a normalised target whose path ends with ``/``."""

    prefix: Target

    def covers(self, target: Target) -> bool:
        p = self.prefix
        return (target.scheme, target.host, target.port) == (
            p.scheme,
            p.host,
            p.port,
        ) and target.path.startswith(p.path)

    def __str__(self) -> str:
        return self.prefix.url


def _host(netloc_host: str | None, scheme: Scheme) -> str:
    host = (netloc_host or "").lower().rstrip(".")
    if scheme == "s3":
        if not _BUCKET.match(host):
            raise NotAllowed("an s3 URI needs a valid bucket name")
        return host
    try:
        return str(ipaddress.ip_address(host))
    except ValueError:
        pass
    if not _HOST.match(host):
        raise NotAllowed("the URI's host is not a valid host name")
    return host


def _https_path(raw: str) -> str:
    decoded = unquote(raw, errors="strict")
    if "%" in decoded or "\\" in decoded or _CONTROL.search(decoded.replace(" ", "")):
        raise NotAllowed("the URI's path holds encoded or control characters")
    kept: list[str] = []
    segments = decoded.split("/")
    for segment in segments[1:]:
        if segment in ("", "."):
            continue
        if segment == "..":
            if not kept:
                raise NotAllowed("the URI's path leaves its root")
            kept.pop()
            continue
        kept.append(segment)
    trailing = "/" if decoded.endswith("/") and kept else ""
    return "/" + "/".join(kept) + trailing


def _s3_path(raw: str) -> str:
    if _CONTROL.search(raw):
        raise NotAllowed("the URI's key holds control characters")
    if raw in ("", "/"):
        return "/"  # the whole bucket (a source prefix; an attachment there has no key)
    segments = raw.split("/")[1:]
    inner = segments[:-1] if segments and segments[-1] == "" else segments
    if not inner or any(s in ("", ".", "..") for s in inner):
        raise NotAllowed("the URI's key has empty or dot segments")
    return raw


def normalise(uri: str) -> Target:
    """The URI as it will be fetched; :class:`NotAllowed` when it cannot be trusted to be."""
    if not isinstance(uri, str) or "\\" in uri or _CONTROL.search(uri):
        raise NotAllowed("the URI holds backslashes, spaces or control characters")
    try:
        parts = urlsplit(uri)
        port = parts.port
    except ValueError:
        raise NotAllowed("the URI cannot be parsed") from None
    scheme = parts.scheme.lower()
    if scheme not in ("s3", "https"):
        raise NotAllowed("only s3:// and https:// URIs are ever fetched")
    if "@" in parts.netloc or parts.username is not None or parts.password is not None:
        raise NotAllowed("a URI with user information is never fetched")
    if scheme == "s3":
        if port is not None or parts.query or parts.fragment:
            raise NotAllowed("an s3 URI takes no port, query or fragment")
        return Target("s3", _host(parts.hostname, "s3"), 0, _s3_path(parts.path))
    try:
        path = _https_path(parts.path or "/")
    except UnicodeDecodeError:
        raise NotAllowed("the URI's path is not valid UTF-8 once decoded") from None
    host = _host(parts.hostname, "https")
    return Target("https", host, 443 if port is None else port, path, parts.query)


def parse_sources(text: str) -> tuple[AttachmentSource, ...]:
    """``s3://bucket/prefix/,https://host[:port]/prefix/`` -> the sources; ValueError naming
    the bad entry (a prefix must end with ``/``, so ``/a/`` never covers ``/ab``)."""
    found: list[AttachmentSource] = []
    for entry in (e.strip() for e in text.split(",")):
        if not entry:
            continue
        if not entry.endswith("/"):
            raise ValueError(f"{entry!r}: a source prefix must end with '/'")
        try:
            target = normalise(entry)
        except NotAllowed as exc:
            raise ValueError(f"{entry!r}: {exc}") from None
        if target.query:
            raise ValueError(f"{entry!r}: a source prefix takes no query")
        path = target.path if target.path.endswith("/") else target.path + "/"
        found.append(AttachmentSource(Target(target.scheme, target.host, target.port, path)))
    return tuple(found)


def allowed(
    target: Target, sources: tuple[AttachmentSource, ...], store: AttachmentSource | None
) -> bool:
    """Whether a normalised target is under a source and not under the store's own prefix
    (``store``: the store's bucket and prefix, for an S3 store)."""
    if store is not None and store.covers(target):
        return False
    return any(source.covers(target) for source in sources)


def store_source(bucket: str, prefix: str) -> AttachmentSource:
    """The store's own bucket and prefix as a source, to refuse (an empty prefix: the bucket)."""
    path = f"/{prefix.strip('/')}/" if prefix.strip("/") else "/"
    return AttachmentSource(Target("s3", bucket.lower(), 0, path))


def _embedded_v4(address: ipaddress.IPv6Address) -> ipaddress.IPv4Address | None:
    if address.ipv4_mapped is not None:
        return address.ipv4_mapped
    if address.sixtofour is not None:
        return address.sixtofour
    if address in _NAT64[0]:
        return ipaddress.IPv4Address(int(address) & 0xFFFFFFFF)
    return None


def is_public(text: str) -> bool:
    """Whether an address (text, as a resolver gives it) is globally routed unicast."""
    try:
        address = ipaddress.ip_address(text.split("%", 1)[0])
    except ValueError:
        return False
    if isinstance(address, ipaddress.IPv6Address):
        if address in _NAT64[1] or address.teredo is not None:
            return False  # Teredo and local-use NAT64 reach addresses we cannot check
        inner = _embedded_v4(address)
        if inner is not None:
            return _public(inner)
    return _public(address)


def _public(address: ipaddress.IPv4Address | ipaddress.IPv6Address) -> bool:
    return address.is_global and not (
        address.is_multicast
        or address.is_loopback
        or address.is_private
        or address.is_link_local
        or address.is_reserved
        or address.is_unspecified
        or (isinstance(address, ipaddress.IPv6Address) and address.is_site_local)
    )
