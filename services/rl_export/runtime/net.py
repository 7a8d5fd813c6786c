"""Addresses: every server rl-export starts binds to 127.0.0.1 (loopback, free ports), and the
networks a setting names (``RL_EXPORT_WEB_TRUSTED_PROXIES``: addresses and CIDRs)."""

from __future__ import annotations

import ipaddress
import socket

Network = ipaddress.IPv4Network | ipaddress.IPv6Network
Address = ipaddress.IPv4Address | ipaddress.IPv6Address

LOOPBACK = "127.0.0.1"


def free_port() -> int:
    """Return a TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((LOOPBACK, 0))
        port: int = sock.getsockname()[1]
        return port


def port_open(port: int, host: str = LOOPBACK, timeout_s: float = 0.5) -> bool:
    """Return True when something accepts TCP connections on host:port."""
    try:
        with socket.create_connection((host, port), timeout=timeout_s):
            return True
    except OSError:
        return False


def parse_networks(text: str) -> tuple[Network, ...]:
    """``10.0.0.0/8, 192.168.1.7, fd00::/8`` -> the networks (an address is a network of one);
    ValueError naming the entry that is neither. Empty text: none."""
    found: list[Network] = []
    for entry in (part.strip() for part in text.split(",")):
        if not entry:
            continue
        try:
            network = ipaddress.ip_network(entry, strict=False)
        except ValueError:
            raise ValueError(
                f"{entry!r} is neither an IP address nor a CIDR (e.g. 10.0.0.0/8, 192.0.2.7)"
            ) from None
        found.append(_unmapped_network(network))
    return tuple(found)


def checked_networks(text: str) -> str:
    """The setting's text once every entry parses (:func:`parse_networks`), normalised."""
    return ",".join(str(n) for n in parse_networks(text))


def parse_address(text: str) -> Address | None:
    """An IP address as written in a peer or a proxy header (``1.2.3.4``, ``::1``), an
    IPv4-mapped IPv6 one as IPv4; None for anything else."""
    try:
        address = ipaddress.ip_address(text.strip())
    except ValueError:
        return None
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped
    return address


def in_networks(address: Address, networks: tuple[Network, ...]) -> bool:
    return any(address.version == n.version and address in n for n in networks)


def _unmapped_network(network: Network) -> Network:
    """``::ffff:10.0.0.0/104`` -> ``10.0.0.0/8``: peers are compared as IPv4."""
    if isinstance(network, ipaddress.IPv6Network):
        mapped = network.network_address.ipv4_mapped
        if mapped is not None and network.prefixlen >= 96:
            return ipaddress.ip_network(f"{mapped}/{network.prefixlen - 96}", strict=False)
    return network
