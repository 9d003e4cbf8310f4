"""POST /v1/chat/completions: messages rendered with the model's chat template."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from ...engine import Engine, GenerationRequest
from ...engine.chat_template import TemplateError
from ...engine.request import RequestHandle
from ..errors import invalid, unsupported
from ..serving_common import (
    SSE_DONE,
    cancel_on_disconnect,
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
    usage_info,
)
from .protocol import (
    ChatChoice,
    ChatCompletionRequest,
    ChatCompletionResponse,
    ChatMessage,
    ChatResponseMessage,
)


def _refuse_unimplemented(req: ChatCompletionRequest) -> None:
    if req.logprobs or req.top_logprobs is not None:
        raise unsupported("logprobs" if req.logprobs else "top_logprobs", "is not supported yet")
    if req.tools:
        raise unsupported("tools", "is not supported yet")
    if req.tool_choice is not None and req.tool_choice != "none":
        raise unsupported("tool_choice", "is not supported yet")
    if req.separate_reasoning:
        raise unsupported("separate_reasoning", "is not supported yet")


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


def template_messages(req: ChatCompletionRequest, engine: Engine) -> list[dict[str, Any]]:
    """Messages as the Jinja chat templates expect them: plain dicts, string content."""
    out: list[dict[str, Any]] = []
    for i, message in enumerate(req.messages):
        text = _message_text(message, i)
        role = "system" if message.role == "developer" else message.role
        item: dict[str, Any] = {"role": role, "content": text}
        if message.name:
            item["name"] = message.name
            if not engine.chat_template.renders_names:
                item["content"] = f"{message.name}: {text}"
        if message.tool_calls:
            item["tool_calls"] = message.tool_calls
        if message.tool_call_id:
            item["tool_call_id"] = message.tool_call_id
        out.append(item)
    return out


class ChatServing:
    async def create(self, req: ChatCompletionRequest, engine: Engine, http: Request) -> Response:
        _refuse_unimplemented(req)
        sampling = sampling_params(req, engine)
        messages = template_messages(req, engine)
        try:
            prompt = engine.chat_prompt(messages, enable_thinking=req.enable_thinking)
        except TemplateError as exc:
            raise invalid("messages", str(exc), "invalid_messages") from exc
        n = req.n or 1
        request = GenerationRequest(
            prompt_tokens=prompt,
            max_tokens=max_tokens_for(req, len(prompt), engine.n_ctx, None),
            sampling=sampling,
            stop=req.stop_list,
            include_stop=bool(req.include_stop_str_in_output),
            n=n,
        )
        handle = submit(engine, request)
        meta = {"id": new_id("chatcmpl"), "created": now(), "model": req.model}
        if req.stream:
            return sse_response(sse_with_errors(self._stream(req, engine, http, handle, meta)))
        async with cancel_on_disconnect(http, [handle]):
            results = await collect(handle, n)
        body = ChatCompletionResponse(
            **meta,
            system_fingerprint=engine.fingerprint,
            choices=[
                ChatChoice(
                    index=i,
                    message=ChatResponseMessage(content=r.text),
                    finish_reason=r.finish_reason,
                )
                for i, r in enumerate(results)
            ],
            usage=usage_info(handle.usage),
        )
        return JSONResponse(body.model_dump(exclude_none=True))

    async def _stream(
        self,
        req: ChatCompletionRequest,
        engine: Engine,
        http: Request,
        handle: RequestHandle,
        meta: dict[str, object],
    ) -> AsyncIterator[str]:
        base = {**meta, "object": "chat.completion.chunk", "system_fingerprint": engine.fingerprint}
        if req.include_usage:
            base["usage"] = None

        def chunk(index: int, delta: dict[str, Any], finish_reason: str | None) -> str:
            return sse_event(
                {
                    **base,
                    "choices": [
                        {
                            "index": index,
                            "delta": delta,
                            "logprobs": None,
                            "finish_reason": finish_reason,
                        }
                    ],
                }
            )

        async with cancel_on_disconnect(http, [handle]):
            for i in range(req.n or 1):
                yield chunk(i, {"role": "assistant", "content": ""}, None)
            async for delta in stream_deltas(handle):
                if delta.text:
                    yield chunk(delta.index, {"content": delta.text}, None)
                if delta.finish_reason:
                    yield chunk(delta.index, {}, delta.finish_reason)
            if req.include_usage:
                yield sse_event(
                    {**base, "choices": [], "usage": usage_info(handle.usage).model_dump()}
                )
            yield SSE_DONE
