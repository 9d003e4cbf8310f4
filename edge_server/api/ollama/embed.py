"""POST /api/embed and the legacy /api/embeddings, over the embeddings door: the same
tokenizing, checks, batching and pooling; vectors are L2-normalized, as Ollama's are.
`options` are checked as generation's are; `num_ctx` bounds each input's tokens (cut to
it, or refused when `truncate` is false), the sampling ones mean nothing here."""

from __future__ import annotations

from pydantic import ValidationError
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from edge_server.api.http.errors import APIError, from_validation_error
from edge_server.api.ollama import options as opts
from edge_server.api.ollama.protocol import EmbeddingsRequest, EmbedRequest
from edge_server.api.ollama.streaming import Clock
from edge_server.api.openai.embeddings.protocol import EmbeddingRequest
from edge_server.api.openai.embeddings.serving import embed
from edge_server.engine import Engine


def _request(model: str, inputs: str | list[str], dimensions: int | None) -> EmbeddingRequest:
    try:
        return EmbeddingRequest.model_validate(
            {"model": model, "input": inputs, "dimensions": dimensions})
    except ValidationError as exc:
        raise from_validation_error(exc) from exc


class EmbedServing:
    async def embed(self, req: EmbedRequest, engine: Engine, http: Request,
                    clock: Clock) -> Response:
        num_ctx = opts.check(req.options)
        if req.input == [] or req.input == "":
            return JSONResponse({"model": req.model, "embeddings": []})
        clock.mark_submitted()
        prepared, vectors = await embed(_request(req.model, req.input, req.dimensions),
                                        engine, http, truncate=req.truncate is not False,
                                        max_tokens=num_ctx)
        durations = clock.durations_embedding(prepared.tokens)
        return JSONResponse({"model": req.model,
                             "embeddings": [v.tolist() for v in vectors], **durations})

    async def embeddings(self, req: EmbeddingsRequest, engine: Engine, http: Request
                         ) -> Response:
        num_ctx = opts.check(req.options)
        if not req.prompt:
            return JSONResponse({"embedding": []})  # as Ollama answers an empty prompt
        try:
            _, vectors = await embed(_request(req.model, req.prompt, None), engine, http,
                                     truncate=True, max_tokens=num_ctx)
        except APIError as exc:
            if exc.param == "input":
                exc.param = "prompt"
            raise
        return JSONResponse({"embedding": vectors[0].tolist()})
