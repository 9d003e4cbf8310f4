"""The Starlette application: routes, error handlers, auth, metrics, model lifecycle."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable

from starlette.applications import Starlette
from starlette.middleware import Middleware

from ..catalogue.pool import ModelPool
from ..catalogue.spec import ModelSpec
from ..catalogue.store import ModelStore, RegistryEntry
from .chat.api_router import routes as chat_routes
from .completions.api_router import routes as completion_routes
from .embeddings.api_router import routes as embedding_routes
from .http.admission import Admission, AdmissionGate
from .http.auth import APIKeyAuth
from .http.body import BodyLimit
from .http.cors import CrossOrigin
from .http.draining import Drain, DrainGate
from .http.error_reshape import ErrorReshaper
from .http.errors import EXCEPTION_HANDLERS, ErrorBoundary
from .http.host_guard import HostGuard
from .http.metrics import Metrics, RequestCounter, metrics_route
from .http.replica import ReplicaHeader
from .infill.api_router import routes as infill_routes
from .messages.api_router import routes as messages_routes
from .messages.error_shape import anthropic_body, is_messages_path
from .native.api_router import routes as native_routes
from .ollama.api_router import routes as ollama_routes
from .ollama.blobs import PREFIX as OLLAMA_BLOBS
from .ollama.blobs import remove_stale_uploads
from .ollama.error_shape import is_ollama_path, ollama_error
from .ollama.saved_models import SavedModels
from .rerank.api_router import routes as rerank_routes
from .responses.api_router import routes as response_routes
from .responses.store import ResponseStore
from .routers.models import routes as model_routes
from .routers.openapi import openapi_route
from .routers.props import routes as props_routes
from .routers.slots import routes as slot_routes
from .routers.tokenize import routes as tokenize_routes
from .routers.unprefixed import unprefixed_routes
from .webui import api_router as chat_page

log = logging.getLogger(__name__)


def create_app(
    pool: ModelPool,
    *,
    preload: str | None,
    metrics: Metrics,
    api_keys: list[str] | None = None,
    admin_api_keys: list[str] | None = None,
    reap_interval: float = 1.0,
    max_body_mb: float = 8.0,
    replica_name: str | None = None,
    webui: bool = True,
    cors_origins: list[str] | None = None,
    store: ModelStore | None = None,
    make_spec: Callable[[RegistryEntry], ModelSpec] | None = None,
    allowed_hosts: list[str] | None = None,
    admitted_per_model: int | None = None,
    slots: bool = False,
    responses: ResponseStore | None = None,
) -> Starlette:
    """`preload`: the model loaded at start; /health answers 200 once it serves.
    `max_body_mb`: larger request bodies get a 413. `replica_name`: sent in the
    X-Edge-Replica header of every answer. `webui`: serve the chat page at /.
    `cors_origins`: web origins whose pages may call the API (others get a 403).
    `admin_api_keys`: keys that may also manage models (the others may only use them).
    `store` and `make_spec` (a registry entry as a pool model) let Ollama's /api/pull and
    /api/delete manage the models directory. `allowed_hosts`: Host names served besides
    loopback ones when there are no API keys. `admitted_per_model`: generation requests
    (slots plus queue) admitted per loaded model before the rest get a 429 unread (None:
    no such gate). `slots`: serve GET /slots (else 501). `responses`: where the Responses
    API keeps responses (None: it is stateless). `app.state.drain` starts draining."""

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
            if responses is not None:
                responses.close()

    # Outermost first: name the replica on every answer, count every answer, refuse web
    # origins not allowed (and answer preflights, and add CORS headers to every answer of
    # the allowed ones, errors included), then turn any unexpected error into a 500 that
    # keeps the connection usable, refuse foreign Host names (without keys: DNS
    # rebinding), refuse new work while draining, refuse oversized bodies before anything
    # reads them, check the key, and last refuse generation requests beyond the engines'
    # slots and queues, still unread.
    keyed = bool(api_keys or admin_api_keys)
    openai_routes = [*completion_routes, *chat_routes, *embedding_routes, *rerank_routes,
                     *model_routes]
    routes = [*openai_routes, *unprefixed_routes(openai_routes), *infill_routes,
              *native_routes, *tokenize_routes, *props_routes, *slot_routes, *messages_routes,
              *response_routes, *ollama_routes,
              metrics_route(metrics), openapi_route(secured=keyed),
              *(chat_page.routes() if webui else [])]
    drain = Drain()
    middleware = [
        Middleware(RequestCounter, metrics=metrics, routes=routes),
        # Every error on /v1/messages* in Anthropic's shape, on /api/* in Ollama's.
        Middleware(ErrorReshaper, matches=is_messages_path, reshape=anthropic_body),
        Middleware(ErrorReshaper, matches=is_ollama_path, reshape=ollama_error,
                   content_type=b"application/json; charset=utf-8"),
        Middleware(CrossOrigin, origins=cors_origins or []),
        Middleware(ErrorBoundary),
    ]
    if replica_name:
        middleware.insert(0, Middleware(ReplicaHeader, name=replica_name))
    if not keyed:
        middleware.append(Middleware(HostGuard, allowed=allowed_hosts or []))
    middleware += [
        Middleware(DrainGate, drain=drain),
        # Uploaded model files stream to disk, bounded by its free space (ollama/blobs).
        Middleware(BodyLimit, max_bytes=int(max_body_mb * 2**20),
                   exempt_prefixes=(OLLAMA_BLOBS,)),
    ]
    if keyed:
        # The chat page's files need no key: the page asks for it.
        middleware.append(Middleware(APIKeyAuth, keys=api_keys or [],
                                     admin_keys=admin_api_keys or [],
                                     open_paths=("/",) if webui else (),
                                     open_prefixes=(chat_page.PREFIX,) if webui else ()))
    admission = Admission(lambda: (admitted_per_model or 0) * max(1, pool.loaded_count()))
    if admitted_per_model is not None:
        middleware.append(Middleware(AdmissionGate, admission=admission))
    metrics.watch_pool(pool)
    metrics.watch_drain(drain)
    metrics.watch_admission(admission)
    app = Starlette(
        routes=routes,
        exception_handlers=EXCEPTION_HANDLERS,
        middleware=middleware,
        lifespan=lifespan,
    )
    app.state.pool = pool
    app.state.drain = drain
    app.state.store = store
    app.state.make_spec = make_spec
    app.state.ollama_saved = None
    if store is not None and make_spec is not None:
        # Models made by Ollama's /api/create and /api/copy serve again; uploads that a
        # stopped process left unfinished go.
        app.state.ollama_saved = SavedModels(store, make_spec)
        app.state.ollama_saved.restore(pool)
        remove_stale_uploads(store)
    app.state.admission = admission
    app.state.responses = responses
    app.state.ready = False
    app.state.slots_enabled = slots
    app.state.startup_error = None
    return app
