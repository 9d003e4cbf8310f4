"""POST /v1/chat/completions: messages rendered with the model's chat template."""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from ...engine import Engine, GenerationRequest
from ...engine.chat_template import TemplateError
from ...engine.request import RequestHandle
from ..errors import invalid, unsupported
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
from .protocol import (
    ChatChoice,
    ChatCompletionRequest,
    ChatCompletionResponse,
    ChatMessage,
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


def _message_text(message: ChatMessage, index: int) -> str:
    content = message.content
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    texts = []
    for j, part in enumerate(content):
        if part.type != "text":
            raise unsupported(
                f"messages[{index}].content[{j}].{part.type}",
                "needs a model with a multimodal projector; this one is text-only",
            )
        texts.append(part.text or "")
    return "\n".join(texts)


def template_messages(
    req: ChatCompletionRequest, engine: Engine, tools: list[Tool]
) -> list[dict[str, Any]]:
    """Messages as Jinja chat templates expect them: plain dicts with string content."""
    template = engine.chat_template
    out: list[dict[str, Any]] = []
    for i, message in enumerate(req.messages):
        text = _message_text(message, i)
        role = "system" if message.role == "developer" else message.role
        item: dict[str, Any] = {"role": role, "content": text}
        if message.name:
            item["name"] = message.name
            if not template.renders_names:
                item["content"] = f"{message.name}: {text}"
        if message.tool_calls:
            item["tool_calls"] = message.tool_calls
            if not template.renders_tools:
                item["content"] = (text + "\n" if text else "") + tooling.history_text(
                    message.tool_calls
                )
        if message.tool_call_id:
            item["tool_call_id"] = message.tool_call_id
        out.append(item)
    if tools and not template.renders_tools:
        prompt = tooling.generic_prompt(tools)
        if out and out[0]["role"] == "system":
            out[0] = {**out[0], "content": prompt + "\n\n" + out[0]["content"]}
        else:
            out.insert(0, {"role": "system", "content": prompt})
    return out


class ChatServing:
    async def create(self, req: ChatCompletionRequest, engine: Engine, http: Request) -> Response:
        _check_fields(req)
        sampling = sampling_params(req, engine)
        tools = tooling.active_tools(req)
        forced = bool(tools) and req.tool_choice not in (None, "auto")
        if forced:
            grammar = schema_grammar(tooling.call_schema(tools), strict=False, param="tools")
            sampling = dataclasses.replace(sampling, grammar=grammar)
        messages = template_messages(req, engine, tools)
        template_vars: dict[str, Any] = {"enable_thinking": req.enable_thinking}
        if tools and engine.chat_template.renders_tools:
            template_vars["tools"] = tooling.tool_specs(tools)
        try:
            prompt_text = engine.chat_template.render(messages, **template_vars)
        except TemplateError as exc:
            raise invalid("messages", str(exc), "invalid_messages") from exc
        prompt = engine.tokenize_chat_text(prompt_text)
        plan = _Plan(tools, forced, prompt_text.rstrip().endswith(THINK_OPEN))
        n = req.n or 1
        request = GenerationRequest(
            prompt_tokens=prompt,
            max_tokens=max_tokens_for(req, len(prompt), engine.n_ctx, None),
            sampling=sampling,
            stop=req.stop_list,
            include_stop=bool(req.include_stop_str_in_output),
            n=n,
            logprobs=(req.top_logprobs or 0) if req.logprobs else None,
        )
        handle = submit(engine, request)
        meta = {"id": new_id("chatcmpl"), "created": now(), "model": req.model}
        if req.stream:
            await wait_started(http, [handle])
            return sse_response(
                sse_with_errors(self._stream(req, engine, http, handle, meta, plan))
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
