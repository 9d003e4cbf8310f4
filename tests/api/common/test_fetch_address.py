"""The SSRF filter of image fetches (edge_server/api/common/image_input/fetch_address.py): each
range it denies and allows, with and without an operator's allowed network. Pure
address arithmetic, so judged directly; the whole path (a redirect to such an address
refused by name) is in test_url_fetch.py."""

from __future__ import annotations

import pytest

from edge_server.api.common.image_input.fetch_address import carried, fetch_allowed, networks


@pytest.mark.parametrize("address", [
    "127.0.0.1", "10.1.2.3", "172.16.0.1", "192.168.0.1", "169.254.169.254",  # IPv4 private
    "100.64.0.1",  # carrier-grade NAT
    "0.0.0.0", "255.255.255.255",
    "224.0.0.1", "239.255.255.250",  # IPv4 multicast (SSDP)
    "::1", "::", "fe80::1", "fe80::1%eth0", "fc00::1", "fd12:3456::1",  # IPv6 local
    "fec0::1", "feff::1",  # site-local (fec0::/10)
    "ff02::1", "ff0e::1",  # IPv6 multicast, link and global scope
    "64:ff9b::7f00:1", "64:ff9b::808:808",  # NAT64, well-known prefix, any IPv4
    "64:ff9b:1::a00:1",  # NAT64, local-use prefix
    "::ffff:127.0.0.1", "::ffff:10.0.0.1", "::ffff:169.254.169.254",  # IPv4-mapped
    "::127.0.0.1", "::10.0.0.1",  # IPv4-compatible
    "2002:7f00:1::1", "2002:a00:1::1", "2002:a9fe:a9fe::1",  # 6to4 of private IPv4
])
def test_denied(address: str) -> None:
    assert not fetch_allowed(address)


@pytest.mark.parametrize("address", [
    "8.8.8.8", "1.1.1.1", "93.184.216.34",
    "2606:4700:4700::1111", "2001:4860:4860::8888",
    "::ffff:8.8.8.8",  # IPv4-mapped public
    "::8.8.8.8",  # IPv4-compatible public
    "2002:808:808::1",  # 6to4 of a public IPv4
])
def test_allowed(address: str) -> None:
    assert fetch_allowed(address)


@pytest.mark.parametrize("address", ["127.0.0.1", "::ffff:127.0.0.1", "::127.0.0.1",
                                     "2002:7f00:1::1"])
def test_an_allowed_network_admits_the_ipv4_an_address_carries(address: str) -> None:
    allowed = networks(["127.0.0.1/32"])
    assert fetch_allowed(address, allowed)
    assert not fetch_allowed("127.0.0.2", allowed)
    assert not fetch_allowed("::1", allowed)


def test_allowed_ipv6_networks() -> None:
    allowed = networks(["fd00::/8", "fe80::/10"])
    assert fetch_allowed("fd12::1", allowed) and fetch_allowed("fe80::1%eth0", allowed)
    assert not fetch_allowed("fc00::1", allowed)


def test_carried_addresses() -> None:
    import ipaddress

    def judged(text: str) -> str:
        return str(carried(ipaddress.ip_address(text)))

    assert judged("::ffff:10.0.0.1") == "10.0.0.1"
    assert judged("::10.0.0.1") == "10.0.0.1"
    assert judged("2002:a00:1::1") == "10.0.0.1"
    # :: and ::1 are IPv6's own (unspecified, loopback), not IPv4-compatible addresses.
    assert judged("::1") == "::1" and judged("::") == "::"
    assert judged("2606:4700::1") == "2606:4700::1" and judged("8.8.8.8") == "8.8.8.8"
