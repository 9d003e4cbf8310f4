"""The Host header, checked when no API key guards the server.

A server on 127.0.0.1 without keys trusts whoever can reach it, and a web page in the
user's browser can reach it too: through DNS rebinding, a name the page controls is
re-pointed at 127.0.0.1, and the browser then sends that name as `Host`. So without keys
only loopback names and addresses, the address the server listens on, and the names of
`--allowed-hosts` (`*`: any) are served; anything else gets a 403 before the request is
read. A request without a Host header (HTTP/1.0 tools) comes from no browser and passes.
"""

from __future__ import annotations

import ipaddress

from starlette.types import ASGIApp, Receive, Scope, Send

from edge_server.api.http.errors import APIError

LOOPBACK_NAMES = frozenset({"localhost", "localhost.localdomain", "ip6-localhost",
                            "ip6-loopback"})


def host_name(header: str) -> str:
    """The name or address of a Host header, without its port or IPv6 brackets."""
    header = header.strip().lower()
    if header.startswith("["):
        return header[1 : header.find("]")] if "]" in header else header[1:]
    if header.count(":") > 1:  # a bare IPv6 address: it has no port
        return header
    name, _, port = header.rpartition(":")
    return name if name and port.isdigit() else header.rstrip(":")


def is_loopback(name: str) -> bool:
    if name in LOOPBACK_NAMES or name.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


class HostGuard:
    """ASGI middleware: a Host that is neither loopback nor allowed gets a 403."""

    def __init__(self, app: ASGIApp, allowed: list[str]) -> None:
        self.app = app
        self.any_host = "*" in allowed
        self.allowed = frozenset(host_name(h) for h in allowed if h and h != "*")

    def permits(self, header: bytes | None) -> bool:
        if header is None or self.any_host:
            return True
        name = host_name(header.decode("latin-1"))
        return is_loopback(name) or name in self.allowed

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        header = next((v for k, v in scope.get("headers", []) if k == b"host"), None)
        if self.permits(header):
            await self.app(scope, receive, send)
            return
        error = APIError(
            403, "This server answers only requests addressed to a loopback name or to a "
            "host named by --allowed-hosts.", code="host_not_allowed")
        await error.response()(scope, receive, send)
