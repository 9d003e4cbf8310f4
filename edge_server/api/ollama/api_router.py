"""HTTP routes of Ollama's API (/api/*)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from edge_server.api.http.dependencies import acquire, parse_body, pool, serve_with_model
from edge_server.api.http.guards.auth import require_admin, role_of
from edge_server.api.ollama import names, profiles
from edge_server.api.ollama.embed import EmbedServing
from edge_server.api.ollama.management import blobs, models
from edge_server.api.ollama.management.create import create
from edge_server.api.ollama.management.pull import pull
from edge_server.api.ollama.management.saved_models import Profile, SavedModels
from edge_server.api.ollama.options import keep_alive_seconds
from edge_server.api.ollama.protocol import (
    ChatRequest,
    EmbeddingsRequest,
    EmbedRequest,
    GenerateRequest,
)
from edge_server.api.ollama.serving import OllamaServing
from edge_server.api.ollama.streaming import Clock, created_at
from edge_server.catalogue.pool import ModelPool
from edge_server.catalogue.spec import UnknownModel
from edge_server.engine import Engine

_serving = OllamaServing()
_embedding = EmbedServing()


def _keep_alive(request: Request, keep_alive: float | str | None, models_: ModelPool,
                name: str) -> float | None:
    """The request's keep_alive in seconds. What holds a model's memory for every caller
    needs an admin key where keys are set: 0 (unloads it), and keeping it longer than the
    server's default for it (negative: for good)."""
    seconds = keep_alive_seconds(keep_alive)
    if seconds == 0:
        require_admin(request, "keep_alive 0 (unloading the model for every caller)")
    elif seconds is not None and role_of(request) == "user":
        try:
            default = models_.spec(name).keep_alive
        except UnknownModel:
            default = None  # answered as unknown where the model is looked up
        default = models_.keep_alive if default is None else default
        if default >= 0 and (seconds < 0 or seconds > default):
            require_admin(request, f"keep_alive {keep_alive!r} (longer than this server's "
                          f"{default:g} s for the model, held for every caller)")
    return seconds


async def _with_model(request: Request, model: str, keep_alive: float | str | None,
                      serve: Callable[[Engine, Clock], Awaitable[Response]]) -> Response:
    """Runs `serve` on the model's engine (loaded if need be); the model then stays for
    the request's keep_alive (the server's default when absent)."""
    clock = Clock()
    models_ = pool(request)
    name = names.pool_name(models_, model)
    seconds = _keep_alive(request, keep_alive, models_, name)

    async def serving(engine: Engine) -> Response:
        clock.mark_loaded()
        models_.set_keep_alive(engine.model_id, seconds)
        return await serve(engine, clock)

    return await serve_with_model(request, name, serving)


async def _load_or_unload(request: Request, model: str, keep_alive: float | str | None,
                          chat: bool) -> Response:
    """An empty chat or prompt loads the model, or with keep_alive 0 unloads it."""
    models_ = pool(request)
    name = names.pool_name(models_, model)
    seconds = _keep_alive(request, keep_alive, models_, name)
    if seconds == 0:
        model_id = models_.spec(name).id
        models_.set_keep_alive(model_id, 0)
        await models_.unload_when_idle(model_id, wait=5.0)
        reason = "unload"
    else:
        lease = await acquire(request, name)  # loads it if need be
        models_.set_keep_alive(lease.model_id, seconds)
        lease.release()
        reason = "load"
    body: dict[str, Any] = {"model": model, "created_at": created_at()}
    body |= {"message": {"role": "assistant", "content": ""}} if chat else {"response": ""}
    return JSONResponse({**body, "done": True, "done_reason": reason})


def _profile(request: Request, model: str) -> Profile | None:
    """What the Modelfile of a model made by /api/create adds (None: nothing)."""
    saved: SavedModels | None = getattr(request.app.state, "ollama_saved", None)
    if saved is None or not saved.models:
        return None
    return saved.profile(names.pool_name(pool(request), model))


async def chat(request: Request) -> Response:
    body = await parse_body(request, ChatRequest)
    if not body.messages:
        return await _load_or_unload(request, body.model, body.keep_alive, chat=True)
    profile = _profile(request, body.model)
    template = None
    if profile is not None:
        body, template = profiles.chat(body, profile), profile.template
    return await _with_model(request, body.model, body.keep_alive,
                             lambda engine, clock: _serving.chat(body, engine, request, clock,
                                                                 template))


async def generate(request: Request) -> Response:
    body = await parse_body(request, GenerateRequest)
    if not body.prompt and not body.images and body.suffix is None:
        return await _load_or_unload(request, body.model, body.keep_alive, chat=False)
    profile = _profile(request, body.model)
    template = None
    if profile is not None:
        body, template = profiles.generate(body, profile), profile.template
    return await _with_model(request, body.model, body.keep_alive,
                             lambda engine, clock: _serving.generate(body, engine, request,
                                                                     clock, template))


async def embed(request: Request) -> Response:
    body = await parse_body(request, EmbedRequest)
    profile = _profile(request, body.model)
    if profile is not None:
        body.options = {**profile.parameters, **(body.options or {})}
    return await _with_model(request, body.model, body.keep_alive,
                             lambda engine, clock: _embedding.embed(body, engine, request, clock))


async def embeddings(request: Request) -> Response:
    body = await parse_body(request, EmbeddingsRequest)
    profile = _profile(request, body.model)
    if profile is not None:
        body.options = {**profile.parameters, **(body.options or {})}
    return await _with_model(request, body.model, body.keep_alive,
                             lambda engine, _: _embedding.embeddings(body, engine, request))


routes = [
    Route("/api/version", models.version, methods=["GET"]),
    Route("/api/tags", models.list_tags, methods=["GET"]),
    Route("/api/ps", models.running, methods=["GET"]),
    Route("/api/show", models.show, methods=["POST"]),
    Route("/api/chat", chat, methods=["POST"]),
    Route("/api/generate", generate, methods=["POST"]),
    Route("/api/embed", embed, methods=["POST"]),
    Route("/api/embeddings", embeddings, methods=["POST"]),
    Route("/api/pull", pull, methods=["POST"]),
    Route("/api/copy", models.copy, methods=["POST"]),
    Route("/api/delete", models.delete, methods=["DELETE"]),
    Route("/api/create", create, methods=["POST"]),
    *blobs.routes,
    Route("/api/push", models.refuse_push, methods=["POST"]),
]
