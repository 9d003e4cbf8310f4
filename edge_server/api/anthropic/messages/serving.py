"""POST /v1/messages and /v1/messages/count_tokens: the request made a chat request
(translate), prepared and run exactly as chat completions are, the answer read back
through the same ChoiceOutput and turned into content blocks (blocks)."""

from __future__ import annotations

from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from edge_server.api.anthropic.messages.blocks import Blocks
from edge_server.api.anthropic.messages.outcome import StopReading, message_id, messages_usage
from edge_server.api.anthropic.messages.protocol import (
    CountTokensRequest,
    CountTokensResponse,
    MessagesRequest,
)
from edge_server.api.anthropic.messages.streaming import stream_messages
from edge_server.api.anthropic.messages.translate import PARAM_NAMES, rename_image_param, to_chat
from edge_server.api.common.serving import cancel_on_disconnect, stream_deltas, submit, wait_started
from edge_server.api.common.sse import sse_response
from edge_server.api.http.dependencies import off_loop
from edge_server.api.http.errors import APIError
from edge_server.api.openai.chat import tools as tooling
from edge_server.api.openai.chat.choice_output import ChoiceOutput
from edge_server.api.openai.chat.prompt import chat_prompt, render_chat
from edge_server.api.openai.chat.serving import PreparedChat, prepare
from edge_server.engine import Engine, FinishReason
from edge_server.engine.request import RequestHandle


def _prepare(req: MessagesRequest, engine: Engine) -> PreparedChat:
    images: dict[str, str] = {}
    try:
        return prepare(to_chat(req, images), engine)
    except APIError as exc:
        raise renamed(exc, images) from exc


def renamed(exc: APIError, images: dict[str, str] | None = None) -> APIError:
    """A chat-side error naming the field as the Anthropic request calls it."""
    if exc.param in PARAM_NAMES:
        exc.param = PARAM_NAMES[exc.param]
    elif exc.param and images:
        name = rename_image_param(exc.param, images)
        if name is not None:
            exc.message = exc.message.replace(exc.param, name)
            exc.param = name
    return exc


def _count(req: CountTokensRequest, engine: Engine) -> int:
    # The very rendering prepare() does, without sampling or grammars.
    images: dict[str, str] = {}
    try:
        chat = to_chat(req, images)
        tools = tooling.active_tools(chat)
        prompt = chat_prompt(*render_chat(chat.messages, engine, tools,
                                          template_kwargs=chat.template_kwargs), engine)
    except APIError as exc:
        raise renamed(exc, images) from exc
    return len(prompt.tokens)


async def _read_blocks(handle: RequestHandle, output: ChoiceOutput, stops: StopReading
                       ) -> tuple[Blocks, FinishReason | None]:
    """The whole answer's content blocks, read as it is generated: a tool input nesting
    too deep to return is refused the moment it does (the caller's exit cancels the
    generation), not after max_tokens more tokens."""
    blocks = Blocks()
    finish_reason: FinishReason | None = None
    async for delta in stream_deltas(handle):
        blocks.feed(output.push(stops.cut(delta.text, delta.finish_reason)))
        blocks.check_open_input()
        finish_reason = delta.finish_reason or finish_reason
    blocks.feed(output.finish())
    blocks.close()
    return blocks, finish_reason


class MessagesServing:
    async def create(self, req: MessagesRequest, engine: Engine, http: Request) -> Response:
        prepared = await off_loop(_prepare, req, engine)
        handle = submit(engine, prepared.request, http)
        output = prepared.plan.outputs(1)[0]
        stops = StopReading(prepared.request.stop)
        meta: dict[str, Any] = {"id": message_id(), "type": "message", "role": "assistant",
                                "model": engine.model_id}
        if req.stream:
            await wait_started(http, [handle])
            events = stream_messages(http, handle, meta, output, stops)
            return prepared.truncated.apply(sse_response(events, [handle]))
        async with cancel_on_disconnect(http, [handle]):
            blocks, finish_reason = await _read_blocks(handle, output, stops)
        return prepared.truncated.apply(JSONResponse({
            **meta,
            "content": blocks.blocks,
            "stop_reason": stops.stop_reason(output, finish_reason),
            "stop_sequence": stops.matched,
            "usage": messages_usage(handle.usage),
        }))

    async def count_tokens(self, req: CountTokensRequest, engine: Engine) -> Response:
        tokens = await off_loop(_count, req, engine)
        return JSONResponse(CountTokensResponse(input_tokens=tokens).model_dump())
