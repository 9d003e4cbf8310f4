"""API keys: `Authorization: Bearer KEY` (or Anthropic's `x-api-key: KEY`) checked in
constant time; /health stays open, and so do the chat page's static files (it asks for the
key itself, and holds no secret). A caller of an open path without a valid key is marked
anonymous: /health tells it the status alone.

Two tiers: admin keys (--admin-api-key) may also manage models (pull, copy, delete,
create, unload a model others use, load one by a GET); ordinary keys may use models, and
get a 403 for management (`require_admin`). A server with no key at all lets every caller
manage (it serves loopback only unless told otherwise: HostGuard).

Each key is a tenant: the request's scope carries an id derived from its key, and the
engine shares cached prompt prefixes only between requests of one tenant, so no key can
gain from, or learn about (`cached_tokens`, timing), another key's prompts.
"""

from __future__ import annotations

import hashlib
import hmac
from typing import Literal

from starlette.requests import Request
from starlette.types import ASGIApp, Receive, Scope, Send

from edge_server.api.http.errors import APIError

OPEN_PATHS = {"/health"}
_TENANT = "tenant"
_ROLE = "role"

# What a request may do, set by APIKeyAuth; a request it never saw (no keys) is KEYLESS.
Role = Literal["keyless", "admin", "user", "anonymous"]


def tenant_of(request: Request) -> str:
    """The request's tenant: an id of its API key, "" without keys."""
    return str(request.scope.get("state", {}).get(_TENANT, ""))


def role_of(request: Request) -> Role:
    """keyless (no keys configured), admin or user (its key's tier), anonymous (a path
    open without a key on a server with keys)."""
    role = request.scope.get("state", {}).get(_ROLE, "keyless")
    return role if role in ("admin", "user", "anonymous") else "keyless"


def is_anonymous(request: Request) -> bool:
    """Keys are required and the caller (of an open path) gave no valid one."""
    return role_of(request) == "anonymous"


def may_manage(request: Request) -> bool:
    return role_of(request) in ("keyless", "admin")


def require_admin(request: Request, what: str = "managing models") -> None:
    """Refuses model management (pull, copy, delete, create, blobs, unloading, loading by
    a GET) to any key but an admin key: 403 for an ordinary key, 401 without one."""
    role = role_of(request)
    if role == "anonymous":
        raise APIError(401, "Missing API key: send `Authorization: Bearer <key>`.",
                       code="invalid_api_key", headers={"WWW-Authenticate": "Bearer"})
    if role == "user":
        raise APIError(403, f"{what} needs an admin API key (--admin-api-key); this key may "
                       "use models, not manage them", type="permission_error",
                       code="permission_denied")


def _admit(scope: Scope, key: bytes, admin: bool) -> None:
    # A digest, not the key: the id may reach logs and the prompt cache's files.
    tenant = hashlib.sha256(b"edge-server tenant\0" + key).hexdigest()[:32]
    state = scope.setdefault("state", {})
    state[_TENANT] = tenant
    state[_ROLE] = "admin" if admin else "user"


class APIKeyAuth:
    def __init__(self, app: ASGIApp, keys: list[str], admin_keys: list[str] | None = None,
                 open_paths: tuple[str, ...] = (), open_prefixes: tuple[str, ...] = ()) -> None:
        """`keys` may use models, `admin_keys` may manage them too. `open_paths` /
        `open_prefixes`: more paths (exact, or by prefix) that need no key."""
        self.app = app
        self._keys = [(k.encode(), False) for k in keys]
        self._keys += [(k.encode(), True) for k in admin_keys or []]
        self._open_paths = OPEN_PATHS | set(open_paths)
        self._open_prefixes = open_prefixes

    def _open(self, path: str) -> bool:
        return path in self._open_paths or path.startswith(self._open_prefixes)

    def _match(self, presented: bytes) -> tuple[bool, bool]:
        """(accepted, admin). Compared against every key, so timing says nothing about
        which (if any) matched."""
        matched = admin = False
        for key, is_admin in self._keys:
            same = hmac.compare_digest(presented, key)
            matched |= same
            admin |= same and is_admin
        return matched, admin

    def _valid_key(self, headers: dict[bytes, bytes]) -> tuple[bytes, bool] | None:
        """(the request's key, whether it is an admin key) where it is one of ours
        (bearer, else x-api-key)."""
        scheme, _, token = headers.get(b"authorization", b"").partition(b" ")
        api_key = headers.get(b"x-api-key", b"").strip()
        for presented in (token.strip() if scheme.lower() == b"bearer" else b"", api_key):
            accepted, admin = self._match(presented) if presented else (False, False)
            if accepted:
                return presented, admin
        return None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = dict(scope.get("headers", []))
        valid = self._valid_key(headers)
        if valid is not None:
            _admit(scope, *valid)
            await self.app(scope, receive, send)
            return
        if self._open(scope.get("path", "")):
            scope.setdefault("state", {})[_ROLE] = "anonymous"
            await self.app(scope, receive, send)
            return
        header = headers.get(b"authorization", b"")
        api_key = headers.get(b"x-api-key", b"").strip()
        message = ("Missing API key: send `Authorization: Bearer <key>`." if not (header or api_key)
                   else "Incorrect API key provided.")
        error = APIError(401, message, code="invalid_api_key",
                         headers={"WWW-Authenticate": "Bearer"})
        await error.response()(scope, receive, send)
