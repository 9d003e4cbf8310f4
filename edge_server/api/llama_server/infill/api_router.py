"""HTTP route of /infill (llama-server's path, as its editor plugins call it)."""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from edge_server.api.http.dependencies import parse_body, serve_with_model
from edge_server.api.llama_server.infill.protocol import InfillRequest
from edge_server.api.llama_server.infill.serving import InfillServing

_serving = InfillServing()


async def create_infill(request: Request) -> Response:
    body = await parse_body(request, InfillRequest)
    return await serve_with_model(
        request, body.model, lambda engine: _serving.create(body, engine, request)
    )


routes = [Route("/infill", create_infill, methods=["POST"])]
