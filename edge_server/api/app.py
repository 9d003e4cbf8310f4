"""The Starlette application: routes, error handlers, auth, metrics, model lifecycle."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator

from starlette.applications import Starlette
from starlette.middleware import Middleware

from ..model_pool import ModelPool
from .chat.api_router import routes as chat_routes
from .completions.api_router import routes as completion_routes
from .embeddings.api_router import routes as embedding_routes
from .http.auth import APIKeyAuth
from .http.body import BodyLimit
from .http.draining import Drain, DrainGate
from .http.errors import EXCEPTION_HANDLERS, ErrorBoundary
from .http.metrics import Metrics, RequestCounter, metrics_route
from .http.replica import ReplicaHeader
from .infill.api_router import routes as infill_routes
from .messages.api_router import routes as messages_routes
from .messages.error_shape import AnthropicErrors
from .responses.api_router import routes as response_routes
from .routers.models import routes as model_routes
from .routers.openapi import openapi_route
from .routers.tokenize import routes as tokenize_routes
from .routers.unprefixed import unprefixed_routes

log = logging.getLogger(__name__)


def create_app(
    pool: ModelPool,
    *,
    preload: str | None,
    metrics: Metrics,
    api_keys: list[str] | None = None,
    reap_interval: float = 1.0,
    max_body_mb: float = 8.0,
    replica_name: str | None = None,
) -> Starlette:
    """`preload`: the model loaded at start; /health answers 200 once it serves.
    `max_body_mb`: larger request bodies get a 413. `replica_name`: sent in the
    X-Edge-Replica header of every answer. `app.state.drain` starts draining."""

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        async def load_default() -> None:
            try:
                if preload is not None:
                    await pool.preload(preload)
                app.state.ready = True
            except Exception as exc:
                app.state.startup_error = str(exc)
                log.error("the default model failed to load: %s", exc)

        # Load in the background: /health answers 503 meanwhile instead of the port being
        # dark, and a service manager can tell "starting" from "dead".
        loading = asyncio.create_task(load_default())
        reaper = asyncio.create_task(pool.run_reaper(reap_interval))
        try:
            yield
        finally:
            reaper.cancel()
            loading.cancel()
            with contextlib.suppress(BaseException):
                await loading
            pool.close()

    # Outermost first: name the replica on every answer, count every answer, then turn
    # any unexpected error into a 500 that keeps the connection usable, refuse new work
    # while draining, then refuse oversized bodies before anything reads them.
    drain = Drain()
    middleware = [
        Middleware(RequestCounter, metrics=metrics),
        Middleware(AnthropicErrors),  # every error on /v1/messages* in Anthropic's shape
        Middleware(ErrorBoundary),
        Middleware(DrainGate, drain=drain),
        Middleware(BodyLimit, max_bytes=int(max_body_mb * 2**20)),
    ]
    if replica_name:
        middleware.insert(0, Middleware(ReplicaHeader, name=replica_name))
    if api_keys:
        middleware.append(Middleware(APIKeyAuth, keys=api_keys))
    metrics.watch_pool(pool)
    metrics.watch_drain(drain)
    openai_routes = [*completion_routes, *chat_routes, *embedding_routes, *model_routes]
    app = Starlette(
        routes=[*openai_routes, *unprefixed_routes(openai_routes), *infill_routes,
                *tokenize_routes, *messages_routes, *response_routes, metrics_route(metrics),
                openapi_route(secured=bool(api_keys))],
        exception_handlers=EXCEPTION_HANDLERS,  # type: ignore[arg-type]
        middleware=middleware,
        lifespan=lifespan,
    )
    app.state.pool = pool
    app.state.drain = drain
    app.state.ready = False
    app.state.startup_error = None
    return app
