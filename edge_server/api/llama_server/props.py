"""GET /props, as llama-server has it: what a client written for llama-server reads
about the model being served (the context one request may use, the slots, the chat
template and its special tokens, the sampler a request gets by default, which inputs
the model reads). `?model=` names another model than the default.

A GET never loads a model another than the default (any web page can make a browser send
one): a model not loaded answers 409 `model_not_loaded`, or with an admin key (where keys
are set) is loaded; an ordinary key gets a 403 for it. The default model, the one the
server runs to serve, is loaded again if keep_alive had unloaded it.

Read-only: llama-server's POST /props, which changes settings at run time, is not served.
"""

from __future__ import annotations

import importlib.metadata
from typing import Any

from pydantic import BaseModel
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from edge_server import __version__
from edge_server.api.common.llama_format import sampler_json
from edge_server.api.common.protocol import SamplingRequest
from edge_server.api.common.sampling_fields import sampling_params
from edge_server.api.http.dependencies import serve_on_get
from edge_server.catalogue.default_model import DEFAULT_ALIAS
from edge_server.engine import Engine


class Modalities(BaseModel):
    vision: bool
    audio: bool


class GenerationSettings(BaseModel):
    n_ctx: int  # tokens one request may use, prompt plus completion
    params: dict[str, Any]  # the default sampler, in llama-server's names


class PropsResponse(BaseModel):
    default_generation_settings: GenerationSettings
    total_slots: int
    model_alias: str
    model_path: str  # the file's name only: where models live is not the caller's
    chat_template: str
    bos_token: str
    eos_token: str
    modalities: Modalities
    build_info: str
    # This server's own: the model's kind of memory (attention, sliding_window,
    # recurrent, hybrid), what a cut may remove, and whether lookup drafting is on.
    memory: dict[str, Any]
    # The CPU kernels the weights run on: amx+repack (AMX tiles and AVX repacked
    # layouts), repack (AVX repacked layouts, no AMX) or plain (llama.cpp's --no-repack).
    cpu_kernels: str


def _build_info() -> str:
    try:
        binding = importlib.metadata.version("llama-cpp-python")
    except importlib.metadata.PackageNotFoundError:
        binding = "unknown"
    return f"edge_server {__version__} (llama-cpp-python {binding})"


def default_sampler(engine: Engine) -> dict[str, Any]:
    """The sampler of a request that sets none of its fields, in llama-server's names."""
    return sampler_json(sampling_params(SamplingRequest(), engine))


def model_props(engine: Engine) -> PropsResponse:
    template = engine.chat_template
    return PropsResponse(
        default_generation_settings=GenerationSettings(n_ctx=engine.n_ctx,
                                                       params=default_sampler(engine)),
        total_slots=engine.n_slots,
        model_alias=engine.model_id,
        model_path=engine.path.name,
        chat_template=template.source,
        bos_token=template.bos_token,
        eos_token=template.eos_token,
        modalities=Modalities(vision="image" in engine.modalities,
                              audio="audio" in engine.modalities),
        build_info=_build_info(),
        memory=engine.memory_info(),
        cpu_kernels=engine.cpu_kernels,
    )


async def props(request: Request) -> Response:
    async def serve(engine: Engine) -> Response:
        return JSONResponse(model_props(engine).model_dump())

    return await serve_on_get(request, request.query_params.get("model", DEFAULT_ALIAS), serve)


routes = [Route("/props", props, methods=["GET"])]
