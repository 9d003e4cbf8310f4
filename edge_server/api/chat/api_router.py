"""HTTP route of /v1/chat/completions."""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from ..common.image_fetch import with_image_urls
from ..http.dependencies import parse_body, serve_with_model
from .protocol import ChatCompletionRequest
from .serving import ChatServing

_serving = ChatServing()


async def create_chat_completion(request: Request) -> Response:
    body = await parse_body(request, ChatCompletionRequest)
    return await serve_with_model(
        request, body.model, lambda engine: with_image_urls(
            body, engine, lambda: _serving.create(body, engine, request))
    )


routes = [Route("/v1/chat/completions", create_chat_completion, methods=["POST"])]
