"""HTTP routes of /v1/rerank and /v1/reranking (llama-server's alias); app.py also serves
both without /v1."""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from edge_server.api.http.dependencies import parse_body, serve_with_model
from edge_server.api.llama_server.rerank.protocol import RerankRequest
from edge_server.api.llama_server.rerank.serving import RerankServing

_serving = RerankServing()


async def create_rerank(request: Request) -> Response:
    body = await parse_body(request, RerankRequest)
    return await serve_with_model(
        request, body.model, lambda engine: _serving.create(body, engine, request)
    )


routes = [Route(path, create_rerank, methods=["POST"])
          for path in ("/v1/rerank", "/v1/reranking")]
