"""The Starlette application: routes, error handlers, and model loading at startup."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator

from starlette.applications import Starlette

from ..model_registry import ModelRegistry
from .chat.api_router import routes as chat_routes
from .completions.api_router import routes as completion_routes
from .errors import EXCEPTION_HANDLERS
from .models_router import routes as model_routes
from .tokenize_router import routes as tokenize_routes

log = logging.getLogger(__name__)


def create_app(registry: ModelRegistry) -> Starlette:
    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        # Load in a thread: /health answers 503 meanwhile instead of the port being dark.
        loading = asyncio.get_running_loop().run_in_executor(None, registry.load_all)
        loading.add_done_callback(lambda f: f.exception())
        try:
            yield
        finally:
            with contextlib.suppress(Exception):
                await loading
            registry.close()

    app = Starlette(
        routes=[*completion_routes, *chat_routes, *model_routes, *tokenize_routes],
        exception_handlers=EXCEPTION_HANDLERS,  # type: ignore[arg-type]
        lifespan=lifespan,
    )
    app.state.registry = registry
    return app
