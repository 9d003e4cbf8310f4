"""GET / (the chat page) and GET /webui/{file} (its scripts, styles and licenses).

The files are read from the package once, at startup, and answered from memory: a fixed
set of names, so no request path ever reaches the filesystem.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from importlib import resources
from importlib.resources.abc import Traversable

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from edge_server.api.http.errors import APIError

PREFIX = "/webui/"
INDEX = "index.html"

# No inline script or style, no eval, nothing from another origin; the page talks to
# this server only. Images: the user's attachments (data: URLs) and the page's icon.
CONTENT_SECURITY_POLICY = "; ".join([
    "default-src 'none'",
    "script-src 'self'",
    "style-src 'self'",
    "img-src 'self' data: blob:",
    "connect-src 'self'",
    "base-uri 'none'",
    "form-action 'none'",
    "frame-ancestors 'none'",
])
_SECURITY_HEADERS = {
    "Content-Security-Policy": CONTENT_SECURITY_POLICY,
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-cache",  # revalidated by ETag: an upgrade shows at once
}
_TYPES = {
    ".html": "text/html; charset=utf-8",
    ".js": "text/javascript; charset=utf-8",
    ".css": "text/css; charset=utf-8",
    ".svg": "image/svg+xml",
    ".txt": "text/plain; charset=utf-8",
    ".LICENSE": "text/plain; charset=utf-8",
}


@dataclass(frozen=True)
class Asset:
    body: bytes
    media_type: str
    etag: str


def _walk(folder: Traversable, prefix: str = "") -> dict[str, Asset]:
    assets: dict[str, Asset] = {}
    for entry in folder.iterdir():
        name = prefix + entry.name
        if entry.is_dir():
            assets.update(_walk(entry, name + "/"))
            continue
        suffix = next((s for s in _TYPES if entry.name.endswith(s)), None)
        if suffix is None:
            continue
        body = entry.read_bytes()
        etag = '"' + hashlib.sha256(body).hexdigest()[:32] + '"'
        assets[name] = Asset(body, _TYPES[suffix], etag)
    return assets


def load_assets() -> dict[str, Asset]:
    return _walk(resources.files(__package__).joinpath("static"))


def _answer(request: Request, asset: Asset) -> Response:
    headers = {**_SECURITY_HEADERS, "ETag": asset.etag}
    if request.headers.get("if-none-match") == asset.etag:
        return Response(status_code=304, headers=headers)
    return Response(asset.body, media_type=asset.media_type, headers=headers)


def routes() -> list[Route]:
    assets = load_assets()

    async def page(request: Request) -> Response:
        return _answer(request, assets[INDEX])

    async def asset(request: Request) -> Response:
        found = assets.get(request.path_params["name"])
        if found is None:
            raise APIError(404, "No such file of the chat page.", code="unknown_url")
        return _answer(request, found)

    return [
        Route("/", page, methods=["GET"]),
        Route(PREFIX + "{name:path}", asset, methods=["GET"]),
    ]
