"""HTTP routes of /v1/messages and /v1/messages/count_tokens."""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from edge_server.api.anthropic.messages.protocol import CountTokensRequest, MessagesRequest
from edge_server.api.anthropic.messages.serving import MessagesServing
from edge_server.api.common.image_input.image_fetch import serve_body

_serving = MessagesServing()


async def create_message(request: Request) -> Response:
    return await serve_body(request, MessagesRequest,
                            lambda body, engine: _serving.create(body, engine, request))


async def count_tokens(request: Request) -> Response:
    return await serve_body(request, CountTokensRequest, _serving.count_tokens)


routes = [
    Route("/v1/messages", create_message, methods=["POST"]),
    Route("/v1/messages/count_tokens", count_tokens, methods=["POST"]),
]
