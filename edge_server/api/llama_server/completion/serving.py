"""POST /completion: llama-server's native completion API on the engine of
/v1/completions (the same prompts, grammars, limits and drafting), answered in
llama-server's shape: `content` with its counts, `stop_type`, `stopping_word` and
`timings`; one object per prompt and choice (an array when there are several). Streams
are `data: {…}` events, a partial one per piece of text and a whole result last, with
no closing `[DONE]`, as llama-server sends them."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from edge_server.api.common.bounds.response_bounds import AnswerShape, check_answer_size
from edge_server.api.common.llama_format import sampler_json, timings_json
from edge_server.api.common.serving import cancel_on_disconnect, submit_all, wait_started
from edge_server.api.common.sse import (
    merged_events,
    progress_json,
    sse_event,
    sse_response,
    sse_with_errors,
)
from edge_server.api.http.dependencies import off_loop
from edge_server.api.http.errors import unsupported
from edge_server.api.llama_server.completion.protocol import NativeCompletionRequest, NativeResult
from edge_server.api.openai.completions.serving import PreparedCompletion, prepare
from edge_server.engine import ChoiceDelta, Engine, GenerationRequest
from edge_server.engine.request import PromptProgress, RequestHandle
from edge_server.engine.sampling.logprobs import TokenLogprob


@dataclass
class _Choice:
    """One prompt's one choice, as its deltas arrive."""

    index: int
    prompt_text: str
    request: GenerationRequest
    handle: RequestHandle
    submitted_at: float
    parts: list[str] = field(default_factory=list)
    tokens: list[int] = field(default_factory=list)
    scored: list[TokenLogprob] = field(default_factory=list)  # with n_probs
    first_at: float | None = None
    stop_type: str = "none"
    stop_word: str = ""

    def take(self, delta: ChoiceDelta) -> None:
        now = time.monotonic()
        if self.first_at is None:
            self.first_at = now
        self.parts.append(delta.text)
        self.tokens.extend(delta.token_ids)
        self.scored.extend(delta.logprobs or [])
        if delta.finish_reason == "length":
            self.stop_type = "limit"
        elif delta.finish_reason == "stop":
            self.stop_type, self.stop_word = ("word" if delta.stop_word else "eos",
                                              delta.stop_word)

    def result(self, engine: Engine, content: str, tokens: list[int],
               scored: list[TokenLogprob] | None) -> dict[str, Any]:
        """The whole result (its content, tokens and scores given: all of them, or a
        stream's last piece)."""
        now = time.monotonic()
        first = self.first_at or now
        usage, prompt_tokens = self.handle.usage, len(self.request.prompt_tokens)
        settings = {"n_ctx": engine.n_ctx, "n_predict": self.request.max_tokens,
                    "stop": self.request.stop, **sampler_json(self.request.sampling)}
        return NativeResult(
            index=self.index, content=content, tokens=tokens, model=engine.model_id,
            tokens_predicted=len(self.tokens), tokens_evaluated=prompt_tokens,
            generation_settings=settings, prompt=self.prompt_text,
            has_new_line="\n" in "".join(self.parts), stop_type=self.stop_type,
            stopping_word=self.stop_word, tokens_cached=usage.cached_tokens,
            timings=timings_json(cached=usage.cached_tokens, prompt=prompt_tokens,
                                 prompt_s=first - self.submitted_at,
                                 predicted=len(self.tokens), predicted_s=now - first,
                                 drafted=usage.drafted, draft_accepted=usage.draft_accepted),
            completion_probabilities=None if scored is None else probabilities(scored, engine),
        ).model_dump(exclude_none=True)


def _check_fields(req: NativeCompletionRequest) -> None:
    """OpenAI's completion fields that have no place in this shape."""
    for name, given in (("best_of", req.best_of is not None), ("echo", bool(req.echo)),
                        ("logprobs", req.logprobs is not None)):
        if given:
            raise unsupported(name, "is not served on /completion; use /v1/completions")


def _prepare(req: NativeCompletionRequest, engine: Engine) -> PreparedCompletion:
    _check_fields(req)
    prepared = prepare(req, engine)
    if req.n_probs:
        for request in prepared.requests:
            request.logprobs = req.n_probs
        check_answer_size(AnswerShape(
            prompts=len(prepared.requests), choices=req.n or 1, echoed_tokens=0,
            echoed_bytes=0, max_tokens=max(r.max_tokens for r in prepared.requests),
            alternatives=req.n_probs), engine.max_token_bytes, logprobs_param="n_probs")
    return prepared


def _token(token: int, engine: Engine) -> dict[str, Any]:
    piece = engine.vocab.pieces[token]
    return {"id": token, "token": piece.decode("utf-8", errors="replace"),
            "bytes": list(piece)}


def probabilities(scored: list[TokenLogprob], engine: Engine) -> list[dict[str, Any]]:
    """llama-server's completion_probabilities: each token's logprob and the likeliest
    tokens in its place, before sampling (its post_sampling_probs false)."""
    return [{**_token(entry.token, engine), "logprob": entry.logprob,
             "top_logprobs": [{**_token(t, engine), "logprob": lp} for t, lp in entry.top]}
            for entry in scored]


class NativeServing:
    async def create(self, req: NativeCompletionRequest, engine: Engine,
                     http: Request) -> Response:
        prepared = await off_loop(_prepare, req, engine)
        n = req.n or 1
        submitted_at = time.monotonic()
        handles = submit_all(engine, prepared.requests, http)
        choices = [
            [_Choice(p * n + c, prompt.text, request, handle, submitted_at) for c in range(n)]
            for p, (prompt, request, handle) in enumerate(
                zip(prepared.prompts, prepared.requests, handles, strict=True))
        ]
        if req.stream:
            await wait_started(http, handles)
            events = self._stream(req, engine, http, handles, choices)
            return sse_response(sse_with_errors(events), handles)
        async with cancel_on_disconnect(http, handles):
            async for p_index, event in merged_events(handles):
                if isinstance(event, ChoiceDelta):
                    choices[p_index][event.index].take(event)
        results = [
            choice.result(engine, "".join(choice.parts),
                          choice.tokens if req.return_tokens else [],
                          choice.scored if req.n_probs else None)
            for per_prompt in choices for choice in per_prompt
        ]
        return JSONResponse(results[0] if len(results) == 1 else results)

    async def _stream(self, req: NativeCompletionRequest, engine: Engine, http: Request,
                      handles: list[RequestHandle], choices: list[list[_Choice]]
                      ) -> AsyncIterator[str]:
        async with cancel_on_disconnect(http, handles):
            async for p_index, event in merged_events(handles):
                if isinstance(event, PromptProgress):  # only with return_progress
                    first = choices[p_index][0]
                    yield sse_event({**_partial(first, "", []),
                                     "prompt_progress": progress_json(event)})
                    continue
                choice = choices[p_index][event.index]
                choice.take(event)
                tokens = event.token_ids if req.return_tokens else []
                scored = (event.logprobs or []) if req.n_probs else None
                if event.finish_reason is None:
                    partial = _partial(choice, event.text, tokens)
                    if scored is not None:
                        partial["completion_probabilities"] = probabilities(scored, engine)
                    yield sse_event(partial)
                else:
                    yield sse_event(choice.result(engine, event.text, tokens, scored))


def _partial(choice: _Choice, content: str, tokens: list[int]) -> dict[str, Any]:
    return {"index": choice.index, "content": content, "tokens": tokens, "stop": False,
            "id_slot": -1, "tokens_predicted": len(choice.tokens),
            "tokens_evaluated": len(choice.request.prompt_tokens)}
