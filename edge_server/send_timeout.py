"""--send-timeout: a connection whose client reads nothing for that long is closed.

uvicorn has no send timeout: once a connection's write buffer is full, a send waits for
as long as the client does not read, and an answer written whole stays buffered as
long. Its HTTP protocol (httptools or h11, as uvicorn picks) is used here with a flow
control that aborts the connection once writing has stayed paused (the buffer full) for
the timeout. The application sees the client leave (the waiting send returns, and
everything its response held is freed, as for any disconnect).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from uvicorn.protocols.http.auto import AutoHTTPProtocol
from uvicorn.protocols.http.flow_control import FlowControl

log = logging.getLogger(__name__)


class _TimedFlowControl(FlowControl):
    def __init__(self, transport: asyncio.Transport, seconds: float) -> None:
        super().__init__(transport)
        self._seconds = seconds
        self._expiry: asyncio.TimerHandle | None = None

    def pause_writing(self) -> None:
        super().pause_writing()
        if self._expiry is None:
            loop = asyncio.get_running_loop()
            self._expiry = loop.call_later(self._seconds, self._expire)

    def resume_writing(self) -> None:  # also when the connection is lost
        super().resume_writing()
        if self._expiry is not None:
            self._expiry.cancel()
            self._expiry = None

    def _expire(self) -> None:
        self._expiry = None
        log.info("closing the connection of %s: it read nothing for %g s",
                 self._transport.get_extra_info("peername"), self._seconds)
        self._transport.abort()


def http_protocol(send_timeout: float) -> type[asyncio.Protocol]:
    """uvicorn's HTTP protocol with sends bounded to `send_timeout` seconds."""

    class TimedSends(AutoHTTPProtocol):  # type: ignore[misc, valid-type]
        def connection_made(self, transport: Any) -> None:
            super().connection_made(transport)
            self.flow = _TimedFlowControl(transport, send_timeout)

    return TimedSends
