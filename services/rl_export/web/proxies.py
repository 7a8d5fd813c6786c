"""The client's address behind trusted proxies (``RL_EXPORT_WEB_TRUSTED_PROXIES``).

The address a request comes from keys the limit on unknown tokens
(:class:`~rl_export.web.limits.FailureLimit`) and names the client in the access log. A
header is not an address: anyone can send ``X-Forwarded-For: 203.0.113.9``. So the headers
are read only when the connection's peer is a proxy the operator listed; uvicorn's own
reading of them (which trusts any loopback peer by default) is turned off
(:func:`rl_export.web.main.run_web`), and this middleware does it instead:

1. A peer that is not listed: its address is the client's, whatever the headers say.
2. A listed peer: the addresses its proxies reported, ``X-Forwarded-For``'s entries or
   ``Forwarded``'s ``for=`` (RFC 7239), every header line in order, are walked from the
   right (the nearest hop first): the first that is not a listed proxy is the client. Each
   listed proxy appends the address it saw, so what a client wrote itself is always to the
   left of one it cannot forge.
3. A hop that is not an address (RFC 7239's ``unknown``, an obfuscated name) ends the walk:
   the client is then the proxy that reported it. So is a request whose two headers name
   different clients (a proxy that writes one header and passes the other on as the client
   wrote it): neither is believed. All hops listed proxies: the leftmost is the client.

Pure over the peer and the headers (:func:`client_address`); :class:`TrustedProxies` applies
it to each request's ASGI scope.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from starlette.types import ASGIApp, Receive, Scope, Send

from rl_export.runtime.net import Address, Network, in_networks, parse_address


def _hop(text: str) -> Address | None:
    """One hop as a header writes it: ``1.2.3.4``, ``1.2.3.4:80``, ``::1``, ``[::1]:80``,
    quoted or not (``Forwarded``); None for anything else."""
    value = text.strip().strip('"').strip()
    if value.startswith("["):
        value = value[1 : value.find("]")] if "]" in value else ""
    elif value.count(":") == 1:  # IPv4 with a port (an IPv6 address has more colons)
        value = value.split(":", 1)[0]
    return parse_address(value)


def forwarded_for(values: Iterable[str]) -> list[str]:
    """The ``for=`` of each element of ``Forwarded`` header lines, in order ("" for an
    element without one)."""
    hops: list[str] = []
    for value in values:
        for element in _split(value, ","):
            found = ""
            for pair in _split(element, ";"):
                name, eq, rest = pair.partition("=")
                if eq and name.strip().lower() == "for":
                    found = rest.strip()
            hops.append(found)
    return hops


def _split(text: str, sep: str) -> list[str]:
    """Split on ``sep`` outside double quotes."""
    parts: list[str] = []
    current: list[str] = []
    quoted = False
    for char in text:
        if char == '"':
            quoted = not quoted
        if char == sep and not quoted:
            parts.append("".join(current))
            current = []
        else:
            current.append(char)
    parts.append("".join(current))
    return [p for p in parts if p.strip()]


def _walk(peer: Address, hops: Sequence[str], trusted: tuple[Network, ...]) -> Address:
    """Step 2 and 3 over one header's hops."""
    nearest = peer
    for text in reversed(hops):
        hop = _hop(text)
        if hop is None:
            return nearest
        if not in_networks(hop, trusted):
            return hop
        nearest = hop
    return nearest


def client_address(
    peer: str, headers: Sequence[tuple[bytes, bytes]], trusted: tuple[Network, ...]
) -> str:
    """The client's address of a request from ``peer`` with these headers (the module's
    steps); the peer as given when it is not an address or not a listed proxy."""
    address = parse_address(peer)
    if address is None or not in_networks(address, trusted):
        return peer
    xff: list[str] = []
    forwarded: list[str] = []
    for name, value in headers:
        if name == b"x-forwarded-for":
            xff += value.decode("latin-1").split(",")
        elif name == b"forwarded":
            forwarded.append(value.decode("latin-1"))
    answers = set()
    if xff:
        answers.add(_walk(address, xff, trusted))
    if forwarded:
        answers.add(_walk(address, forwarded_for(forwarded), trusted))
    if len(answers) != 1:  # no header, or two that disagree: the proxy itself
        return str(address)
    return str(answers.pop())


class TrustedProxies:
    """ASGI middleware: the scope's ``client`` is the client's address (:func:`client_address`)
    when the peer is a listed proxy; untouched otherwise (and with no proxy listed)."""

    def __init__(self, app: ASGIApp, trusted: tuple[Network, ...]) -> None:
        self.app = app
        self.trusted = trusted

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        client = scope.get("client")
        if self.trusted and scope["type"] in ("http", "websocket") and client:
            host = client_address(client[0], scope.get("headers", []), self.trusted)
            if host != client[0]:
                scope["client"] = (host, 0)  # in place: uvicorn's access line shows it too
        await self.app(scope, receive, send)


__all__ = ["TrustedProxies", "client_address", "forwarded_for"]
