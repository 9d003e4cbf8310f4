"""API keys: `Authorization: Bearer KEY` (or Anthropic's `x-api-key: KEY`) checked in
constant time; /health stays open, and so do the chat page's static files (it asks for the
key itself, and holds no secret). A caller of an open path without a valid key is marked
anonymous: /health tells it the status alone.

Each key is a tenant: the request's scope carries an id derived from its key, and the
engine shares cached prompt prefixes only between requests of one tenant, so no key can
gain from, or learn about (`cached_tokens`, timing), another key's prompts.
"""

from __future__ import annotations

import hashlib
import hmac

from starlette.requests import Request
from starlette.types import ASGIApp, Receive, Scope, Send

from .errors import APIError

OPEN_PATHS = {"/health"}
_TENANT = "tenant"
_ANONYMOUS = "anonymous"


def tenant_of(request: Request) -> str:
    """The request's tenant: an id of its API key, "" without keys."""
    return str(request.scope.get("state", {}).get(_TENANT, ""))


def is_anonymous(request: Request) -> bool:
    """Keys are required and the caller (of an open path) gave no valid one."""
    return bool(request.scope.get("state", {}).get(_ANONYMOUS, False))


def _admit(scope: Scope, key: bytes) -> None:
    # A digest, not the key: the id may reach logs and the prompt cache's files.
    tenant = hashlib.sha256(b"edge-server tenant\0" + key).hexdigest()[:32]
    scope.setdefault("state", {})[_TENANT] = tenant


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

    def _valid_key(self, headers: dict[bytes, bytes]) -> bytes | None:
        """The request's key where it is one of ours (bearer, else x-api-key)."""
        scheme, _, token = headers.get(b"authorization", b"").partition(b" ")
        if scheme.lower() == b"bearer" and token and self._accepted(token.strip()):
            return token.strip()
        api_key = headers.get(b"x-api-key", b"").strip()
        return api_key if api_key and self._accepted(api_key) else None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = dict(scope.get("headers", []))
        key = self._valid_key(headers)
        if key is not None:
            _admit(scope, key)
            await self.app(scope, receive, send)
            return
        if self._open(scope.get("path", "")):
            scope.setdefault("state", {})[_ANONYMOUS] = True
            await self.app(scope, receive, send)
            return
        header = headers.get(b"authorization", b"")
        api_key = headers.get(b"x-api-key", b"").strip()
        message = ("Missing API key: send `Authorization: Bearer <key>`." if not (header or api_key)
                   else "Incorrect API key provided.")
        error = APIError(401, message, code="invalid_api_key",
                         headers={"WWW-Authenticate": "Bearer"})
        await error.response()(scope, receive, send)
