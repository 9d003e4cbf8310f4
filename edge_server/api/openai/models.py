"""GET /v1/models, GET /v1/models/{model} and GET /health."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from edge_server.api.http.dependencies import pool
from edge_server.api.http.errors import model_not_found
from edge_server.api.http.guards.auth import role_of
from edge_server.api.http.memory_account import memory_account
from edge_server.catalogue.pool import ModelPool
from edge_server.catalogue.spec import ModelSpec, UnknownModel
from edge_server.engine.backend.rpc import rpc_guard


class ModelCard(BaseModel):
    """OpenAI's model object, plus the names it answers to and whether it is loaded."""

    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str = "edge_server"
    aliases: list[str]
    status: Literal["loaded", "available", "not_downloaded"]
    # What requests to it may carry: "text", plus "image" / "audio" with a projector.
    input_modalities: list[str]
    # Tokens one request may use, prompt plus completion (null: known once loaded).
    context_length: int | None = None


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]


class HealthResponse(BaseModel):
    status: Literal["ok", "loading", "error", "stalled", "draining", "rpc_failed"]
    default_model: str | None = None
    models: dict[str, dict[str, int]] | None = None
    # Per loaded model: KV cache types (type_k, type_v) and whether flash attention is on.
    kv_cache: dict[str, dict[str, str | bool]] | None = None
    # Per loaded model: the CPU kernels its weights run on (amx+repack, repack, plain).
    cpu_kernels: dict[str, str] | None = None
    stalled_models: list[str] | None = None
    # Bytes: the resident set (`rss`) and its parts (see the memory account).
    memory: dict[str, int] | None = None
    error: str | None = None


def _card(models: ModelPool, spec: ModelSpec) -> ModelCard:
    status: Literal["loaded", "available", "not_downloaded"] = (
        "loaded" if models.is_loaded(spec.id)
        else "available" if spec.path else "not_downloaded"
    )
    return ModelCard(id=spec.id, created=spec.created(), aliases=list(spec.aliases),
                     status=status, input_modalities=list(spec.modalities()),
                     context_length=models.context_length(spec))


def _json(body: BaseModel, status: int = 200) -> JSONResponse:
    return JSONResponse(body.model_dump(exclude_none=True), status)


async def list_models(request: Request) -> JSONResponse:
    """The default model first: clients that take `data[0]` get the one served by default."""
    models = pool(request)
    return _json(ModelList(data=[_card(models, spec) for spec in models.specs]))


async def retrieve_model(request: Request) -> JSONResponse:
    """One model by its id or any alias (alias patterns and --serve-unknown-models
    included, as requests resolve); the answer carries its id (as OpenAI resolves an alias
    to the model's own name)."""
    name: str = request.path_params["model"]
    if not name:  # `/v1/models/`: a client whose base URL ends in a slash
        return await list_models(request)
    models = pool(request)
    try:
        spec = models.resolve(name)
    except UnknownModel as exc:
        raise model_not_found(name) from exc
    return _json(_card(models, spec))


async def health(request: Request) -> JSONResponse:
    """200 once the default model is loaded and serving; 503 before (or if it failed),
    and while draining after SIGTERM. The counters and the memory account (what every
    key's work made: prompt-store entries, images encoded, tokens) go to the admin key
    (or to all on a server without keys); an ordinary key gets the status and the
    models' settings, a caller without a key the status alone. Nothing is gathered that
    the answer leaves out."""
    role = role_of(request)
    answer, status = _health(request, detail=role in ("keyless", "admin"))
    if role == "anonymous":
        answer = HealthResponse(status=answer.status)
    return _json(answer, status)


def _health(request: Request, *, detail: bool) -> tuple[HealthResponse, int]:
    models = pool(request)
    state = request.app.state
    if state.startup_error:
        return HealthResponse(status="error", error="the default model failed to load"), 503
    if state.drain.draining:
        # Shutting down: a load balancer's check sees it and sends new work elsewhere.
        return HealthResponse(status="draining"), 503
    if rpc_guard.failure():
        # An RPC server holding layers is gone: the split cannot serve until a restart.
        # /health needs no key, so it does not say which server (its host:port is in
        # the log, and in the errors of requests, which need the key).
        return HealthResponse(status="rpc_failed", error="an RPC server holding model "
                              "layers is unreachable; see the server log"), 503
    if not state.ready:
        return HealthResponse(status="loading", default_model=models.default_id), 503
    stalled = models.stalled(getattr(state, "watchdog_seconds", 30.0))
    if stalled:
        # An engine step that runs this long is stuck in C: say so, so that a service
        # manager or load balancer stops sending work and restarts us.
        return HealthResponse(status="stalled", stalled_models=stalled), 503
    answer = HealthResponse(status="ok", default_model=models.default_id,
                            kv_cache=models.kv_cache(), cpu_kernels=models.cpu_kernels())
    if detail:
        answer.models, answer.memory = models.stats(), memory_account(models)
    return answer, 200


routes = [
    Route("/v1/models", list_models, methods=["GET"]),
    # `path`: registry ids may hold a slash (Hugging Face style), sent unescaped by clients.
    Route("/v1/models/{model:path}", retrieve_model, methods=["GET"]),
    Route("/health", health, methods=["GET"]),
]
