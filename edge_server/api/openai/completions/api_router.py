"""HTTP route of /v1/completions."""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from edge_server.api.common.image_input.image_fetch import fetch_image_urls, fetched_images
from edge_server.api.http.dependencies import leased_model, parse_body
from edge_server.api.openai.completions.protocol import CompletionRequest
from edge_server.api.openai.completions.serving import CompletionsServing

_serving = CompletionsServing()


async def create_completion(request: Request) -> Response:
    body = await parse_body(request, CompletionRequest)
    async with leased_model(request, body.model) as lease:
        with fetched_images(await fetch_image_urls(body, lease.engine)):
            answer = await _serving.create(body, lease.engine, request)
        return lease.answer(answer)


routes = [Route("/v1/completions", create_completion, methods=["POST"])]
