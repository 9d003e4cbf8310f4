"""HTTP route of /v1/completions."""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from ..common.image_fetch import serve_body
from .protocol import CompletionRequest
from .serving import CompletionsServing

_serving = CompletionsServing()


async def create_completion(request: Request) -> Response:
    return await serve_body(request, CompletionRequest,
                            lambda body, engine: _serving.create(body, engine, request))


routes = [Route("/v1/completions", create_completion, methods=["POST"])]
