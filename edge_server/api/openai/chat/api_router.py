"""HTTP route of /v1/chat/completions."""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from edge_server.api.common.image_input.image_fetch import serve_body
from edge_server.api.openai.chat.protocol import ChatCompletionRequest
from edge_server.api.openai.chat.serving import ChatServing

_serving = ChatServing()


async def create_chat_completion(request: Request) -> Response:
    return await serve_body(request, ChatCompletionRequest,
                            lambda body, engine: _serving.create(body, engine, request))


routes = [Route("/v1/chat/completions", create_chat_completion, methods=["POST"])]
