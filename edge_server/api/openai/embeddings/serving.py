"""POST /v1/embeddings: texts or token lists in, one L2-normalized vector per input out.

Everything is checked here before the engine sees it: input count, empty inputs, token
ids within the vocabulary, each input's tokens against the embedding context, and the
request's total. The engine (engine/embeddings/embedder.py) batches the inputs of concurrent
requests together.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from starlette.requests import Request
from starlette.responses import Response

from edge_server.api.common.bounds.model_bounds import ModelBounds
from edge_server.api.common.bounds.prompt_bounds import too_long
from edge_server.api.common.job_wait import await_job
from edge_server.api.http.dependencies import off_loop
from edge_server.api.http.errors import APIError, from_engine_error, invalid, unsupported
from edge_server.api.openai.embeddings.protocol import EmbeddingRequest
from edge_server.engine import Engine, EngineError
from edge_server.engine.embeddings.embedder import (
    EmbeddingJob,
    EmbeddingPlan,
    EmbeddingsUnsupported,
)

# Tokens of one request, all inputs together (OpenAI's limit): bounds the work one
# request may queue.
MAX_REQUEST_TOKENS = 300_000


@dataclass
class PreparedEmbedding:
    inputs: list[list[int]]
    tokens: int


def _check_fields(req: EmbeddingRequest, plan: EmbeddingPlan) -> None:
    if req.dimensions is not None and req.dimensions != plan.n_embd:
        raise unsupported(
            "dimensions",
            f"must be this model's own width, {plan.n_embd}: shortened embeddings are "
            "not supported (omit `dimensions`)",
        )


def _tokenized(req: EmbeddingRequest, engine: Engine, plan: EmbeddingPlan,
               truncate: bool, max_tokens: int | None) -> PreparedEmbedding:
    items: Sequence[str | list[int]] = req.inputs
    single = req.single
    limit = plan.n_ctx if max_tokens is None else min(plan.n_ctx, max_tokens)
    inputs: list[list[int]] = []
    total = 0
    for i, item in enumerate(items):
        param = "input" if single else f"input[{i}]"
        if not item:
            raise invalid(param, f"`{param}` is empty; every input needs at least one token")
        if isinstance(item, str):
            # Sizes first: text that cannot fit is refused before it is tokenized.
            most = limit * engine.max_token_bytes
            if truncate:
                item = item[:most]  # more characters cannot fit: cut before tokenizing
            if len(item) > most or len(item.encode("utf-8", errors="surrogatepass")) > most:
                raise too_long(param, f"`{param}` is longer than any text that fits the "
                                       f"embedding context of {limit} tokens")
            # Caller text is data: control-token text in it is read as plain text.
            tokens = engine.vocab.tokenize(item, add_special=True, parse_special=False)
        else:
            if truncate:
                item = item[:limit]
            if len(item) > limit:
                raise too_long(param, f"`{param}` is {len(item)} tokens; this model embeds "
                                       f"at most {limit} tokens per input")
            ModelBounds.of(engine).check_vocabulary(item, param)
            tokens = item
        if truncate:
            tokens = tokens[:limit]
        if len(tokens) > limit:
            raise too_long(param, f"`{param}` is {len(tokens)} tokens; this model embeds "
                                   f"at most {limit} tokens per input")
        total += len(tokens)
        if total > MAX_REQUEST_TOKENS:
            raise too_long("input", f"the inputs hold more than {MAX_REQUEST_TOKENS} "
                                     "tokens together; split them over several requests")
        inputs.append(tokens)
    return PreparedEmbedding(inputs, total)


def prepare(req: EmbeddingRequest, engine: Engine, truncate: bool = False,
            max_tokens: int | None = None) -> tuple[PreparedEmbedding, EmbeddingJob]:
    """Checks, tokenizes and queues the inputs. CPU-bound (the tokenizer; the embedding
    context is created by the model's first request), so it runs off the event loop.
    `truncate`: inputs longer than the embedding context are cut to it (Ollama's
    default), rather than refused. `max_tokens`: a tighter bound per input than the
    embedding context (Ollama's `num_ctx`)."""
    try:
        plan = engine.embedding_plan()
        _check_fields(req, plan)
        prepared = _tokenized(req, engine, plan, truncate, max_tokens)
        job = engine.embedder().submit(prepared.inputs)
    except EmbeddingsUnsupported as exc:
        raise APIError(400, str(exc), param="model", code=exc.code) from exc
    except EngineError as exc:
        raise from_engine_error(exc) from exc
    return prepared, job


def _render(req: EmbeddingRequest, model_id: str, vectors: list[np.ndarray],
            tokens: int) -> bytes:
    """The response body; tens of megabytes for a large request, so built off the loop."""
    if req.encoding_format == "base64":
        # OpenAI's base64: the vector's float32 values, little-endian.
        values: list[object] = [
            base64.b64encode(v.astype("<f4").tobytes()).decode("ascii") for v in vectors]
    else:
        values = [v.tolist() for v in vectors]
    body = {
        "object": "list",
        "data": [{"object": "embedding", "index": i, "embedding": value}
                 for i, value in enumerate(values)],
        "model": model_id,
        "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
    }
    return json.dumps(body, separators=(",", ":")).encode()


class EmbeddingsServing:
    async def create(self, req: EmbeddingRequest, engine: Engine, http: Request) -> Response:
        prepared, vectors = await embed(req, engine, http)
        body = await off_loop(_render, req, engine.model_id, vectors, prepared.tokens)
        return Response(body, media_type="application/json")


async def embed(req: EmbeddingRequest, engine: Engine, http: Request, *, truncate: bool = False,
                max_tokens: int | None = None) -> tuple[PreparedEmbedding, list[np.ndarray]]:
    """The inputs' vectors, in order; the work is dropped if the client leaves."""
    prepared, job = await off_loop(prepare, req, engine, truncate, max_tokens)
    return prepared, await await_job(job.future, http)
