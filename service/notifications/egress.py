"""Where a webhook may go: public addresses, and the networks an admin allows.

A subscription's URL is a user's, the service POSTs to it from inside the site's network,
and the team reads how it answered: unchecked, a URL on 127.0.0.1, on the cloud metadata
address 169.254.169.254 or on a private address would let any user reach the service's own
ports and the internal network (issue 38). So every address a URL's host stands for must be
public, unless it lies in RUNYARD_WEBHOOK_ALLOWED_NETWORKS (an internal Slack proxy, say).

The check runs twice: when a subscription is added (a 422 the user can act on), and at each
delivery on the addresses the POST will use, since a name may resolve elsewhere by then
(DNS rebinding). delivery.py connects to an address this module checked, never to the name.
"""

from __future__ import annotations

import socket
from collections.abc import Sequence
from enum import StrEnum
from ipaddress import IPv4Address, IPv4Network, IPv6Address, IPv6Network, ip_address

import httpx

IPAddress = IPv4Address | IPv6Address
Network = IPv4Network | IPv6Network

ALLOW_SETTING = "RUNYARD_WEBHOOK_ALLOWED_NETWORKS"

# NAT64's well-known prefix (RFC 6052, section 2.1): on an IPv6-only network with NAT64,
# 64:ff9b::a00:1 reaches 10.0.0.1, so it is judged as the IPv4 address it carries.
NAT64 = IPv6Network("64:ff9b::/96")


class AddressKind(StrEnum):
    """Why an address is refused by default, as the refusal names it."""

    LOOPBACK = "loopback"
    LINK_LOCAL = "link-local"  # 169.254.169.254: the cloud providers' metadata service
    UNSPECIFIED = "unspecified"
    MULTICAST = "multicast"
    RESERVED = "reserved"
    PRIVATE = "private"
    NON_PUBLIC = "non-public"  # not globally reachable, e.g. carrier-grade NAT 100.64.0.0/10


class Unreachable(Exception):
    """A URL a webhook may not be sent to; the message says why, for the team to read."""


class NotResolved(Unreachable):
    def __init__(self, host: str, error: BaseException) -> None:
        super().__init__(f"{host} does not resolve ({error})")


class AddressRefused(Unreachable):
    def __init__(self, host: str, address: IPAddress, kind: AddressKind) -> None:
        if _literal(host):
            said = f"{host} is a {kind} address"
        else:
            said = f"{host} resolves to {address}, a {kind} address"
        super().__init__(said)
        self.address = address
        self.kind = kind


def _literal(host: str) -> bool:
    try:
        ip_address(host)
    except ValueError:
        return False
    return True


def resolve(host: str) -> list[IPAddress]:
    """Every address `host` stands for, in the resolver's order (a literal: itself).

    The one place webhooks meet DNS: tests replace it to make a name move (rebinding).
    """
    infos = socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)
    return list(dict.fromkeys(ip_address(info[4][0]) for info in infos))


def carried_ipv4(address: IPAddress) -> IPAddress:
    """The IPv4 address an IPv6 one stands for (IPv4-mapped, NAT64), else the address."""
    if isinstance(address, IPv6Address):
        if address.ipv4_mapped is not None:
            return address.ipv4_mapped
        if address in NAT64:
            return IPv4Address(int(address) & 0xFFFF_FFFF)
    return address


def refused_kind(address: IPAddress) -> AddressKind | None:
    """What makes `address` one webhooks may not reach by default; None: a public one.

    ipaddress's own properties (the IANA special-purpose registries), most telling first:
    127.0.0.1 is also private, but "loopback" is what the user needs to hear.
    """
    address = carried_ipv4(address)
    for kind, flagged in (
        (AddressKind.LOOPBACK, address.is_loopback),
        (AddressKind.LINK_LOCAL, address.is_link_local),
        (AddressKind.UNSPECIFIED, address.is_unspecified),
        (AddressKind.MULTICAST, address.is_multicast),
        (AddressKind.RESERVED, address.is_reserved),
        (AddressKind.PRIVATE, address.is_private),
        (AddressKind.NON_PUBLIC, not address.is_global),
    ):
        if flagged:
            return kind
    return None


def in_networks(address: IPAddress, networks: Sequence[Network]) -> bool:
    """In one of `networks` (the admin's), as itself or as the IPv4 address it carries."""
    candidates = {address, carried_ipv4(address)}
    return any(candidate in network for candidate in candidates for network in networks)


def url_host(url: httpx.URL) -> str:
    """The host as DNS and TLS know it (IDNA-encoded; an IPv6 literal without brackets)."""
    return url.raw_host.decode("ascii")


def checked_addresses(url: httpx.URL, networks: Sequence[Network]) -> list[IPAddress]:
    """The addresses of `url`'s host, each one allowed; raises Unreachable otherwise.

    All of them, not only the first: the POST may go to any, and a name that answers with a
    public address and a private one must not get through on the public one.
    """
    host = url_host(url)
    if not host:
        raise Unreachable("the URL names no host")
    try:
        addresses = resolve(host)
    except (OSError, UnicodeError, ValueError) as exc:  # gaierror is an OSError
        raise NotResolved(host, exc) from exc
    if not addresses:
        raise NotResolved(host, LookupError("no address"))
    for address in addresses:
        kind = refused_kind(address)
        if kind is not None and not in_networks(address, networks):
            raise AddressRefused(host, address, kind)
    return addresses
