"""The client's address behind trusted proxies: headers are believed only from listed peers,
and only the hops a listed proxy appended (whatever a client wrote before them)."""

from __future__ import annotations

import ipaddress

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import ValidationError

from rl_export.runtime.net import parse_networks
from rl_export.runtime.settings import Settings
from rl_export.web.proxies import client_address, forwarded_for

PROXIES = parse_networks("10.0.0.0/8, 127.0.0.1, fd00::/8")


def xff(value: str) -> list[tuple[bytes, bytes]]:
    return [(b"x-forwarded-for", value.encode())]


def fwd(value: str) -> list[tuple[bytes, bytes]]:
    return [(b"forwarded", value.encode())]


@pytest.mark.parametrize(
    ("peer", "headers", "client"),
    [
        # A peer that is not listed: the headers are not read.
        ("198.51.100.7", xff("203.0.113.9"), "198.51.100.7"),
        ("198.51.100.7", fwd("for=203.0.113.9"), "198.51.100.7"),
        # A listed peer: the first hop from the right that is not a listed proxy.
        ("10.0.0.2", xff("203.0.113.9"), "203.0.113.9"),
        ("10.0.0.2", xff("6.6.6.6, 203.0.113.9"), "203.0.113.9"),  # 6.6.6.6: client-written
        ("10.0.0.2", xff("203.0.113.9, 10.0.0.1"), "203.0.113.9"),  # two proxies
        ("10.0.0.2", xff("203.0.113.9:5123"), "203.0.113.9"),
        ("10.0.0.2", xff("2001:db8::7"), "2001:db8::7"),
        ("10.0.0.2", xff("[2001:db8::7]:443"), "2001:db8::7"),
        ("10.0.0.2", [(b"x-forwarded-for", b"6.6.6.6"), (b"x-forwarded-for", b"203.0.113.9")],
         "203.0.113.9"),  # several lines: one list, in order
        ("::ffff:127.0.0.1", xff("203.0.113.9"), "203.0.113.9"),  # an IPv4-mapped peer
        ("fd00::1", xff("203.0.113.9"), "203.0.113.9"),
        # Every hop a proxy: the leftmost.
        ("10.0.0.2", xff("10.0.0.9, 10.0.0.1"), "10.0.0.9"),
        # A hop that is not an address: the proxy that reported it.
        ("10.0.0.2", xff("203.0.113.9, garbage, 10.0.0.1"), "10.0.0.1"),
        ("10.0.0.2", xff("unknown"), "10.0.0.2"),
        # No header: the proxy itself.
        ("10.0.0.2", [], "10.0.0.2"),
        # Forwarded (RFC 7239), quoted IPv6 with a port, other parameters.
        ("10.0.0.2",
         fwd('for=192.0.2.60;proto=http;by=203.0.113.43, for="[2001:db8:cafe::17]:4711"'),
         "2001:db8:cafe::17"),
        ("10.0.0.2", fwd("For=198.51.100.17;proto=https"), "198.51.100.17"),
        ("10.0.0.2", fwd("for=unknown"), "10.0.0.2"),
        # A client's unbalanced quote swallows what its proxy appended: the proxy, never a
        # client-written address.
        ("10.0.0.2", fwd('for="6.6.6.6, for=203.0.113.9'), "10.0.0.2"),
        # Both headers, agreeing: that client; naming different clients: neither is believed.
        ("10.0.0.2", xff("203.0.113.9") + fwd("for=203.0.113.9"), "203.0.113.9"),
        ("10.0.0.2", xff("6.6.6.6") + fwd("for=203.0.113.9"), "10.0.0.2"),
    ],
)  # fmt: skip
def test_the_client_behind_listed_proxies(
    peer: str, headers: list[tuple[bytes, bytes]], client: str
) -> None:
    assert client_address(peer, headers, PROXIES) == client


def test_no_proxy_listed_means_no_header_is_read() -> None:
    assert client_address("127.0.0.1", xff("203.0.113.9"), ()) == "127.0.0.1"


def test_forwarded_for_splits_elements_outside_quotes() -> None:
    assert forwarded_for(['for="a,b";by=x, for=c', "proto=https"]) == ['"a,b"', "c", ""]


addresses = st.one_of(
    st.ip_addresses(v=4).map(str), st.ip_addresses(v=6).map(str), st.text(max_size=12)
)
clients = st.one_of(st.ip_addresses(v=4), st.ip_addresses(v=6)).filter(
    lambda a: (
        not any(a.version == n.version and a in n for n in PROXIES)
        and not (isinstance(a, ipaddress.IPv6Address) and a.ipv4_mapped is not None)
    )
)


@given(forged=st.lists(addresses, max_size=5), client=clients,
       header=st.sampled_from(["x-forwarded-for", "forwarded"]))  # fmt: skip
def test_whatever_a_client_writes_the_address_is_the_one_its_proxy_saw(
    forged: list[str], client: ipaddress.IPv4Address | ipaddress.IPv6Address, header: str
) -> None:
    """The client sends any header it likes; the listed proxy appends the address it saw."""
    seen = str(client) if client.version == 4 else f'"[{client}]"'
    if header == "x-forwarded-for":
        value = ", ".join([*(f.replace(",", "") for f in forged), str(client)])
    else:
        # (a quote a client leaves open swallows the rest: the proxy's address then, above)
        written = (f.replace(",", "").replace('"', "") for f in forged)
        value = ", ".join([*(f"for={f}" for f in written), f"for={seen}"])
    headers = [(header.encode(), value.encode())]
    assert client_address("10.1.2.3", headers, PROXIES) == str(client)
    # Sent straight to the service, the same headers are not read at all.
    assert client_address(str(client), headers, PROXIES) == str(client)


def test_the_setting_takes_addresses_and_cidrs_and_names_a_bad_entry() -> None:
    settings = Settings(web_trusted_proxies=" 10.0.0.0/8 ,192.0.2.7,fd00::/8")
    assert settings.web_trusted_proxies == "10.0.0.0/8,192.0.2.7/32,fd00::/8"
    assert parse_networks(Settings().web_trusted_proxies) == ()
    with pytest.raises(ValidationError, match=r"'proxy\.example' is neither an IP address"):
        Settings(web_trusted_proxies="10.0.0.0/8,proxy.example")
