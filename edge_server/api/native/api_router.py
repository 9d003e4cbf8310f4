"""HTTP route of llama-server's native POST /completion."""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from ..common.image_fetch import with_image_urls
from ..http.dependencies import parse_body, serve_with_model
from .protocol import NativeCompletionRequest
from .serving import NativeServing

_serving = NativeServing()


async def create_native_completion(request: Request) -> Response:
    body = await parse_body(request, NativeCompletionRequest)
    return await serve_with_model(
        request, body.model, lambda engine: with_image_urls(
            body, engine, lambda: _serving.create(body, engine, request))
    )


routes = [Route("/completion", create_native_completion, methods=["POST"])]
