"""POST /v1/completions: prompts in, text completions out (whole or streamed)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from edge_server.api.common.bounds.model_bounds import ModelBounds
from edge_server.api.common.bounds.prompt_bounds import check_prompt_bytes
from edge_server.api.common.bounds.response_bounds import (
    OFF_LOOP_ENTRIES,
    AnswerShape,
    check_answer_size,
)
from edge_server.api.common.draft_stats import draft_stats
from edge_server.api.common.fim import fim_prompt, fim_tokens, text_tokens
from edge_server.api.common.image_input.images import (
    check_image_count,
    decode_image_url,
    image_errors,
)
from edge_server.api.common.logprobs_format import completion_logprobs
from edge_server.api.common.sampling_fields import (
    answer_ceiling_s,
    budgets,
    max_tokens_for,
    sampling_params,
)
from edge_server.api.common.serving import (
    ChoiceResult,
    cancel_on_disconnect,
    collect,
    new_id,
    now,
    submit_all,
    sum_usage,
    usage_info,
    wait_started,
)
from edge_server.api.common.sse import (
    SSE_DONE,
    merged_events,
    progress_json,
    sse_event,
    sse_response,
    sse_with_errors,
)
from edge_server.api.http.dependencies import off_loop
from edge_server.api.http.errors import invalid, unsupported
from edge_server.api.openai.completions.protocol import (
    CompletionChoice,
    CompletionLogprobs,
    CompletionRequest,
    CompletionResponse,
)
from edge_server.engine import Engine, GenerationRequest
from edge_server.engine.request import ImageSpan, PromptProgress, RequestHandle
from edge_server.engine.sampling.logprobs import TokenLogprob

DEFAULT_MAX_TOKENS = 16
IMAGE_MARKER = "<image>"  # where each of `images` goes in the prompt (Fireworks' API)


@dataclass
class _Prompt:
    tokens: list[int]
    text: str  # what `echo` returns
    images: list[ImageSpan] = field(default_factory=list)


@dataclass
class PreparedCompletion:
    prompts: list[_Prompt]
    requests: list[GenerationRequest]  # one per prompt
    candidates: int  # choices generated per prompt (best_of ranks them down to n)


def _check_fields(req: CompletionRequest) -> None:
    n = req.n or 1
    if req.best_of is not None:
        if req.best_of < n:
            raise invalid("best_of", f"best_of ({req.best_of}) must be at least n ({n})")
        if req.stream and req.best_of > n:
            raise invalid("best_of", "best_of cannot be streamed")
    if req.suffix is not None and not isinstance(req.prompt, str):
        raise invalid("suffix", "suffix needs a single string prompt")


def _image_prompt(req: CompletionRequest, engine: Engine) -> _Prompt:
    """A string prompt with one `<image>` per entry of `images`."""
    if "image" not in engine.modalities:
        raise unsupported(
            "images", "needs a model with a multimodal projector; this one is text-only")
    limits = engine.settings.image_limits
    check_image_count(len(req.images or []), limits, "images")
    if not isinstance(req.prompt, str):
        raise invalid("prompt", "a prompt with images must be one string")
    for name, given in (("suffix", req.suffix is not None), ("echo", bool(req.echo))):
        if given:
            raise invalid(name, f"{name} cannot be combined with images")
    check_prompt_bytes(req.prompt, engine, "prompt")
    texts = req.prompt.split(IMAGE_MARKER)
    if len(texts) - 1 != len(req.images or []):
        raise invalid("images", f"{len(req.images or [])} images for {len(texts) - 1} "
                      f"`{IMAGE_MARKER}` markers in the prompt; give one image per marker")
    images = [decode_image_url(url, limits, f"images[{k}]")
              for k, url in enumerate(req.images or [])]
    with image_errors("images"):
        prompt = engine.tokenize_images(texts, images)
    return _Prompt(prompt.tokens, req.prompt, prompt.images)


def _prompts(req: CompletionRequest, engine: Engine) -> list[_Prompt]:
    if req.images:
        return [_image_prompt(req, engine)]
    raw = req.prompt
    if isinstance(raw, str):
        items: list[str | list[int]] = [raw]
    elif raw and all(isinstance(t, int) for t in raw):
        items = [raw]  # type: ignore[list-item]
    else:
        items = list(raw)  # type: ignore[arg-type]
    if not items:
        raise invalid("prompt", "the prompt list is empty")
    prompts: list[_Prompt] = []
    for i, item in enumerate(items):
        param = "prompt" if len(items) == 1 else f"prompt[{i}]"
        # Sizes first: text that cannot fit is refused before it is tokenized.
        if isinstance(item, str):
            check_prompt_bytes(item + (req.suffix or ""), engine, param)
        else:
            ModelBounds.of(engine).check_token_ids(item, param)
        if isinstance(item, str) and req.suffix is not None:
            tokens = fill_in_the_middle(item, req.suffix, engine)
            text = item
        elif isinstance(item, str):
            # Raw prompts keep special-token parsing: their author writes the markup.
            tokens = engine.tokenize(item)
            text = item
        else:
            tokens = list(item)
            text = engine.vocab.detokenize(tokens)
        if not tokens:
            raise invalid(param, "the prompt is empty")
        prompts.append(_Prompt(tokens, text))
    return prompts


def fill_in_the_middle(prefix: str, suffix: str, engine: Engine) -> list[int]:
    """The FIM layout of POST /infill without extra context: the model writes the middle."""
    fim = fim_tokens(engine, "suffix")
    return fim_prompt(engine, fim, extra=[], prefix=text_tokens(engine, prefix),
                      suffix=text_tokens(engine, suffix))


def prepare(req: CompletionRequest, engine: Engine) -> PreparedCompletion:
    """Everything before the engine: checks, grammar, tokenized prompts. CPU-bound
    (tokenizer, schema conversion), so it runs off the event loop."""
    _check_fields(req)
    sampling = sampling_params(req, engine)
    prompts = _prompts(req, engine)
    n = req.n or 1
    candidates = max(n, req.best_of or 1)
    # best_of ranks candidates by mean token logprob, so it needs them scored.
    scored = req.logprobs if req.logprobs is not None else (0 if candidates > n else None)
    requests = [
        GenerationRequest(
            prompt_tokens=p.tokens,
            max_tokens=max_tokens_for(req, len(p.tokens), engine, DEFAULT_MAX_TOKENS),
            sampling=sampling,
            stop=req.stop_list,
            include_stop=bool(req.include_stop_str_in_output),
            n=candidates,
            logprobs=scored,
            prompt_logprobs=bool(req.echo and req.logprobs is not None),
            images=p.images,
            draft=req.draft is not False,
            max_answer_s=answer_ceiling_s(req, engine, DEFAULT_MAX_TOKENS),
            **budgets(req),
        )
        for p in prompts
    ]
    check_answer_size(_shape(req, prompts, requests, candidates), engine.max_token_bytes,
                      choices_param="best_of" if candidates > n else "n", echo=bool(req.echo))
    return PreparedCompletion(prompts, requests, candidates)


def _shape(req: CompletionRequest, prompts: list[_Prompt], requests: list[GenerationRequest],
           candidates: int) -> AnswerShape:
    echo = bool(req.echo)
    return AnswerShape(
        prompts=len(prompts), choices=candidates,
        echoed_tokens=sum(len(p.tokens) for p in prompts) if echo else 0,
        echoed_bytes=sum(len(p.text.encode("utf-8", "surrogatepass")) for p in prompts)
        if echo else 0,
        max_tokens=max(r.max_tokens for r in requests),
        alternatives=req.logprobs,
    )


class CompletionsServing:
    async def create(self, req: CompletionRequest, engine: Engine, http: Request) -> Response:
        prepared = await off_loop(prepare, req, engine)
        prompts, requests, candidates = prepared.prompts, prepared.requests, prepared.candidates
        n = req.n or 1
        handles = submit_all(engine, requests, http)
        # The served model's own id, whichever alias the client asked for (OpenAI too
        # answers with the resolved model name).
        meta: dict[str, Any] = {"id": new_id("cmpl"), "created": now(), "model": engine.model_id}
        if req.stream:
            await wait_started(http, handles)
            return sse_response(
                sse_with_errors(self._stream(req, engine, http, prompts, handles, meta)),
                handles,
            )
        async with cancel_on_disconnect(http, handles):
            results = await asyncio.gather(*(collect(h, candidates) for h in handles))
        entries = sum(len(r.token_ids) for rs in results for r in rs)
        if req.echo:
            entries += n * sum(len(p.tokens) for p in prompts)
        entries *= 1 + (req.logprobs or 0)
        if entries < OFF_LOOP_ENTRIES:
            body = self._body(req, engine, prompts, handles, results, meta)
        else:  # megabytes of JSON: built where it stalls no stream
            body = await off_loop(self._body, req, engine, prompts, handles, results, meta)
        return Response(body, media_type="application/json")

    def _body(self, req: CompletionRequest, engine: Engine, prompts: list[_Prompt],
              handles: list[RequestHandle], results: list[list[ChoiceResult]],
              meta: dict[str, object]) -> bytes:
        n, candidates = req.n or 1, len(results[0]) if results else 0
        choices = []
        for p_index, (prompt, handle, per_prompt) in enumerate(
            zip(prompts, handles, results, strict=True)
        ):
            if candidates > n:
                per_prompt = sorted(per_prompt, key=lambda r: r.mean_logprob, reverse=True)[:n]
            for c_index, result in enumerate(per_prompt):
                choices.append(
                    CompletionChoice(
                        index=p_index * n + c_index,
                        text=prompt.text + result.text if req.echo else result.text,
                        finish_reason=result.finish_reason,
                        logprobs=self._logprobs(req, engine, prompt, handle, result),
                    )
                )
        usage = sum_usage(handles)
        body = CompletionResponse(
            **meta,  # type: ignore[arg-type]
            system_fingerprint=engine.fingerprint,
            choices=choices,
            usage=usage_info(usage),
        )
        if req.draft_model is None:
            return body.model_dump_json(exclude_none=False).encode()
        payload = {**body.model_dump(mode="json"), "stats": draft_stats(req.draft_model, usage)}
        return json.dumps(payload, ensure_ascii=False, separators=(",", ":")).encode()

    @staticmethod
    def _logprobs(
        req: CompletionRequest,
        engine: Engine,
        prompt: _Prompt,
        handle: RequestHandle,
        result: ChoiceResult,
    ) -> CompletionLogprobs | None:
        if req.logprobs is None:
            return None
        tokens: list[int] = []
        scores: list[TokenLogprob | None] = []
        if req.echo:
            tokens += prompt.tokens
            scores += handle.prompt_logprobs
        tokens += [e.token for e in result.logprobs]
        scores += result.logprobs
        return CompletionLogprobs(**completion_logprobs(tokens, scores, engine.vocab, 0))

    async def _stream(
        self,
        req: CompletionRequest,
        engine: Engine,
        http: Request,
        prompts: list[_Prompt],
        handles: list[RequestHandle],
        meta: dict[str, object],
    ) -> AsyncIterator[str]:
        n = req.n or 1
        usage_field = {"usage": None} if req.include_usage else {}

        offsets = [0] * (len(prompts) * n)  # text_offset continues across chunks

        def chunk(
            index: int,
            text: str,
            finish_reason: str | None,
            tokens: list[int] | None = None,
            scores: Sequence[TokenLogprob | None] | None = None,
        ) -> str:
            logprobs = None
            if req.logprobs is not None and scores is not None and tokens is not None:
                logprobs = completion_logprobs(tokens, scores, engine.vocab, offsets[index])
            offsets[index] += len(text)
            return sse_event(
                {
                    **meta,
                    "object": "text_completion",
                    "system_fingerprint": engine.fingerprint,
                    "choices": [
                        {
                            "index": index,
                            "text": text,
                            "logprobs": logprobs,
                            "finish_reason": finish_reason,
                        }
                    ],
                    **usage_field,
                }
            )

        async with cancel_on_disconnect(http, handles):
            # Prompt logprobs are known once the prompt is evaluated, that is with the
            # first delta, so each echo chunk waits for its request's first delta.
            echoed = [not req.echo] * len(prompts)
            async for p_index, delta in merged_events(handles):
                if isinstance(delta, PromptProgress):  # only with return_progress
                    yield sse_event({**meta, "object": "text_completion", "choices": [],
                                     "prompt_progress": progress_json(delta)})
                    continue
                if not echoed[p_index]:
                    echoed[p_index] = True
                    prompt = prompts[p_index]
                    for c_index in range(n):
                        yield chunk(
                            p_index * n + c_index,
                            prompt.text,
                            None,
                            prompt.tokens,
                            handles[p_index].prompt_logprobs,
                        )
                if delta.text or delta.finish_reason or delta.logprobs:
                    yield chunk(
                        p_index * n + delta.index,
                        delta.text,
                        delta.finish_reason,
                        delta.token_ids,
                        delta.logprobs,
                    )
            if req.draft_model is not None:
                yield sse_event({**meta, "object": "text_completion", "choices": [],
                                 "system_fingerprint": engine.fingerprint,
                                 "stats": draft_stats(req.draft_model, sum_usage(handles))})
            if req.include_usage:
                usage = usage_info(sum_usage(handles))
                yield sse_event(
                    {
                        **meta,
                        "object": "text_completion",
                        "system_fingerprint": engine.fingerprint,
                        "choices": [],
                        "usage": usage.model_dump(),
                    }
                )
            yield SSE_DONE
