"""HTTP route of /v1/chat/completions."""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from edge_server.api.common.image_input.image_fetch import fetch_image_urls, fetched_images
from edge_server.api.http.dependencies import leased_model, parse_body
from edge_server.api.openai.chat.protocol import ChatCompletionRequest
from edge_server.api.openai.chat.serving import ChatServing

_serving = ChatServing()


async def create_chat_completion(request: Request) -> Response:
    body = await parse_body(request, ChatCompletionRequest)
    async with leased_model(request, body.model) as lease:
        with fetched_images(await fetch_image_urls(body, lease.engine)):
            answer = await _serving.create(body, lease.engine, request)
        return lease.answer(answer)


routes = [Route("/v1/chat/completions", create_chat_completion, methods=["POST"])]
