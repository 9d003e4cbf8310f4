"""Server-sent events: the event text, the stream that reads the engine ahead of its
client, errors told in the stream, and the events of several handles merged."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

from starlette.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

from edge_server.api.common.serving import stream_events
from edge_server.api.http.errors import APIError
from edge_server.api.http.read_ahead import ReadAheadStream
from edge_server.engine import (
    ChoiceDelta,
)
from edge_server.engine.request import PromptProgress, RequestHandle


def progress_json(progress: PromptProgress) -> dict[str, Any]:
    """llama-server's `prompt_progress` object: `processed` counts cached tokens too."""
    return {"total": progress.total, "cache": progress.cached,
            "processed": progress.processed, "time_ms": progress.time_ms}


def sse_event(payload: dict[str, Any]) -> str:
    return f"data: {json.dumps(payload, ensure_ascii=False, separators=(',', ':'))}\n\n"


SSE_DONE = "data: [DONE]\n\n"


class EngineStream(ReadAheadStream):
    """A streamed answer (server-sent events, or NDJSON lines), read ahead of the client,
    whose engine work is cancelled however sending ends: the client may leave before
    the events are all read."""

    def __init__(self, events: AsyncIterator[str], handles: list[RequestHandle],
                 media_type: str = "text/event-stream") -> None:
        super().__init__(
            events,
            media_type=media_type,
            headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
        )
        self.handles = handles

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            for handle in self.handles:
                handle.cancel()


def sse_response(events: AsyncIterator[str], handles: list[RequestHandle]) -> StreamingResponse:
    return EngineStream(events, handles)


async def sse_with_errors(events: AsyncIterator[str]) -> AsyncIterator[str]:
    """An error after the stream began can only travel as an event of its own."""
    try:
        async for event in events:
            yield event
    except APIError as exc:
        yield sse_event(exc.body())
        yield SSE_DONE


async def merged_events(
    handles: list[RequestHandle],
) -> AsyncIterator[tuple[int, ChoiceDelta | PromptProgress]]:
    """Deltas of several requests as they come, tagged with the request's position."""
    if len(handles) == 1:
        async for delta in stream_events(handles[0]):
            yield 0, delta
        return
    queue: asyncio.Queue[tuple[int, Any]] = asyncio.Queue()
    end = object()

    async def pump(i: int, handle: RequestHandle) -> None:
        try:
            async for delta in stream_events(handle):
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
