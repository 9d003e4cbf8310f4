"""HTTP route of llama-server's native POST /completion."""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from edge_server.api.common.image_input.image_fetch import serve_body
from edge_server.api.llama_server.completion.protocol import NativeCompletionRequest
from edge_server.api.llama_server.completion.serving import NativeServing

_serving = NativeServing()


async def create_native_completion(request: Request) -> Response:
    return await serve_body(request, NativeCompletionRequest,
                            lambda body, engine: _serving.create(body, engine, request))


routes = [Route("/completion", create_native_completion, methods=["POST"])]
