"""Cross-origin requests: an allow-list of web origins (`--cors-origins`), and a 403 for
browser requests from any other origin.

A browser marks every cross-origin request, and every same-origin one that is not a plain
GET, with an `Origin` header. Requests without one (curl, SDKs, load-balancer checks) and
requests from the server's own origin (its chat page) pass untouched. An origin on the
list gets preflights (`OPTIONS` with `Access-Control-Request-Method`, answered here on
every path, before the API key is checked: browsers send preflights without credentials)
and `Access-Control-*` headers on every answer, errors included; Starlette's
CORSMiddleware does that part. Any other origin is refused with a 403 before the request
reaches a route, so a page elsewhere cannot make this server do work, even with requests
a browser sends without a preflight (a form POST, a `text/plain` fetch).
"""

from __future__ import annotations

import re
from urllib.parse import SplitResult, urlsplit

from starlette.datastructures import Headers
from starlette.middleware.cors import CORSMiddleware
from starlette.types import ASGIApp, Receive, Scope, Send

from edge_server.api.http.errors import APIError

ANY_ORIGIN = "*"
# Answer headers a cross-origin page may read (the rest are hidden by the browser).
EXPOSED_HEADERS = ("X-Edge-Replica", "Retry-After", "WWW-Authenticate", "X-Truncated-Messages",
                   "X-Truncated-Tokens")
_DEFAULT_PORTS = {"http": 80, "https": 443}
# Browser extensions' origins: `scheme://ID`, the ID as the browser writes it (Chrome's
# 32 letters, Firefox's per-install UUID, Safari's UUID in capitals), never a port.
EXTENSION_SCHEMES = ("chrome-extension", "moz-extension", "safari-web-extension")
_EXTENSION_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9-]{0,127}")


def check_origin(origin: str) -> str:
    """An allow-list entry as browsers send it: `scheme://host[:port]`, lower case, no
    path; a browser extension's `scheme://ID`; or `*` (any origin)."""
    if origin == ANY_ORIGIN:
        return origin
    parts = urlsplit(origin.strip())
    if parts.scheme in EXTENSION_SCHEMES:
        return _extension_origin(origin, parts)
    try:
        port = parts.port
    except ValueError as exc:
        raise ValueError(f"CORS origin {origin[:80]!r}: bad port") from exc
    if parts.scheme not in _DEFAULT_PORTS or not parts.hostname or port == 0 or (
            parts.path not in ("", "/") or parts.query or parts.fragment or parts.username):
        raise ValueError(f"CORS origin {origin[:80]!r}: expected scheme://host[:port] "
                         "(http or https, no path), an extension's scheme://ID "
                         f"({', '.join(EXTENSION_SCHEMES)}), or *")
    return _normalized(parts.scheme, parts.hostname, port)


def _extension_origin(origin: str, parts: SplitResult) -> str:
    """Kept as written (browsers compare the ID's case as they send it)."""
    if (not _EXTENSION_ID.fullmatch(parts.netloc) or parts.path not in ("", "/")
            or parts.query or parts.fragment):
        raise ValueError(f"CORS origin {origin[:80]!r}: expected {parts.scheme}://ID (the "
                         "extension's id: letters, digits and -; no port or path)")
    return f"{parts.scheme}://{parts.netloc}"


def _normalized(scheme: str, host: str, port: int | None) -> str:
    shown = f"[{host}]" if ":" in host else host
    if port is None or port == _DEFAULT_PORTS.get(scheme):
        return f"{scheme}://{shown}"
    return f"{scheme}://{shown}:{port}"


def _same_origin(origin: str, host_header: str | None) -> bool:
    """Whether `origin` names this server as the request reached it: its host and port
    equal the `Host` header's. The scheme is not compared, so a TLS proxy in front does
    not break the chat page. (Whether the Host itself is one of ours is another check's
    business.)"""
    if not host_header:
        return False
    parts = urlsplit(origin)
    try:
        port = parts.port
        host = urlsplit(f"//{host_header}")
        host_port = host.port
    except ValueError:
        return False
    if not parts.hostname or parts.scheme not in _DEFAULT_PORTS or not host.hostname:
        return False
    default = _DEFAULT_PORTS[parts.scheme]
    return (parts.hostname == host.hostname
            and (port or default) == (host_port or default))


def refused(origin: str) -> APIError:
    return APIError(403, f"Requests from the web origin {origin[:200]!r} are not allowed: "
                    "start the server with --cors-origins naming it.",
                    type="permission_error", code="origin_not_allowed")


class CrossOrigin:
    """ASGI middleware, outside the API-key check and every error source, so that
    preflights need no key and every answer to an allowed origin carries the headers."""

    def __init__(self, app: ASGIApp, origins: list[str]) -> None:
        self.app = app
        self.origins = frozenset(check_origin(o) for o in origins)
        self.cors = CORSMiddleware(
            app, allow_origins=sorted(self.origins), allow_methods=["*"],
            allow_headers=["*"], expose_headers=EXPOSED_HEADERS,
            # An allowed public page may call a server on a private address (Chrome's
            # Private Network Access asks in the preflight).
            allow_private_network=True, max_age=600)

    def allowed(self, origin: str) -> bool:
        return ANY_ORIGIN in self.origins or origin in self.origins

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = Headers(scope=scope)
        origin = headers.get("origin")
        if origin is None or _same_origin(origin, headers.get("host")):
            await self.app(scope, receive, send)
        elif self.allowed(origin):
            await self.cors(scope, receive, send)
        else:
            await refused(origin).response()(scope, receive, send)
