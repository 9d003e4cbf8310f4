"""Streamed chat answers: `chat.completion.chunk` events as the engine generates.

Each choice's text goes through its ChoiceOutput, so content, reasoning and tool-call
deltas go out as soon as they are known (a tool call's name once it is complete, its
arguments fragment by fragment).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any

from starlette.requests import Request

from edge_server.api.common.draft_stats import draft_stats
from edge_server.api.common.logprobs_format import chat_logprobs
from edge_server.api.common.serving import cancel_on_disconnect, stream_events, usage_info
from edge_server.api.common.sse import SSE_DONE, progress_json, sse_event
from edge_server.api.openai.chat.choice_output import ChoiceOutput
from edge_server.api.openai.chat.protocol import ChatCompletionRequest
from edge_server.engine import Engine
from edge_server.engine.request import PromptProgress, RequestHandle


async def stream_chat(
    req: ChatCompletionRequest,
    engine: Engine,
    http: Request,
    handle: RequestHandle,
    meta: dict[str, object],
    outputs: list[ChoiceOutput],
) -> AsyncIterator[str]:
    base = {**meta, "object": "chat.completion.chunk", "system_fingerprint": engine.fingerprint}
    if req.include_usage:
        base["usage"] = None
    chunk = _chunk_maker(base)
    async with cancel_on_disconnect(http, [handle]):
        for i in range(len(outputs)):
            yield chunk(i, {"role": "assistant", "content": ""}, None)
        async for delta in stream_events(handle):
            if isinstance(delta, PromptProgress):  # only with return_progress
                yield sse_event({**base, "choices": [], "prompt_progress": progress_json(delta)})
                continue
            i = delta.index
            output = outputs[i]
            logprobs = (
                chat_logprobs(delta.logprobs, engine.vocab)
                if req.logprobs and delta.logprobs
                else None
            )
            deltas = output.push(delta.text)
            if delta.finish_reason is not None:
                deltas += output.finish()
            # The step's logprobs ride on its first delta, or on an empty one when the
            # text was held back (a possible marker, a call's name not yet complete).
            if logprobs and not deltas:
                deltas = [{}]
            for k, out in enumerate(deltas):
                yield chunk(i, out, None, logprobs if k == 0 else None)
            if delta.finish_reason is not None:
                yield chunk(i, {}, output.finish_reason(delta.finish_reason))
        if req.draft_model is not None:
            yield sse_event({**base, "choices": [],
                             "stats": draft_stats(req.draft_model, handle.usage)})
        if req.include_usage:
            yield sse_event({**base, "choices": [], "usage": usage_info(handle.usage).model_dump()})
        yield SSE_DONE


def _chunk_maker(base: dict[str, Any]) -> Callable[..., str]:
    def chunk(
        index: int,
        delta: dict[str, Any],
        finish_reason: str | None,
        logprobs: dict[str, Any] | None = None,
    ) -> str:
        choice = {"index": index, "delta": delta, "logprobs": logprobs}
        return sse_event({**base, "choices": [{**choice, "finish_reason": finish_reason}]})

    return chunk
