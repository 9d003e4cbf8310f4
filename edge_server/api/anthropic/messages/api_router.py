"""HTTP routes of /v1/messages and /v1/messages/count_tokens."""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from edge_server.api.anthropic.messages.protocol import CountTokensRequest, MessagesRequest
from edge_server.api.anthropic.messages.serving import MessagesServing
from edge_server.api.common.image_input.image_fetch import fetch_image_urls, fetched_images
from edge_server.api.http.dependencies import leased_model, parse_body

_serving = MessagesServing()


async def create_message(request: Request) -> Response:
    body = await parse_body(request, MessagesRequest)
    async with leased_model(request, body.model) as lease:
        with fetched_images(await fetch_image_urls(body, lease.engine)):
            answer = await _serving.create(body, lease.engine, request)
        return lease.answer(answer)


async def count_tokens(request: Request) -> Response:
    body = await parse_body(request, CountTokensRequest)
    async with leased_model(request, body.model) as lease:
        with fetched_images(await fetch_image_urls(body, lease.engine)):
            answer = await _serving.count_tokens(body, lease.engine)
        return lease.answer(answer)


routes = [
    Route("/v1/messages", create_message, methods=["POST"]),
    Route("/v1/messages/count_tokens", count_tokens, methods=["POST"]),
]
