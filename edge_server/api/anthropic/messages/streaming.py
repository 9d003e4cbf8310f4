"""Streamed Messages answers in Anthropic's event sequence: message_start, ping, then per
content block content_block_start, its deltas and content_block_stop, then message_delta
(stop reason, usage) and message_stop. An error after the stream began is an `error`
event, as Anthropic sends it."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

from starlette.requests import Request

from edge_server.api.anthropic.messages.blocks import Blocks, Event
from edge_server.api.anthropic.messages.error_shape import anthropic_body
from edge_server.api.anthropic.messages.outcome import StopReading, messages_usage
from edge_server.api.common.serving import cancel_on_disconnect, stream_deltas
from edge_server.api.http.errors import APIError
from edge_server.api.openai.chat.choice_output import ChoiceOutput
from edge_server.engine.request import RequestHandle


def sse(kind: str, payload: dict[str, Any]) -> str:
    data = json.dumps(payload, ensure_ascii=False, separators=(",", ":"))
    return f"event: {kind}\ndata: {data}\n\n"


async def stream_messages(
    http: Request,
    handle: RequestHandle,
    meta: dict[str, Any],
    output: ChoiceOutput,
    stops: StopReading,
) -> AsyncIterator[str]:
    blocks = Blocks()
    try:
        async with cancel_on_disconnect(http, [handle]):
            usage = {**messages_usage(handle.usage), "output_tokens": 0}
            message = {**meta, "content": [], "stop_reason": None, "stop_sequence": None,
                       "usage": usage}
            yield sse("message_start", {"type": "message_start", "message": message})
            yield sse("ping", {"type": "ping"})
            async for delta in stream_deltas(handle):
                text = stops.cut(delta.text, delta.finish_reason)
                events: list[Event] = blocks.feed(output.push(text))
                if delta.finish_reason is not None:
                    events += blocks.feed(output.finish()) + blocks.close(parse_inputs=False)
                for kind, payload in events:
                    yield sse(kind, payload)
                if delta.finish_reason is not None:
                    yield sse("message_delta", {
                        "type": "message_delta",
                        "delta": {"stop_reason": stops.stop_reason(output, delta.finish_reason),
                                  "stop_sequence": stops.matched},
                        "usage": messages_usage(handle.usage),
                    })
            yield sse("message_stop", {"type": "message_stop"})
    except APIError as exc:
        yield sse("error", anthropic_body(exc.status, exc.body()))
