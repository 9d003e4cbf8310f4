"""Which addresses an image fetch may connect to (the SSRF filter).

Public unicast addresses only, unless a network of `--image-url-networks` holds the
address. `ipaddress`'s is_global alone lets through ranges that reach private hosts or
are not one host at all:

- NAT64 (64:ff9b::/96, and the local-use 64:ff9b:1::/48): a translator turns them into
  any IPv4 address, a private one included;
- site-local IPv6 (fec0::/10, deprecated but still routed inside some sites);
- multicast (224.0.0.0/4, ff00::/8): not one host.

IPv6 addresses that carry an IPv4 address (IPv4-mapped ::ffff:a.b.c.d, IPv4-compatible
::a.b.c.d, 6to4 2002:aabb:ccdd::) are judged by the IPv4 address they carry: a kernel or
relay delivers them there.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Sequence

Address = ipaddress.IPv4Address | ipaddress.IPv6Address
Network = ipaddress.IPv4Network | ipaddress.IPv6Network

_DENIED = tuple(ipaddress.ip_network(n) for n in (
    "64:ff9b::/96",  # NAT64, well-known prefix (RFC 6052)
    "64:ff9b:1::/48",  # NAT64, local-use prefix (RFC 8215)
    "fec0::/10",  # site-local (RFC 3879)
))
_IPV4_COMPATIBLE = ipaddress.IPv6Network("::/96")


def networks(cidrs: Sequence[str]) -> list[Network]:
    """The operator's allowed networks (already checked when the options were read)."""
    return [ipaddress.ip_network(n, strict=False) for n in cidrs]


def carried(address: Address) -> Address:
    """The IPv4 address an IPv6 one carries (mapped, compatible, 6to4), else itself."""
    if not isinstance(address, ipaddress.IPv6Address):
        return address
    if address.ipv4_mapped is not None:
        return address.ipv4_mapped
    if address.sixtofour is not None:
        return address.sixtofour
    if address in _IPV4_COMPATIBLE and int(address) > 1:  # not :: or ::1
        return ipaddress.IPv4Address(int(address) & 0xFFFFFFFF)
    return address


def is_public(address: Address) -> bool:
    """A global unicast address outside the ranges denied above."""
    return (address.is_global and not address.is_multicast
            and not any(address in net for net in _DENIED))


def fetch_allowed(text: str, allowed: Sequence[Network] = ()) -> bool:
    """Whether a fetch may connect to the address `text` (a scope id is ignored)."""
    address: Address = ipaddress.ip_address(text.split("%", 1)[0])
    for judged in dict.fromkeys((address, carried(address))):
        if any(judged in net for net in allowed):
            return True
    return is_public(carried(address))
