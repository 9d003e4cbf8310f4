"""API keys: `Authorization: Bearer KEY` (or Anthropic's `x-api-key: KEY`) checked in
constant time; /health stays open, and so do the chat page's static files (it asks for the
key itself, and holds no secret)."""

from __future__ import annotations

import hmac

from starlette.types import ASGIApp, Receive, Scope, Send

from .errors import APIError

OPEN_PATHS = {"/health"}


class APIKeyAuth:
    def __init__(self, app: ASGIApp, keys: list[str], open_paths: tuple[str, ...] = (),
                 open_prefixes: tuple[str, ...] = ()) -> None:
        """`open_paths` / `open_prefixes`: more paths (exact, or by prefix) that need no key."""
        self.app = app
        self._keys = [k.encode() for k in keys]
        self._open_paths = OPEN_PATHS | set(open_paths)
        self._open_prefixes = open_prefixes

    def _open(self, path: str) -> bool:
        return path in self._open_paths or path.startswith(self._open_prefixes)

    def _accepted(self, presented: bytes) -> bool:
        # Compare against every key, so timing says nothing about which (if any) matched.
        matched = False
        for key in self._keys:
            matched |= hmac.compare_digest(presented, key)
        return matched

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or self._open(scope.get("path", "")):
            await self.app(scope, receive, send)
            return
        headers = dict(scope.get("headers", []))
        header = headers.get(b"authorization", b"")
        scheme, _, token = header.partition(b" ")
        if scheme.lower() == b"bearer" and token and self._accepted(token.strip()):
            await self.app(scope, receive, send)
            return
        api_key = headers.get(b"x-api-key", b"").strip()
        if api_key and self._accepted(api_key):
            await self.app(scope, receive, send)
            return
        message = ("Missing API key: send `Authorization: Bearer <key>`." if not (header or api_key)
                   else "Incorrect API key provided.")
        error = APIError(401, message, code="invalid_api_key",
                         headers={"WWW-Authenticate": "Bearer"})
        await error.response()(scope, receive, send)
