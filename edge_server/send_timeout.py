"""--send-timeout: a connection whose client reads nothing for that long is closed.

uvicorn has no send timeout: a send waits while the connection's write buffer is full,
for as long as the client does not read. Its HTTP protocol (httptools or h11, as
uvicorn picks) is used here with a flow control whose wait for room is bounded; past
it the connection is aborted, which the application sees as the client leaving
(everything the response held is freed, as for any disconnect).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

from uvicorn.protocols.http.auto import AutoHTTPProtocol
from uvicorn.protocols.http.flow_control import FlowControl

log = logging.getLogger(__name__)

# After an abort, how long a send waits for the connection's loss to be reported.
_LOSS_REPORT_S = 1.0


class _TimedFlowControl(FlowControl):
    def __init__(self, transport: asyncio.Transport, seconds: float) -> None:
        super().__init__(transport)
        self._seconds = seconds

    async def drain(self) -> None:
        try:
            await asyncio.wait_for(super().drain(), self._seconds)
        except TimeoutError:
            peer = self._transport.get_extra_info("peername")
            log.info("closing the connection of %s: it read nothing for %.0f s", peer,
                     self._seconds)
            self._transport.abort()
            # The loss is reported on the loop's next turn, and resumes writing; the
            # send then finds its client gone.
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(super().drain(), _LOSS_REPORT_S)


def http_protocol(send_timeout: float) -> type[asyncio.Protocol]:
    """uvicorn's HTTP protocol with sends bounded to `send_timeout` seconds."""

    class TimedSends(AutoHTTPProtocol):  # type: ignore[misc, valid-type]
        def connection_made(self, transport: Any) -> None:
            super().connection_made(transport)
            self.flow = _TimedFlowControl(transport, send_timeout)

    return TimedSends
