"""GET /v1/models and GET /health."""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from .dependencies import pool


async def list_models(request: Request) -> JSONResponse:
    models = pool(request)
    data = [
        {
            "id": spec.id,
            "object": "model",
            "created": int(spec.path.stat().st_mtime) if spec.path else 0,
            "owned_by": "edge_server",
            "aliases": list(spec.aliases),
            "status": "loaded" if models.is_loaded(spec.id)
            else ("available" if spec.path else "not_downloaded"),
        }
        for spec in models.specs
    ]
    return JSONResponse({"object": "list", "data": data})


async def health(request: Request) -> JSONResponse:
    """200 once the default model is loaded and serving; 503 before (or if it failed)."""
    models = pool(request)
    state = request.app.state
    if state.startup_error:
        return JSONResponse({"status": "error", "error": "the default model failed to load"},
                            503)
    if not state.ready:
        return JSONResponse({"status": "loading"}, 503)
    stalled = models.stalled(getattr(state, "watchdog_seconds", 30.0))
    if stalled:
        # An engine step that runs this long is stuck in C: say so, so that a service
        # manager or load balancer stops sending work and restarts us.
        return JSONResponse({"status": "stalled", "stalled_models": stalled}, 503)
    return JSONResponse({"status": "ok", "models": models.stats()})


routes = [
    Route("/v1/models", list_models, methods=["GET"]),
    Route("/health", health, methods=["GET"]),
]
