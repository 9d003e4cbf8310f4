"""POST /v1/chat/completions: messages rendered with the model's chat template."""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from ...engine import Engine, GenerationRequest
from ...engine.request import RequestHandle
from ..dependencies import off_loop
from ..errors import invalid
from ..logprobs_format import chat_logprobs
from ..serving_common import (
    SSE_DONE,
    cancel_on_disconnect,
    collect,
    max_tokens_for,
    new_id,
    now,
    sampling_params,
    schema_grammar,
    sse_event,
    sse_response,
    sse_with_errors,
    stream_deltas,
    submit,
    usage_info,
    wait_started,
)
from . import tools as tooling
from .prompt import chat_prompt
from .protocol import (
    ChatChoice,
    ChatCompletionRequest,
    ChatCompletionResponse,
    ChatResponseMessage,
    NamedToolChoice,
    Tool,
)
from .reasoning import OPEN as THINK_OPEN
from .reasoning import ReasoningSplitter


@dataclass
class _Plan:
    """What this request needs beyond plain generation."""

    tools: list[Tool]
    tools_forced: bool  # tool_choice required or named: the answer is a call
    reasoning_opened: bool  # the prompt already opened a <think> block


@dataclass
class PreparedChat:
    request: GenerationRequest
    plan: _Plan


def _check_fields(req: ChatCompletionRequest) -> None:
    if req.top_logprobs is not None and not req.logprobs:
        raise invalid("top_logprobs", "top_logprobs needs logprobs: true")
    choice = req.tool_choice
    if choice is not None and choice != "none" and not req.tools:
        raise invalid("tool_choice", "tool_choice needs `tools`")
    if isinstance(choice, NamedToolChoice):
        name = choice.function.get("name")
        if name not in {t.function.name for t in req.tools or []}:
            raise invalid("tool_choice", f"no tool named {name!r} in `tools`")


def prepare(req: ChatCompletionRequest, engine: Engine) -> PreparedChat:
    """Everything before the engine: checks, grammars, the rendered and tokenized prompt.
    CPU-bound (templates, tokenizer, schema conversion), so it runs off the event loop."""
    _check_fields(req)
    sampling = sampling_params(req, engine)
    tools = tooling.active_tools(req)
    forced = bool(tools) and req.tool_choice not in (None, "auto")
    if forced:
        # A function marked strict gets its limits enforced, not relaxed.
        strict = any(t.function.strict for t in tools)
        grammar = schema_grammar(tooling.call_schema(tools), strict=strict, param="tools")
        sampling = dataclasses.replace(sampling, grammar=grammar)
    prompt = chat_prompt(req.messages, engine, tools, enable_thinking=req.enable_thinking)
    request = GenerationRequest(
        prompt_tokens=prompt.tokens,
        max_tokens=max_tokens_for(req, len(prompt.tokens), engine.n_ctx, None),
        sampling=sampling,
        stop=req.stop_list,
        include_stop=bool(req.include_stop_str_in_output),
        n=req.n or 1,
        logprobs=(req.top_logprobs or 0) if req.logprobs else None,
    )
    plan = _Plan(tools, forced, prompt.text.rstrip().endswith(THINK_OPEN))
    return PreparedChat(request, plan)


class ChatServing:
    async def create(self, req: ChatCompletionRequest, engine: Engine, http: Request) -> Response:
        prepared = await off_loop(prepare, req, engine)
        plan = prepared.plan
        n = prepared.request.n
        handle = submit(engine, prepared.request)
        meta = {"id": new_id("chatcmpl"), "created": now(), "model": req.model}
        if req.stream:
            await wait_started(http, [handle])
            return sse_response(
                sse_with_errors(self._stream(req, engine, http, handle, meta, plan)),
                [handle],
            )
        async with cancel_on_disconnect(http, [handle]):
            results = await collect(handle, n)
        choices = []
        for i, result in enumerate(results):
            message = ChatResponseMessage(content=result.text)
            finish_reason = result.finish_reason
            if req.separate_reasoning:
                splitter = ReasoningSplitter(starts_inside=plan.reasoning_opened)
                reasoning, content = _joined(splitter.push(result.text), splitter.finish())
                message = ChatResponseMessage(content=content, reasoning_content=reasoning or None)
            if plan.tools:
                rest, calls = tooling.parse_tool_calls(message.content or "", plan.tools)
                if calls:
                    message.content, message.tool_calls = rest, calls
                    finish_reason = "tool_calls"
            choices.append(
                ChatChoice(
                    index=i,
                    message=message,
                    finish_reason=finish_reason,
                    logprobs=chat_logprobs(result.logprobs, engine.vocab) if req.logprobs else None,
                )
            )
        body = ChatCompletionResponse(
            **meta,
            system_fingerprint=engine.fingerprint,
            choices=choices,
            usage=usage_info(handle.usage),
        )
        payload = body.model_dump(exclude_none=True)
        for choice in payload["choices"]:
            choice.setdefault("logprobs", None)
            choice["message"].setdefault("content", None)
        return JSONResponse(payload)

    async def _stream(
        self,
        req: ChatCompletionRequest,
        engine: Engine,
        http: Request,
        handle: RequestHandle,
        meta: dict[str, object],
        plan: _Plan,
    ) -> AsyncIterator[str]:
        base = {**meta, "object": "chat.completion.chunk", "system_fingerprint": engine.fingerprint}
        if req.include_usage:
            base["usage"] = None
        n = req.n or 1
        splitters = [
            ReasoningSplitter(starts_inside=plan.reasoning_opened)
            if req.separate_reasoning
            else None
            for _ in range(n)
        ]
        # Tool calls are parsed from the whole answer, so with tools the text is held
        # until the choice ends, then sent as content or as tool_calls.
        held: list[list[str]] = [[] for _ in range(n)]

        def chunk(
            index: int,
            delta: dict[str, Any],
            finish_reason: str | None,
            logprobs: dict[str, Any] | None = None,
        ) -> str:
            return sse_event(
                {
                    **base,
                    "choices": [
                        {
                            "index": index,
                            "delta": delta,
                            "logprobs": logprobs,
                            "finish_reason": finish_reason,
                        }
                    ],
                }
            )

        def text_delta(index: int, text: str, final: bool) -> dict[str, Any]:
            splitter = splitters[index]
            if splitter is None:
                return {"content": text} if text else {}
            reasoning, content = splitter.push(text)
            if final:
                reasoning, content = _joined((reasoning, content), splitter.finish())
            delta: dict[str, Any] = {}
            if reasoning:
                delta["reasoning_content"] = reasoning
            if content:
                delta["content"] = content
            return delta

        async with cancel_on_disconnect(http, [handle]):
            for i in range(n):
                yield chunk(i, {"role": "assistant", "content": ""}, None)
            async for delta in stream_deltas(handle):
                i = delta.index
                logprobs = (
                    chat_logprobs(delta.logprobs, engine.vocab)
                    if req.logprobs and delta.logprobs
                    else None
                )
                finish_reason = delta.finish_reason
                if plan.tools:
                    held[i].append(delta.text)
                    if logprobs:
                        yield chunk(i, {}, None, logprobs)
                    if finish_reason is None:
                        continue
                    rest, calls = tooling.parse_tool_calls("".join(held[i]), plan.tools)
                    if calls:
                        if rest:
                            yield chunk(i, text_delta(i, rest, True), None)
                        yield chunk(
                            i,
                            {"tool_calls": [{"index": k, **call} for k, call in enumerate(calls)]},
                            None,
                        )
                        finish_reason = "tool_calls"
                    else:
                        out = text_delta(i, "".join(held[i]), True)
                        if out:
                            yield chunk(i, out, None)
                    yield chunk(i, {}, finish_reason)
                    continue
                out = text_delta(i, delta.text, finish_reason is not None)
                if out or logprobs:
                    yield chunk(i, out, None, logprobs)
                if finish_reason:
                    yield chunk(i, {}, finish_reason)
            if req.include_usage:
                yield sse_event(
                    {**base, "choices": [], "usage": usage_info(handle.usage).model_dump()}
                )
            yield SSE_DONE


def _joined(first: tuple[str, str], second: tuple[str, str]) -> tuple[str, str]:
    return first[0] + second[0], first[1] + second[1]
