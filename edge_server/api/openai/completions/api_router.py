"""HTTP route of /v1/completions."""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from edge_server.api.common.image_input.image_fetch import serve_body
from edge_server.api.openai.completions.protocol import CompletionRequest
from edge_server.api.openai.completions.serving import CompletionsServing

_serving = CompletionsServing()


async def create_completion(request: Request) -> Response:
    return await serve_body(request, CompletionRequest,
                            lambda body, engine: _serving.create(body, engine, request))


routes = [Route("/v1/completions", create_completion, methods=["POST"])]
