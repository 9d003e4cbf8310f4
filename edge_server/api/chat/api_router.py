"""HTTP route of /v1/chat/completions."""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from edge_server.api.chat.protocol import ChatCompletionRequest
from edge_server.api.chat.serving import ChatServing
from edge_server.api.common.image_fetch import serve_body

_serving = ChatServing()


async def create_chat_completion(request: Request) -> Response:
    return await serve_body(request, ChatCompletionRequest,
                            lambda body, engine: _serving.create(body, engine, request))


routes = [Route("/v1/chat/completions", create_chat_completion, methods=["POST"])]
