"""GET /v1/models and GET /health."""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from .dependencies import registry


async def list_models(request: Request) -> JSONResponse:
    reg = registry(request)
    data = [
        {
            "id": spec.id,
            "object": "model",
            "created": int(spec.path.stat().st_mtime) if spec.path.exists() else 0,
            "owned_by": "edge_server",
            "aliases": list(spec.aliases),
        }
        for spec in reg.specs
    ]
    return JSONResponse({"object": "list", "data": data})


async def health(request: Request) -> JSONResponse:
    reg = registry(request)
    if reg.load_error:
        return JSONResponse({"status": "error", "error": "a model failed to load"}, 503)
    if not reg.ready:
        return JSONResponse({"status": "loading"}, 503)
    return JSONResponse({"status": "ok", "models": reg.stats()})


routes = [
    Route("/v1/models", list_models, methods=["GET"]),
    Route("/health", health, methods=["GET"]),
]
