"""HTTP route of /v1/completions."""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from ..common.image_fetch import with_image_urls
from ..http.dependencies import parse_body, serve_with_model
from .protocol import CompletionRequest
from .serving import CompletionsServing

_serving = CompletionsServing()


async def create_completion(request: Request) -> Response:
    body = await parse_body(request, CompletionRequest)
    return await serve_with_model(
        request, body.model, lambda engine: with_image_urls(
            body, engine, lambda: _serving.create(body, engine, request))
    )


routes = [Route("/v1/completions", create_completion, methods=["POST"])]
