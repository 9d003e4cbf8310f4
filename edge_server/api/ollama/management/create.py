"""POST /api/create: a model made from one the server serves, or from an uploaded GGUF
blob, with a Modelfile's ADAPTER, TEMPLATE, SYSTEM and PARAMETER lines; saved
(saved_models) so it serves again after a restart. Both request shapes are read: the
Modelfile's text (`modelfile`), or its parts as fields (`from`, `files`, `adapters`,
`template`, `system`, `parameters`). LoRA adapters are uploaded blobs (a client reads
the files), loaded with the source's file in an engine of the new model's own, at scale
1. Whatever is not done here (quantizing, messages, ...) is refused by name. The
Modelfile is read and its profile checked on a worker thread; the new name must be one
in Ollama's grammar (names.check_name).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from edge_server.api.http.dependencies import off_loop, parse_body, pool
from edge_server.api.http.errors import APIError, invalid
from edge_server.api.http.guards.auth import require_admin
from edge_server.api.ollama import names
from edge_server.api.ollama import options as opts
from edge_server.api.ollama.management import modelfile
from edge_server.api.ollama.management.blobs import digest_of
from edge_server.api.ollama.management.saved_models import (
    BLOB_PREFIX,
    Profile,
    SavedModel,
    SavedModels,
    blob_path,
    check_new_name,
)
from edge_server.api.ollama.protocol import CreateRequest
from edge_server.api.ollama.streaming import line, ndjson_stream
from edge_server.api.ollama.translate import render_template
from edge_server.catalogue.pool import ModelPool
from edge_server.engine.backend.gguf_header import GGUFHeader
from edge_server.engine.backend.lora import MAX_ADAPTERS

# Fields of the request for what this server does not do, and why.
_REFUSED = {
    "path": "a Modelfile's path is read by the client: send its text as `modelfile`",
    "quantize": "models are not quantized here: upload a quantized GGUF file",
    "quantization": "models are not quantized here: upload a quantized GGUF file",
    "draft_quantize": "models are not quantized here",
    "draft_files": "draft models are set when the server starts (--draft-max)",
    "messages": "saved messages are not kept here: send them with each chat",
    "license": "licenses are read from the model's file here",
    "remote_host": "models are served from this server only",
    "renderer": "the model's own chat template renders here",
    "parser": "the model's own output parsing applies here",
    "requires": "there is no Ollama version to require here",
    "info": "a model's details are read from its file here",
}


def saved_models(request: Request) -> SavedModels:
    saved: SavedModels | None = getattr(request.app.state, "ollama_saved", None)
    if saved is None:
        raise APIError(400, "this server has no models directory to keep models in",
                       code="unsupported_endpoint")
    return saved


def _recipe(body: CreateRequest) -> modelfile.Recipe:
    for name, why in _REFUSED.items():
        if getattr(body, name) not in (None, "", [], {}):
            raise invalid(name, f"`{name}` is not supported: {why}")
    recipe = modelfile.parse(body.modelfile) if body.modelfile else modelfile.Recipe()
    if body.files:
        if len(body.files) != 1 or not next(iter(body.files)).endswith(".gguf"):
            raise invalid("files", "`files` must name one GGUF file (safetensors "
                          "directories are not converted here)")
        recipe.source = digest_of(next(iter(body.files.values())), "files")
    if body.from_ is not None:
        recipe.source = body.from_
    recipe.adapters += list((body.adapters or {}).values())
    for field in ("template", "system"):
        if getattr(body, field) is not None:
            setattr(recipe, field, getattr(body, field))
    if body.parameters:
        recipe.parameters |= body.parameters
    if not recipe.source:
        raise invalid("from", "the model needs a source: `from` (or FROM in `modelfile`) "
                      "names a model, or `files` an uploaded GGUF")
    return recipe


def _checked_profile(recipe: modelfile.Recipe) -> Profile:
    try:
        opts.sampling(recipe.parameters)
    except APIError as exc:
        name = (exc.param or "").removeprefix("options.")
        exc.message = exc.message.replace("options.", "parameters.")
        exc.param = f"parameters.{name}" if name else "parameters"
        raise
    if recipe.template is not None:
        render_template(recipe.template, {}, None)  # a 400 naming `template` if unsupported
    return Profile(recipe.system, recipe.template, recipe.parameters)


def _source(saved: SavedModels, models: ModelPool, source: str) -> tuple[str, Profile | None]:
    """What the new model is served from, and the profile it builds on (FROM a model
    made here: its own)."""
    if source.startswith(("@sha256", "sha256")):
        digest = digest_of(source.removeprefix("@"), "from")
        if not blob_path(saved.store, digest).is_file():
            raise invalid("from", f"no blob {digest} on this server: upload it first "
                          "(POST /api/blobs/<digest>)")
        return digest, None
    if source.startswith(("/", ".", "~")) or source.endswith(".gguf"):
        raise invalid("from", "a file path is read by the client, not the server: upload "
                      "the file (POST /api/blobs/<digest>) and name its digest")
    return made_from(saved, models, names.pool_name(models, source))


def made_from(saved: SavedModels, models: ModelPool, name: str) -> tuple[str, Profile | None]:
    """The source a model made from the pool's `name` is saved with, and its profile."""
    base = saved.models.get(name)
    if base is None:
        return models.spec(name).id, None
    # A blob model serves its own engine: FROM it names it; a name made here for another
    # model stands for that model.
    return (name if base.own_engine else base.source), base.profile


def _adapter_blobs(saved: SavedModels, models: ModelPool, recipe: modelfile.Recipe,
                   source: str) -> tuple[str, tuple[str, ...]]:
    """The new model's source and adapters (blob digests, each checked to be a LoRA GGUF
    of its source's architecture): FROM a model with adapters, its own come first."""
    if not recipe.adapters:
        return source, ()
    base = saved.models.get(source)
    inherited: tuple[str, ...] = ()
    if base is not None and base.own_engine:
        source, inherited = base.source, base.adapters
    if source.startswith(BLOB_PREFIX):
        base_file: Path | None = blob_path(saved.store, source)
    else:
        base_file = models.spec(source).path
    arch = _header(base_file).get("general.architecture") if base_file else None
    digests = []
    for text in recipe.adapters:
        if text.startswith(("/", ".", "~")) or text.endswith((".gguf", ".safetensors")):
            raise _bad_adapter("an adapter's file is read by the client, not the server: "
                               "upload it (POST /api/blobs/<digest>) and name its digest")
        digest = digest_of(text.removeprefix("@"), "adapters")
        path = blob_path(saved.store, digest)
        if not path.is_file():
            raise _bad_adapter(f"no blob {digest} on this server: upload it first "
                               "(POST /api/blobs/<digest>)")
        header = _header(path)
        if header.get("general.type") != "adapter" or header.get("adapter.type") != "lora":
            raise _bad_adapter(f"blob {digest} is not a LoRA adapter GGUF (safetensors "
                               "adapters are not converted here)")
        if arch is not None and header.get("general.architecture") != arch:
            raise _bad_adapter(f"blob {digest} adapts another architecture than the "
                               f"model's ({arch})")
        digests.append(digest)
    if len(inherited) + len(digests) > MAX_ADAPTERS:
        raise _bad_adapter(f"a model may have at most {MAX_ADAPTERS} adapters")
    return source, inherited + tuple(digests)


def _bad_adapter(why: str) -> APIError:
    return invalid("adapters", f"`adapters` (ADAPTER in a Modelfile): {why}")


def _header(path: Path) -> dict[str, object]:
    try:
        return GGUFHeader(path).values
    except (OSError, ValueError):
        return {}


async def _replace(saved: SavedModels, models: ModelPool, name: str) -> None:
    """Makes way for a model created again under its name."""
    if name in saved.unread:
        raise APIError(409, f"\"{name[:200]}\" names a saved model this server cannot read "
                       "(see the server log); delete it first", param="model",
                       code="model_exists")
    if name not in saved.models:
        try:
            models.spec(name)
        except LookupError:
            return
        raise APIError(409, f"\"{name[:200]}\" names a model this server was given; choose "
                       "another name", param="model", code="model_exists")
    await forget(saved, models, name)


async def forget(saved: SavedModels, models: ModelPool, name: str) -> None:
    """Stops serving a saved model: not while others are made from it or it serves."""
    others = saved.dependents(name)
    if others:
        raise _in_use(name, others[0])
    model = saved.models.get(name)
    if model is not None and model.own_engine:
        await models.unload_when_idle(name, wait=5.0)
        if models.is_loaded(name):
            raise APIError(409, f"model \"{name[:200]}\" is serving requests; retry when "
                           "they are done", param="model", code="model_in_use")
    try:
        await saved.forget(models, name)  # the pool on the loop: not shared with threads
    except ValueError as exc:  # made from it in another process sharing the directory
        raise _in_use(name, str(exc)) from exc


def _in_use(name: str, other: str) -> APIError:
    return APIError(409, f"model \"{name[:200]}\" is the source of {other[:200]}: delete "
                    "that first", param="model", code="model_in_use")


def _progress(source: str) -> list[dict[str, Any]]:
    using = source if source.startswith(BLOB_PREFIX) else f"model {source}"
    return [{"status": f"using existing layer {using}"}, {"status": "writing manifest"},
            {"status": "success"}]


def _prepared(body: CreateRequest) -> tuple[modelfile.Recipe, Profile]:
    """The Modelfile read and its profile checked (blocking: a thread's work)."""
    recipe = _recipe(body)
    return recipe, _checked_profile(recipe)


async def create(request: Request) -> Response:
    require_admin(request)
    body = await parse_body(request, CreateRequest)
    saved = saved_models(request)
    models = pool(request)
    name = body.model.removesuffix(names.LATEST)
    check_new_name(name, len(saved.models) + len(saved.unread) - saved.taken(name))
    recipe, profile = await off_loop(_prepared, body)
    source, base = await off_loop(_source, saved, models, recipe.source or "")
    source, adapters = await off_loop(_adapter_blobs, saved, models, recipe, source)
    await _replace(saved, models, name)
    profile = profile.over(base)
    empty = not (profile.system or profile.template or profile.parameters)
    model = SavedModel(name, source, None if empty and base is None else profile, adapters)
    try:
        await saved.add(models, model)
    except ValueError as exc:
        raise APIError(409, f"\"{name[:200]}\" already names a model", param="model",
                       code="model_exists") from exc
    steps = _progress(source)
    if body.stream is False:
        return JSONResponse(steps[-1])

    async def lines() -> AsyncIterator[str]:
        for step in steps:
            yield line(step)

    return ndjson_stream(lines())
