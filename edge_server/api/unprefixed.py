"""The OpenAI routes also without their /v1 prefix, as llama-server serves them: a client
configured with llama-server's base URL (`http://host:8080`, no `/v1`) works as is."""

from __future__ import annotations

from collections.abc import Sequence

from starlette.routing import BaseRoute, Route

# Paths as the routers declare them; each is served a second time without "/v1".
UNPREFIXED_PATHS = (
    "/v1/chat/completions",
    "/v1/completions",
    "/v1/embeddings",
    "/v1/rerank",
    "/v1/reranking",
    "/v1/models",
    "/v1/models/{model:path}",
)


def without_v1(path: str) -> str:
    return path.removeprefix("/v1")


def unprefixed_routes(routes: Sequence[BaseRoute]) -> list[Route]:
    """Copies of the routes on UNPREFIXED_PATHS at their llama-server paths."""
    return [Route(without_v1(r.path), r.endpoint, methods=list(r.methods or ()))
            for r in routes if isinstance(r, Route) and r.path in UNPREFIXED_PATHS]
