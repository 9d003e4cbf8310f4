"""GET /slots (llama-server's): what each slot of a model is doing, read-only. Off
unless the server runs with --slots (then 501, as llama-server answers); behind the API
key like every route. Counts only: a slot serves any caller, so no prompt text is shown,
and an ordinary key sees counts only of the slots serving (or keeping) its own work; of
the others, whether they are busy. `?model=` names another model than the default, and
a GET loads none but the default (dependencies.serve_on_get); `?fail_on_no_slot=1`
answers 503 when every slot is busy (llama-server's check for load balancers)."""

from __future__ import annotations

from pydantic import BaseModel, RootModel
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from edge_server.api.http.dependencies import serve_on_get
from edge_server.api.http.errors import APIError
from edge_server.api.http.guards.auth import role_of, tenant_of
from edge_server.catalogue.default_model import DEFAULT_ALIAS
from edge_server.engine import Engine
from edge_server.engine.sched.slot_view import SlotView


class SlotProgress(BaseModel):
    has_next_token: bool
    has_new_line: bool = False
    n_remain: int  # -1: idle
    n_decoded: int


class SlotState(BaseModel):
    """One slot in llama-server's shape (its `id_task`, `prompt` and sampler params are
    left out: this server keeps no task ids, and prompts belong to their callers)."""

    id: int
    n_ctx: int
    speculative: bool
    is_processing: bool
    n_cached_tokens: int
    n_prompt_tokens: int
    params: dict[str, int]
    next_token: SlotProgress


class SlotList(RootModel[list[SlotState]]):
    pass


def slot_state(view: SlotView) -> SlotState:
    return SlotState(
        id=view.id, n_ctx=view.n_ctx, speculative=view.speculative, is_processing=view.busy,
        n_cached_tokens=view.cached_tokens, n_prompt_tokens=view.prompt_tokens,
        params={"n_predict": view.max_tokens} if view.busy else {},
        next_token=SlotProgress(
            has_next_token=view.busy,
            n_remain=max(view.max_tokens - view.decoded, 0) if view.busy else -1,
            n_decoded=view.decoded))


async def slots(request: Request) -> Response:
    if not request.app.state.slots_enabled:
        raise APIError(501, "This server does not serve the slots endpoint. Start it with "
                       "`--slots`", type="not_supported_error", code="not_supported")
    fail_on_no_slot = request.query_params.get("fail_on_no_slot", "") in ("1", "true")

    own = tenant_of(request) if role_of(request) == "user" else None

    async def serve(engine: Engine) -> Response:
        views = engine.slots()
        if fail_on_no_slot and all(view.busy for view in views):
            raise APIError(503, "no slot available", type="unavailable_error",
                           code="no_slot_available")
        if own is not None:
            views = [v if v.partition == own else v.anonymised() for v in views]
        return JSONResponse(SlotList([slot_state(view) for view in views]).model_dump())

    return await serve_on_get(request, request.query_params.get("model", DEFAULT_ALIAS), serve)


routes = [Route("/slots", slots, methods=["GET"])]
