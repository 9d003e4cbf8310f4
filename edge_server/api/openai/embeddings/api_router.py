"""HTTP route of /v1/embeddings."""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from edge_server.api.http.dependencies import parse_body, serve_with_model
from edge_server.api.openai.embeddings.protocol import EmbeddingRequest
from edge_server.api.openai.embeddings.serving import EmbeddingsServing

_serving = EmbeddingsServing()


async def create_embedding(request: Request) -> Response:
    body = await parse_body(request, EmbeddingRequest)
    return await serve_with_model(
        request, body.model, lambda engine: _serving.create(body, engine, request)
    )


routes = [Route("/v1/embeddings", create_embedding, methods=["POST"])]
