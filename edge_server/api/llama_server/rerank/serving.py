"""POST /v1/rerank: a query and documents in, the documents' relevance scores out, best
first.

Each (query, document) pair is one sequence laid out as the reranker reads it
(engine/embeddings/rerank.py) and scored in the embedding context, batched with the pairs
of concurrent requests (engine/embeddings/embedder.py). Everything is checked here
before the engine sees it: the document list, top_n, each text's size before it is
tokenized, each pair's tokens against the context, and the request's total.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from edge_server.api.common.bounds.prompt_bounds import too_long
from edge_server.api.common.job_wait import await_job
from edge_server.api.http.dependencies import off_loop
from edge_server.api.http.errors import APIError, from_engine_error, invalid
from edge_server.api.llama_server.rerank.protocol import (
    RerankRequest,
    RerankResponse,
    RerankResult,
    TeiRank,
    TextDocument,
)
from edge_server.engine import Engine, EngineError
from edge_server.engine.embeddings.embedder import EmbeddingJob, EmbeddingsUnsupported

# Tokens of one request, all pairs together (as the embeddings endpoint's limit): bounds
# the work one request may queue.
MAX_REQUEST_TOKENS = 300_000


@dataclass
class PreparedRerank:
    pairs: list[list[int]]
    tokens: int


def _check_fields(req: RerankRequest) -> None:
    if req.documents is None and req.texts is None:
        raise invalid("documents", "`documents` is required: the texts to rank "
                                   "against `query`", code="missing_required_parameter")
    if req.documents is not None and req.texts is not None:
        raise invalid("texts", "send `documents` or TEI's `texts`, not both")
    n = len(req.document_texts)
    if req.top_n is not None and req.top_n > n:
        raise invalid("top_n", f"`top_n` is {req.top_n}; there are only {n} documents")


def _pairs(req: RerankRequest, engine: Engine, n_ctx: int) -> PreparedRerank:
    layout = engine.pair_layout()
    most_bytes = n_ctx * engine.max_token_bytes  # more than any text that fits n_ctx

    def tokens_of(param: str, text: str) -> list[int]:
        # Sizes first: text that cannot fit is refused before it is tokenized.
        if len(text) > most_bytes or len(text.encode("utf-8", "surrogatepass")) > most_bytes:
            raise too_long(param, f"`{param}` is longer than any text that fits the "
                                   f"reranker's context of {n_ctx} tokens")
        return layout.tokenize(text)

    query = tokens_of("query", req.query)
    if len(layout.pair(query, [])) >= n_ctx:
        raise too_long("query", f"`query` leaves no room for a document in the "
                                 f"reranker's context of {n_ctx} tokens")
    pairs: list[list[int]] = []
    total = 0
    for i, text in enumerate(req.document_texts):
        param = f"{req.documents_param}[{i}]"
        pair = layout.pair(query, tokens_of(param, text))
        if not pair:
            raise invalid(param, f"`{param}` and `query` make an empty sequence")
        if len(pair) > n_ctx:
            raise too_long(param, f"`{param}` with `query` is {len(pair)} tokens; this "
                                   f"reranker scores at most {n_ctx} tokens per pair")
        total += len(pair)
        if total > MAX_REQUEST_TOKENS:
            raise too_long(req.documents_param, f"the pairs hold more than "
                            f"{MAX_REQUEST_TOKENS} tokens together; split the documents "
                            "over several requests")
        pairs.append(pair)
    return PreparedRerank(pairs, total)


def prepare(req: RerankRequest, engine: Engine) -> tuple[PreparedRerank, EmbeddingJob]:
    """Checks, lays out and queues the pairs. CPU-bound (the tokenizer; the context is
    created by the model's first request), so it runs off the event loop."""
    _check_fields(req)
    try:
        plan = engine.rerank_plan()
        prepared = _pairs(req, engine, plan.n_ctx)
        job = engine.embedder().submit(prepared.pairs)
    except EmbeddingsUnsupported as exc:
        raise APIError(400, str(exc), param="model", code=exc.code) from exc
    except EngineError as exc:
        raise from_engine_error(exc) from exc
    return prepared, job


def ranked(req: RerankRequest, scores: list[float]) -> list[int]:
    """Document indices best first (ties in request order), cut to top_n."""
    order = sorted(range(len(scores)), key=lambda i: -scores[i])
    return order[: req.top_n or len(order)]


def _answer(req: RerankRequest, model_id: str, scores: list[float], tokens: int) -> Response:
    texts = req.document_texts
    order = ranked(req, scores)
    if req.tei:
        tei = [TeiRank(index=i, score=scores[i], text=texts[i] if req.return_text else None)
               for i in order]
        return JSONResponse([r.model_dump(exclude_none=True) for r in tei])
    body = RerankResponse(
        id=f"rerank-{uuid.uuid4().hex}",
        model=model_id,
        results=[RerankResult(index=i, relevance_score=scores[i],
                              document=TextDocument(text=texts[i])
                              if req.return_documents else None)
                 for i in order],
        usage={"prompt_tokens": tokens, "total_tokens": tokens},  # type: ignore[arg-type]
    )
    return JSONResponse(body.model_dump(exclude_none=True))


class RerankServing:
    async def create(self, req: RerankRequest, engine: Engine, http: Request) -> Response:
        prepared, job = await off_loop(prepare, req, engine)
        outputs = await await_job(job.future, http)
        # Each pair's first classifier output is its score, as llama-server reads it.
        scores = [float(v[0]) for v in outputs]
        return _answer(req, engine.model_id, scores, prepared.tokens)
