"""POST /api/embed and the legacy /api/embeddings, over the embeddings door: the same
tokenizing, checks, batching and pooling; vectors are L2-normalized, as Ollama's are."""

from __future__ import annotations

from typing import Any

from pydantic import ValidationError
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from ...engine import Engine
from ..embeddings.protocol import EmbeddingRequest
from ..embeddings.serving import embed
from ..http.errors import APIError, from_validation_error, invalid
from .protocol import EmbeddingsRequest, EmbedRequest
from .streaming import Clock


def check_options(options: dict[str, Any] | None) -> None:
    """Sampling options mean nothing to an embedding: refused by name, not ignored."""
    for name, value in (options or {}).items():
        if value is not None:
            raise invalid(f"options.{name}", f"`options.{name}` does not apply to embeddings")


def _request(model: str, inputs: str | list[str], dimensions: int | None) -> EmbeddingRequest:
    try:
        return EmbeddingRequest.model_validate(
            {"model": model, "input": inputs, "dimensions": dimensions})
    except ValidationError as exc:
        raise from_validation_error(exc) from exc


class EmbedServing:
    async def embed(self, req: EmbedRequest, engine: Engine, http: Request,
                    clock: Clock) -> Response:
        check_options(req.options)
        if req.input == [] or req.input == "":
            return JSONResponse({"model": req.model, "embeddings": []})
        clock.mark_submitted()
        prepared, vectors = await embed(_request(req.model, req.input, req.dimensions),
                                        engine, http, truncate=req.truncate is not False)
        durations = clock.durations_embedding(prepared.tokens)
        return JSONResponse({"model": req.model,
                             "embeddings": [v.tolist() for v in vectors], **durations})

    async def embeddings(self, req: EmbeddingsRequest, engine: Engine, http: Request
                         ) -> Response:
        check_options(req.options)
        if not req.prompt:
            return JSONResponse({"embedding": []})  # as Ollama answers an empty prompt
        try:
            _, vectors = await embed(_request(req.model, req.prompt, None), engine, http,
                                     truncate=True)
        except APIError as exc:
            if exc.param == "input":
                exc.param = "prompt"
            raise
        return JSONResponse({"embedding": vectors[0].tolist()})
