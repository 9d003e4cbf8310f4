"""POST /v1/completions: prompts in, text completions out (whole or streamed)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from ...engine import Engine, GenerationRequest
from ...engine.request import RequestHandle
from ..errors import invalid, unsupported
from ..serving_common import (
    SSE_DONE,
    cancel_on_disconnect,
    check_prompt_tokens,
    collect,
    max_tokens_for,
    new_id,
    now,
    sampling_params,
    sse_event,
    sse_response,
    sse_with_errors,
    stream_deltas,
    submit,
    sum_usage,
    usage_info,
)
from .protocol import CompletionChoice, CompletionRequest, CompletionResponse

DEFAULT_MAX_TOKENS = 16


@dataclass
class _Prompt:
    tokens: list[int]
    text: str  # what `echo` returns


def _refuse_unimplemented(req: CompletionRequest) -> None:
    if req.suffix:
        raise unsupported("suffix", "is not supported yet")
    if req.logprobs is not None:
        raise unsupported("logprobs", "is not supported yet")
    if req.best_of is not None and req.best_of != (req.n or 1):
        raise unsupported("best_of", "is not supported yet")
    if req.images:
        raise unsupported("images", "needs a multimodal model; this one is text-only")


def _prompts(req: CompletionRequest, engine: Engine) -> list[_Prompt]:
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
        if isinstance(item, str):
            tokens = engine.tokenize(item)
            text = item
        else:
            check_prompt_tokens(item, engine, param)
            tokens = list(item)
            text = engine.vocab.detokenize(tokens)
        if not tokens:
            raise invalid(param, "the prompt is empty")
        prompts.append(_Prompt(tokens, text))
    return prompts


class CompletionsServing:
    async def create(self, req: CompletionRequest, engine: Engine, http: Request) -> Response:
        _refuse_unimplemented(req)
        sampling = sampling_params(req, engine)
        prompts = _prompts(req, engine)
        n = req.n or 1
        requests = [
            GenerationRequest(
                prompt_tokens=p.tokens,
                max_tokens=max_tokens_for(req, len(p.tokens), engine.n_ctx, DEFAULT_MAX_TOKENS),
                sampling=sampling,
                stop=req.stop_list,
                include_stop=bool(req.include_stop_str_in_output),
                n=n,
            )
            for p in prompts
        ]
        handles: list[RequestHandle] = []
        try:
            for request in requests:
                handles.append(submit(engine, request))
        except Exception:
            for handle in handles:
                handle.cancel()
            raise
        meta = {"id": new_id("cmpl"), "created": now(), "model": req.model}
        if req.stream:
            return sse_response(
                sse_with_errors(self._stream(req, engine, http, prompts, handles, meta))
            )
        async with cancel_on_disconnect(http, handles):
            results = await asyncio.gather(*(collect(h, n) for h in handles))
        choices = []
        for p_index, (prompt, per_prompt) in enumerate(zip(prompts, results, strict=True)):
            for c_index, result in enumerate(per_prompt):
                text = prompt.text + result.text if req.echo else result.text
                choices.append(
                    CompletionChoice(
                        index=p_index * n + c_index, text=text, finish_reason=result.finish_reason
                    )
                )
        usage = sum_usage(handles)
        body = CompletionResponse(
            **meta,
            system_fingerprint=engine.fingerprint,
            choices=choices,
            usage=usage_info(usage),
        )
        return JSONResponse(body.model_dump(exclude_none=False))

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

        def chunk(index: int, text: str, finish_reason: str | None) -> str:
            return sse_event(
                {
                    **meta,
                    "object": "text_completion",
                    "system_fingerprint": engine.fingerprint,
                    "choices": [
                        {
                            "index": index,
                            "text": text,
                            "logprobs": None,
                            "finish_reason": finish_reason,
                        }
                    ],
                    **usage_field,
                }
            )

        async with cancel_on_disconnect(http, handles):
            if req.echo:
                for p_index, prompt in enumerate(prompts):
                    for c_index in range(n):
                        yield chunk(p_index * n + c_index, prompt.text, None)
            async for p_index, delta in _merged(handles):
                if delta.text or delta.finish_reason:
                    yield chunk(p_index * n + delta.index, delta.text, delta.finish_reason)
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


async def _merged(handles: list[RequestHandle]):  # type: ignore[no-untyped-def]
    """Deltas of several requests as they come, tagged with the request's position."""
    if len(handles) == 1:
        async for delta in stream_deltas(handles[0]):
            yield 0, delta
        return
    queue: asyncio.Queue[tuple[int, object]] = asyncio.Queue()
    end = object()

    async def pump(i: int, handle: RequestHandle) -> None:
        try:
            async for delta in stream_deltas(handle):
                await queue.put((i, delta))
        except Exception as exc:
            await queue.put((i, exc))
        await queue.put((i, end))

    tasks = [asyncio.create_task(pump(i, h)) for i, h in enumerate(handles)]
    try:
        remaining = len(tasks)
        while remaining:
            i, item = await queue.get()
            if item is end:
                remaining -= 1
            elif isinstance(item, Exception):
                raise item
            else:
                yield i, item
    finally:
        for task in tasks:
            task.cancel()
