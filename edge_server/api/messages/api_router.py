"""HTTP routes of /v1/messages and /v1/messages/count_tokens."""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from ..common.image_fetch import with_image_urls
from ..http.dependencies import parse_body, serve_with_model
from .protocol import CountTokensRequest, MessagesRequest
from .serving import MessagesServing

_serving = MessagesServing()


async def create_message(request: Request) -> Response:
    body = await parse_body(request, MessagesRequest)
    return await serve_with_model(
        request, body.model, lambda engine: with_image_urls(
            body, engine, lambda: _serving.create(body, engine, request))
    )


async def count_tokens(request: Request) -> Response:
    body = await parse_body(request, CountTokensRequest)
    return await serve_with_model(
        request, body.model, lambda engine: with_image_urls(
            body, engine, lambda: _serving.count_tokens(body, engine))
    )


routes = [
    Route("/v1/messages", create_message, methods=["POST"]),
    Route("/v1/messages/count_tokens", count_tokens, methods=["POST"]),
]
