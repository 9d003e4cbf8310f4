"""HTTP route of /v1/completions."""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from ..dependencies import engine_for, parse_body
from .protocol import CompletionRequest
from .serving import CompletionsServing

_serving = CompletionsServing()


async def create_completion(request: Request) -> Response:
    body = await parse_body(request, CompletionRequest)
    return await _serving.create(body, engine_for(request, body.model), request)


routes = [Route("/v1/completions", create_completion, methods=["POST"])]
