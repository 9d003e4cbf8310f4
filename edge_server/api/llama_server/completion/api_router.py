"""HTTP route of llama-server's native POST /completion."""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from edge_server.api.common.image_input.image_fetch import fetch_image_urls, fetched_images
from edge_server.api.http.dependencies import leased_model, parse_body
from edge_server.api.llama_server.completion.protocol import NativeCompletionRequest
from edge_server.api.llama_server.completion.serving import NativeServing

_serving = NativeServing()


async def create_native_completion(request: Request) -> Response:
    body = await parse_body(request, NativeCompletionRequest)
    async with leased_model(request, body.model) as lease:
        with fetched_images(await fetch_image_urls(body, lease.engine)):
            answer = await _serving.create(body, lease.engine, request)
        return lease.answer(answer)


routes = [Route("/completion", create_native_completion, methods=["POST"])]
