"""uvicorn's HTTP protocol with sends bounded: --send-timeout, --send-buffer-mb and
--limit-concurrency.

uvicorn has no send timeout: once a connection's write buffer is full, a send waits for
as long as the client does not read, and an answer written whole stays buffered as
long. Its HTTP protocol (httptools or h11, as uvicorn picks) is used here with a flow
control that reports each connection's waiting bytes to the SendBuffers
(api/http/send_buffers.py), which closes a connection behind for the timeout, and the
longest behind when all of them hold more than the bound. The application sees the
client leave (the waiting send returns, and everything its response held is freed, as
for any disconnect).

Over --limit-concurrency connections or requests, a request is answered 503 in the
OpenAI error shape (uvicorn's own refusal is plain text) and its connection closed.
"""

from __future__ import annotations

import asyncio
from typing import Any

from starlette.types import ASGIApp, Receive, Scope, Send
from uvicorn.protocols.http.auto import AutoHTTPProtocol
from uvicorn.protocols.http.flow_control import FlowControl

from edge_server.api.http.errors import APIError
from edge_server.api.http.send_buffers import EXTENSION, Account, SendBuffers


class _AccountedFlowControl(FlowControl):
    def __init__(self, transport: asyncio.Transport, buffers: SendBuffers) -> None:
        super().__init__(transport)
        # Writing resumes only once the transport's buffer is empty (asyncio's default
        # resumes at a quarter of the high mark), so a resume means the reader has
        # taken everything written: the moment a connection stops being behind.
        _, high = transport.get_write_buffer_limits()
        transport.set_write_buffer_limits(high=high, low=0)
        self.account: Account = buffers.account(transport.abort,
                                                transport.get_extra_info("peername"))

    def pause_writing(self) -> None:
        super().pause_writing()
        # While paused nothing more is written (sends wait first), so this is the most
        # the transport holds until it resumes.
        self.account.writing_paused(self._transport.get_write_buffer_size())

    def resume_writing(self) -> None:  # also when the connection is lost
        super().resume_writing()
        self.account.writing_resumed()


def _refused() -> APIError:
    return APIError(503, "the server is at its --limit-concurrency of connections and "
                    "requests; retry shortly", type="server_error",
                    code="service_unavailable", headers={"Connection": "close"})


def http_protocol(buffers: SendBuffers, limit_concurrency: int) -> type[asyncio.Protocol]:
    """uvicorn's HTTP protocol with sends bounded by `buffers`, and over
    `limit_concurrency` connections or requests answering a JSON 503."""

    class BoundedSends(AutoHTTPProtocol):  # type: ignore[misc, valid-type]
        def connection_made(self, transport: Any) -> None:
            super().connection_made(transport)
            flow = _AccountedFlowControl(transport, buffers)
            self.flow = flow
            app: ASGIApp = self.app  # type: ignore[has-type]
            connections, tasks = self.connections, self.tasks

            async def bounded(scope: Scope, receive: Receive, send: Send) -> None:
                if scope["type"] == "http" and (len(connections) > limit_concurrency
                                                or len(tasks) > limit_concurrency):
                    # This connection and this request's task are counted already.
                    await _refused().response()(scope, receive, send)
                    return
                scope["extensions"] = {**(scope.get("extensions") or {}),
                                       EXTENSION: flow.account}
                await app(scope, receive, send)

            self.app = bounded

    return BoundedSends
