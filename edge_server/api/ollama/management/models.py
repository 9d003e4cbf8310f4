"""Ollama's model management on the pool and the models directory: /api/tags, /api/show,
/api/ps, /api/version, /api/copy, /api/delete; /api/push is refused.

Names made by /api/copy are saved with the models /api/create makes (saved_models), and
serve again after a restart; a copy never repoints a name that is taken (409), and their
grammar, number and length are bounded. /api/delete removes such a name or model, or the
file of a model pulled into the models directory once no other name serves from it; the
default model, the embedded one and files the registry points at are the operator's and
are not deleted. Copy, create, blob uploads and delete need an admin key where keys are
set (require_admin).
"""

from __future__ import annotations

import json
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from edge_server.api.http.dependencies import parse_body, pool
from edge_server.api.http.errors import APIError
from edge_server.api.http.guards.auth import require_admin
from edge_server.api.http.io_threads import run_io
from edge_server.api.ollama import names
from edge_server.api.ollama.management.create import forget, made_from
from edge_server.api.ollama.management.gguf_info import FACTS
from edge_server.api.ollama.management.saved_models import (
    Profile,
    SavedModel,
    SavedModels,
    check_new_name,
)
from edge_server.api.ollama.options import DEFAULTS
from edge_server.api.ollama.protocol import CopyRequest, ModelRequest
from edge_server.api.openai.chat.tool_parsers import think_markers
from edge_server.catalogue.names import TooManyNames
from edge_server.catalogue.pool import ModelPool
from edge_server.catalogue.spec import ModelSpec
from edge_server.catalogue.store import ModelStore

# The Ollama release whose API this server speaks: clients check it for features.
OLLAMA_VERSION = "0.12.6"
_UNKNOWN_DETAILS = {"parent_model": "", "format": "gguf", "family": "unknown", "families": None,
                    "parameter_size": "unknown", "quantization_level": "unknown"}


def _time(seconds: float) -> str:
    return datetime.fromtimestamp(seconds, UTC).isoformat().replace("+00:00", "Z")


def _model_entry(spec: ModelSpec, name: str) -> dict[str, Any] | None:
    """A model as /api/tags lists it (blocking: reads the file's header and digest);
    None when its file is gone (deleted on disk since it was listed)."""
    assert spec.path is not None
    try:
        stat = spec.path.stat()
        return {
            "name": names.tagged(name),
            "model": names.tagged(name),
            "modified_at": _time(stat.st_mtime),
            "size": stat.st_size,
            "digest": FACTS.digest(spec.path),
            "details": FACTS.info(spec.path).details,
        }
    except OSError:
        return None


def _listed_names(models: ModelPool, spec: ModelSpec) -> list[str]:
    """A model's id, and the names /api/copy gave it (as Ollama lists each copy)."""
    return [spec.id, *(a for a in spec.aliases if a in models.runtime_names)]


def _tags(models: ModelPool) -> dict[str, Any]:
    entries = []
    for spec in list(models.specs):
        if spec.path is None or not spec.path.is_file():
            continue
        entries += [e for name in _listed_names(models, spec)
                    if (e := _model_entry(spec, name)) is not None]
    return {"models": entries}


async def list_tags(request: Request) -> Response:
    return JSONResponse(await run_io(_tags, pool(request)))


async def version(_: Request) -> Response:
    return JSONResponse({"version": OLLAMA_VERSION})


def _parameters(profile: Profile | None) -> str:
    """The options a request that gives none samples with: Ollama's defaults, under the
    model's PARAMETER lines."""
    values = {**DEFAULTS, **(profile.parameters if profile else {})}
    return "\n".join(f"{key:<30} {json.dumps(one) if isinstance(one, str) else one}"
                     for key, value in values.items()
                     for one in (value if isinstance(value, list) else [value]))


def _modelfile(spec: ModelSpec, profile: Profile | None) -> str:
    lines = ["# Served by edge_server", f"FROM {spec.id}"]
    if profile is not None:
        if profile.template is not None:
            lines.append(f'TEMPLATE """{profile.template}"""')
        if profile.system is not None:
            lines.append(f'SYSTEM """{profile.system}"""')
        for key, value in profile.parameters.items():
            for one in value if isinstance(value, list) else [value]:
                lines.append(f"PARAMETER {key} {json.dumps(one)}")
    return "\n".join(lines) + "\n"


def _capabilities(models: ModelPool, spec: ModelSpec, template: str) -> list[str]:
    capabilities = ["completion", "tools"]  # tools: the template's, or a generic prompt
    if "image" in spec.modalities():
        capabilities.append("vision")
    # A template that can switch thinking, or writes its family's reasoning opening
    # (`<think>`, `[THINK]`, harmony's analysis channel, `<seed:think>` …).
    if "enable_thinking" in template or think_markers(template)[0] in template:
        capabilities.append("thinking")
    return capabilities


def _show(models: ModelPool, spec: ModelSpec, verbose: bool,
          profile: Profile | None) -> dict[str, Any]:
    if spec.path is None or not spec.path.is_file():
        raise names.not_found(spec.id)
    try:
        info, modified = FACTS.info(spec.path), spec.path.stat().st_mtime
    except OSError:  # removed on disk meanwhile
        raise names.not_found(spec.id) from None
    template = spec.settings.chat_template or info.chat_template or ""
    extra = {"system": profile.system} if profile and profile.system is not None else {}
    return {
        "modelfile": _modelfile(spec, profile),
        "parameters": _parameters(profile),
        "template": profile.template if profile and profile.template is not None else template,
        **extra,
        "license": str(info.model_info.get("general.license", "")),
        "details": info.details,
        "model_info": FACTS.show_info(spec.path, verbose),
        "capabilities": _capabilities(models, spec, template),
        "modified_at": _time(modified),
    }


async def show(request: Request) -> Response:
    body = await parse_body(request, ModelRequest)
    models = pool(request)
    name = names.pool_name(models, body.model)
    saved = _saved(request)
    profile = saved.profile(name) if saved is not None else None
    return JSONResponse(await run_io(_show, models, models.spec(name), bool(body.verbose),
                                     profile))


def _running(models: ModelPool) -> dict[str, Any]:
    entries = []
    for spec in list(models.specs):
        if not models.is_loaded(spec.id) or spec.path is None:
            continue
        left = models.expires_in(spec.id)
        # Ollama writes a far-off date for a model kept loaded for good.
        expires = time.time() + (left if left is not None else 100 * 365 * 86400)
        engine = models.loaded_engine(spec.id)
        # A loaded model whose file was removed on disk still runs (its weights are
        # mapped): listed with what is known, never a 500.
        entry = _model_entry(spec, spec.id) or {
            "name": names.tagged(spec.id), "model": names.tagged(spec.id),
            "modified_at": _time(0), "digest": "", "details": _UNKNOWN_DETAILS}
        entries.append({**entry, "size": models.loaded_bytes(spec.id), "size_vram": 0,
                        "expires_at": _time(expires),
                        # What one request may use: prompt plus answer.
                        "context_length": engine.n_ctx if engine is not None else 0})
    return {"models": entries}


async def running(request: Request) -> Response:
    return JSONResponse(await run_io(_running, pool(request)))


def _saved(request: Request) -> SavedModels | None:
    return getattr(request.app.state, "ollama_saved", None)


async def copy(request: Request) -> Response:
    require_admin(request, "copying a model")
    body = await parse_body(request, CopyRequest)
    models = pool(request)
    source = names.pool_name(models, body.source)
    destination = body.destination.removesuffix(names.LATEST)
    saved = _saved(request)
    try:
        if saved is None:  # no models directory: the name lasts as long as the process
            names.check_name(destination, "destination")
            models.add_name(source, destination)
        else:
            check_new_name(destination, len(saved.models) + len(saved.unread), "destination")
            await saved.add(models, SavedModel(destination, *made_from(saved, models, source)))
    except TooManyNames as exc:
        raise APIError(409, str(exc), param="destination", code="too_many_names") from exc
    except ValueError as exc:
        raise APIError(409, f"destination \"{body.destination[:256]}\" already names a model: "
                       "a copy does not repoint a name", param="destination",
                       code="name_taken") from exc
    return Response(status_code=200)


def _deletable_file(store: ModelStore | None, spec: ModelSpec) -> Path | None:
    """The model's file where it was pulled into the models directory, else None (a
    registry model with a local path is the operator's, wherever it lies)."""
    if store is None or spec.path is None:
        return None
    entry = store.find(spec.id)
    # The embedded model's conversion is a cache of the operator's package, wherever it lies.
    if entry is not None and (entry.path is not None or entry.embedded):
        return None
    try:
        spec.path.resolve().relative_to(store.models_dir.resolve())
    except ValueError:
        return None
    return spec.path


def _unlink_unless_served(models: ModelPool, spec: ModelSpec, path: Path) -> None:
    """Removes the file unless another model serves from it (blocking: resolves paths).
    Two hub names can name one file (`hf.co/o/r:Q4_K_M` and `hf.co/o/r:q4_k_m`), as can a
    registry id and a hub name of its repo: the file stays while one of them is left."""
    target = path.resolve()
    if not any(other is not spec and other.path is not None and other.path.resolve() == target
               for other in list(models.specs)):
        path.unlink(missing_ok=True)


async def delete(request: Request) -> Response:
    require_admin(request, "deleting a model")
    body = await parse_body(request, ModelRequest)
    models = pool(request)
    saved = _saved(request)
    # A saved model is deleted by its name even when it could not be served or read.
    made = next((n for n in (body.model, body.model.removesuffix(names.LATEST))
                 if saved is not None and saved.taken(n)), None)
    if saved is not None and made is not None:
        await forget(saved, models, made)
        return Response(status_code=200)
    name = names.pool_name(models, body.model)
    if name in models.runtime_names:
        models.remove_name(name)
        return Response(status_code=200)
    spec = models.spec(name)
    path = _deletable_file(getattr(request.app.state, "store", None), spec)
    if path is None or spec.id == models.default_id:
        raise APIError(403, f"model \"{body.model[:256]}\" is the operator's (the default "
                       "model, the embedded one, or a file the registry names): it is not "
                       "deleted", param="model", code="permission_denied")
    await models.unload_when_idle(spec.id, wait=5.0)
    if models.is_loaded(spec.id):
        raise APIError(409, f"model \"{body.model[:256]}\" is serving requests; retry "
                       "when they are done", param="model", code="model_in_use")
    # The name stops serving the file at once; the file goes only with its last name.
    models.set_file(spec.id, None, f"model `{spec.id}` was deleted; pull it again")
    await run_io(_unlink_unless_served, models, spec, path)
    return Response(status_code=200)


async def refuse_push(request: Request) -> Response:
    raise APIError(400, "pushing models is not supported by this server: it serves models, "
                   "it does not publish them", code="unsupported_endpoint")
