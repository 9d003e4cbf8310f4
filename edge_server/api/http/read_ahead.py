"""Streams read ahead of the client: events are made as fast as the engine delivers
them, into a buffer that sending drains.

So the engine's work for a request, and everything made from it (events, logprobs,
the final usage), ends when the engine is done, not when a slow client has read it:
the request's hold (hold.py) is released then, and the buffer keeps all the generated
output for the client. The buffer is bounded by the request itself (its max_tokens and
choices: no more than the same answer built whole holds); what it holds is counted in
its connection's Account (send_buffers.py), which bounds how long a client that falls
behind keeps it (--send-timeout) and how much all of them keep (--send-buffer-mb).

A batch of events posted together (the engine posts at most every --stream-interval-ms)
wakes the sender once and goes out in one write, each still its own event on the wire.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterable, AsyncIterator, Callable, Mapping

from starlette.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

from edge_server.api.http.send_buffers import EXTENSION, Account


class ReadAheadStream(StreamingResponse):
    """A streamed answer whose `events` are read into a buffer as they come; callbacks
    given to when_read run once the events are all read (or reading failed or was
    cancelled)."""

    def __init__(self, events: AsyncIterable[str | bytes], *, media_type: str,
                 headers: Mapping[str, str] | None = None) -> None:
        self._events = events
        self._buffer: list[bytes] = []
        self._ready = asyncio.Event()  # the buffer holds something, or reading ended
        self._read = False
        self._error: Exception | None = None
        self._on_read: list[Callable[[], None]] = []
        self._account: Account | None = None
        self._queued = 0  # bytes read ahead whose send has not returned
        super().__init__(self._drain(), media_type=media_type, headers=headers)

    def when_read(self, callback: Callable[[], None]) -> None:
        """Runs `callback` once every event is read (at once if they are)."""
        if self._read:
            callback()
        else:
            self._on_read.append(callback)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        self._account = (scope.get("extensions") or {}).get(EXTENSION)
        reader = asyncio.create_task(self._read_ahead())
        try:
            await super().__call__(scope, receive, send)
        finally:
            reader.cancel()  # the client left: reading stops (and its engine work)
            self._ended()
            self._buffer = []
            self._count(-self._queued)

    async def _read_ahead(self) -> None:
        try:
            async for event in self._events:
                data = event if isinstance(event, bytes) else event.encode(self.charset)
                self._buffer.append(data)
                self._count(len(data))
                self._ready.set()
        except Exception as exc:  # raised to the sender after what came before it
            self._error = exc
        finally:
            self._ended()

    def _ended(self) -> None:
        self._read = True
        self._ready.set()
        callbacks, self._on_read = self._on_read, []
        for callback in callbacks:
            callback()

    def _count(self, n: int) -> None:
        self._queued += n
        if self._account is not None and n:
            if n > 0:
                self._account.queue(n)
            else:
                self._account.sent(-n)

    async def _drain(self) -> AsyncIterator[bytes]:
        while True:
            if not self._buffer and not self._read:
                self._ready.clear()
                await self._ready.wait()
            chunks, self._buffer = self._buffer, []
            if chunks:
                data = b"".join(chunks)
                yield data
                # Counted until its send returns: by then the transport holds what the
                # reader has not taken, and reports it while writing is paused.
                self._count(-len(data))
            elif self._read:
                if self._error is not None:
                    raise self._error
                return
