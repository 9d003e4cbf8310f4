"""GET and POST /lora-adapters (llama-server's): the LoRA adapters a model loaded (with
--lora or its registry entry's `lora`), and the scales requests get that name none.

A request's own `lora` list overrides these scales for that request (llama-server's
rule: adapters it leaves out are off). Setting them is model management: an admin key
where keys are set. Names only, never paths: a file's place on disk is the operator's.
`?model=` names another model than the default; a GET loads none but the default.
"""

from __future__ import annotations

from pydantic import BaseModel, RootModel, field_validator
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from edge_server.api.common.protocol import LoraChoice
from edge_server.api.http.dependencies import parse_body, serve_on_get, serve_with_model
from edge_server.api.http.errors import invalid
from edge_server.api.http.guards.auth import require_admin
from edge_server.catalogue.default_model import DEFAULT_ALIAS
from edge_server.engine import Engine
from edge_server.engine.backend.lora import MAX_ADAPTERS


class LoraAdapterInfo(BaseModel):
    id: int
    path: str  # the file's name (llama-server gives the path it was started with)
    scale: float  # for requests that name no adapters
    task_name: str = ""
    prompt_prefix: str = ""


class LoraAdapterList(RootModel[list[LoraAdapterInfo]]):
    pass


class LoraScales(RootModel[list[LoraChoice]]):
    """POST's body: each adapter's scale; adapters left out are set to 0."""

    @field_validator("root")
    @classmethod
    def _each_once(cls, v: list[LoraChoice]) -> list[LoraChoice]:
        ids = [c.id for c in v]
        if len(v) > MAX_ADAPTERS or len(set(ids)) < len(ids):
            raise ValueError(f"each adapter id may appear once (at most {MAX_ADAPTERS})")
        return v


class LoraApplied(BaseModel):
    success: bool = True


def _listing(engine: Engine) -> Response:
    return JSONResponse(LoraAdapterList([
        LoraAdapterInfo(id=a.id, path=a.name, scale=a.scale, task_name=a.task_name,
                        prompt_prefix=a.prompt_prefix)
        for a in engine.lora.adapters]).model_dump())


async def list_adapters(request: Request) -> Response:
    async def serve(engine: Engine) -> Response:
        return _listing(engine)

    return await serve_on_get(request, request.query_params.get("model", DEFAULT_ALIAS), serve)


async def set_adapters(request: Request) -> Response:
    require_admin(request, "setting LoRA adapter scales")
    body = await parse_body(request, LoraScales)
    scales = {c.id: c.scale for c in body.root}

    async def serve(engine: Engine) -> Response:
        reason = engine.lora.check_request(scales)
        if reason is not None:
            raise invalid("id", reason)
        engine.lora.set_defaults(scales)
        return JSONResponse(LoraApplied().model_dump())

    return await serve_with_model(request, request.query_params.get("model", DEFAULT_ALIAS),
                                  serve)


routes = [Route("/lora-adapters", list_adapters, methods=["GET"]),
          Route("/lora-adapters", set_adapters, methods=["POST"])]
