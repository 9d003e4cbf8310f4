"""The Starlette application: routes, error handlers, auth, metrics, model lifecycle."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable

from starlette.applications import Starlette
from starlette.middleware import Middleware

from edge_server.api.anthropic.messages.api_router import routes as messages_routes
from edge_server.api.anthropic.messages.error_shape import anthropic_body, is_messages_path
from edge_server.api.http.body import BodyLimit
from edge_server.api.http.error_reshape import ErrorReshaper
from edge_server.api.http.errors import EXCEPTION_HANDLERS, ErrorBoundary
from edge_server.api.http.guards.admission import Admission, AdmissionGate
from edge_server.api.http.guards.auth import APIKeyAuth
from edge_server.api.http.guards.cors import CrossOrigin
from edge_server.api.http.guards.draining import Drain, DrainGate
from edge_server.api.http.guards.host_guard import HostGuard
from edge_server.api.http.metrics import Metrics, RequestCounter, metrics_route
from edge_server.api.http.replica import ReplicaHeader
from edge_server.api.llama_server.completion.api_router import routes as native_routes
from edge_server.api.llama_server.infill.api_router import routes as infill_routes
from edge_server.api.llama_server.lora_adapters import routes as lora_routes
from edge_server.api.llama_server.props import routes as props_routes
from edge_server.api.llama_server.rerank.api_router import routes as rerank_routes
from edge_server.api.llama_server.slots import routes as slot_routes
from edge_server.api.llama_server.tokenize import routes as tokenize_routes
from edge_server.api.ollama.api_router import routes as ollama_routes
from edge_server.api.ollama.error_shape import is_ollama_path, ollama_error
from edge_server.api.ollama.management.blobs import PREFIX as OLLAMA_BLOBS
from edge_server.api.ollama.management.blobs import remove_stale_uploads
from edge_server.api.ollama.management.saved_models import SavedModels
from edge_server.api.openai.audio.api_router import routes as audio_routes
from edge_server.api.openai.chat.api_router import routes as chat_routes
from edge_server.api.openai.completions.api_router import routes as completion_routes
from edge_server.api.openai.embeddings.api_router import routes as embedding_routes
from edge_server.api.openai.models import routes as model_routes
from edge_server.api.openai.responses.api_router import routes as response_routes
from edge_server.api.openai.responses.store import ResponseStore
from edge_server.api.openapi import openapi_route
from edge_server.api.unprefixed import unprefixed_routes
from edge_server.api.webui import api_router as chat_page
from edge_server.catalogue.pool import ModelPool
from edge_server.catalogue.spec import ModelSpec
from edge_server.catalogue.store import ModelStore, RegistryEntry

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
                     *model_routes, *audio_routes]
    routes = [*openai_routes, *unprefixed_routes(openai_routes), *infill_routes,
              *native_routes, *tokenize_routes, *props_routes, *slot_routes, *lora_routes,
              *messages_routes,
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
