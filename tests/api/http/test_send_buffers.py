"""Answers waiting for their readers are bounded: a connection behind for --send-timeout
is closed however it drains meanwhile, and over --limit-concurrency a request is
answered 503 in the OpenAI error shape. The bound on all of them together
(--send-buffer-mb) takes minutes to reach: scripts/bench/bench_slow_readers.py --check."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import pytest
from conftest import start_server, stop_server
from uvicorn.protocols.http.flow_control import FlowControl

from edge_server.api.http.send_buffers import SendBuffers
from edge_server.process.send_timeout import _AccountedFlowControl


def serve_to_a_trickling_reader(make_flow: Callable[[asyncio.Transport], FlowControl],
                                watch: float) -> tuple[float | None, int]:
    """Streams 1 MiB over 127.0.0.1, in 4 KiB writes awaiting the flow control's drain
    first (as uvicorn's sends do), to a client taking 4 KiB every 0.2 s; returns when the
    server lost the connection (None if not within `watch` seconds) and how many reads
    brought the client something."""
    piece, total = b"x" * 4096, 1024 * 1024

    async def main() -> tuple[float | None, int]:
        loop = asyncio.get_running_loop()
        lost = asyncio.Event()

        class Streamer(asyncio.Protocol):
            def connection_made(self, transport: Any) -> None:  # uvloop's too
                # Small buffers, so a few KB taken turn them over well within the
                # timeout: the old flow control then resumed (and restarted its clock)
                # every half second or so.
                transport.get_extra_info("socket").setsockopt(
                    socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
                transport.set_write_buffer_limits(high=8192)
                self.flow = make_flow(transport)
                self.sender = loop.create_task(self.send(transport))

            async def send(self, transport: asyncio.Transport) -> None:
                account = getattr(self.flow, "account", None)
                if account is not None:  # all of it read ahead, as a finished stream is
                    account.queue(total)
                for _ in range(total // len(piece)):
                    await self.flow.drain()
                    if transport.is_closing():
                        return
                    transport.write(piece)
                    if account is not None:
                        account.sent(len(piece))

            def pause_writing(self) -> None:
                self.flow.pause_writing()

            def resume_writing(self) -> None:
                self.flow.resume_writing()

            def connection_lost(self, exc: Exception | None) -> None:
                self.flow.resume_writing()  # as uvicorn's protocols do: sends wake
                lost.set()

        server = await loop.create_server(Streamer, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        client = socket.socket()
        client.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        client.setsockopt(socket.IPPROTO_TCP, socket.TCP_MAXSEG, 536)
        client.setblocking(False)
        await loop.sock_connect(client, ("127.0.0.1", port))
        start, reads = time.monotonic(), 0
        try:
            while time.monotonic() - start < watch and not lost.is_set():
                try:
                    if client.recv(4096):
                        reads += 1
                except BlockingIOError:
                    pass
                except ConnectionError:
                    break
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(lost.wait(), 0.2)
            return (time.monotonic() - start if lost.is_set() else None), reads
        finally:
            client.close()
            server.close()
            await server.wait_closed()

    return asyncio.run(main())


def test_a_reader_that_drains_a_little_at_intervals_is_closed_after_the_send_timeout(
        ) -> None:
    buffers = SendBuffers(256 * 1024 * 1024, send_timeout=1.0)
    closed_at, reads = serve_to_a_trickling_reader(
        lambda transport: _AccountedFlowControl(transport, buffers), watch=4.0)
    # Behind from the start, however it drains: closed at the timeout and a tick.
    assert closed_at is not None, "the connection was not closed"
    assert 0.9 < closed_at < 2.0, closed_at
    assert reads >= 3  # it was taking something all along
    assert buffers.closed_behind == 1 and buffers.held == 0 and buffers.behind == 0


def test_over_the_concurrency_limit_a_request_gets_a_json_503(tmp_path: Path) -> None:
    server = start_server(tmp_path, "--limit-concurrency", "2", name="limit")
    url = urlsplit(server.base_url)
    idle = [socket.create_connection((url.hostname, url.port)) for _ in range(2)]
    try:
        time.sleep(0.5)  # both are accepted: two connections open
        r = httpx.get(f"{server.v1}/models", timeout=10)
        assert r.status_code == 503
        assert r.headers["content-type"].startswith("application/json")
        assert r.headers["connection"] == "close"
        error = r.json()["error"]
        assert set(error) == {"message", "type", "param", "code"}
        assert error["code"] == "service_unavailable"
        assert "--limit-concurrency" in error["message"]
    finally:
        for sock in idle:
            sock.close()
    try:
        deadline = time.monotonic() + 10
        while (r := httpx.get(f"{server.v1}/models", timeout=10)).status_code == 503:
            assert time.monotonic() < deadline
            time.sleep(0.2)
        assert r.status_code == 200
    finally:
        stop_server(server)


@pytest.mark.parametrize("flag, value", [("--send-buffer-mb", "0"),
                                         ("--limit-concurrency", "0")])
def test_the_bounds_are_checked(tmp_path: Path, flag: str, value: str) -> None:
    server = start_server(tmp_path, flag, value, name="bad", wait=False)
    assert server.process.wait(timeout=60) == 2
    assert flag in server.log_text()
