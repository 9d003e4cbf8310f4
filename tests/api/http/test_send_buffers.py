"""Answers waiting for their readers are bounded: a connection behind for --send-timeout
is closed however it drains meanwhile, all of them together hold at most
--send-buffer-mb (the longest behind are closed first), and over --limit-concurrency a
request is answered 503 in the OpenAI error shape."""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import pytest
from conftest import DEFAULT_MODEL, RunningServer, start_server, stop_server
from uvicorn.protocols.http.flow_control import FlowControl

from edge_server.api.http.send_buffers import SendBuffers
from edge_server.send_timeout import _AccountedFlowControl


class SlowReader:
    """A raw connection streaming a long chat completion with top_logprobs 20, whose
    answer waits in the server: a small receive buffer and small segments (see
    test_slow_readers.py)."""

    def __init__(self, server: RunningServer, max_tokens: int) -> None:
        url = urlsplit(server.base_url)
        self.sock = socket.socket()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_MAXSEG, 536)
        self.sock.connect((url.hostname, url.port))
        body = json.dumps({
            "model": DEFAULT_MODEL, "max_tokens": max_tokens, "ignore_eos": True,
            "stream": True, "logprobs": True, "top_logprobs": 20,
            "messages": [{"role": "user", "content": "Tell me a long story."}]}).encode()
        self.sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                          b"Content-Type: application/json\r\nContent-Length: "
                          + str(len(body)).encode() + b"\r\n\r\n" + body)
        self.sock.setblocking(False)
        self.received = b""
        self.closed = False

    def read(self, most: int) -> None:
        """Reads up to `most` bytes of what has come; notes when the server closed."""
        while most > 0 and not self.closed:
            try:
                data = self.sock.recv(min(most, 4096))
            except BlockingIOError:
                return
            except ConnectionError:
                self.closed = True
                return
            if not data:
                self.closed = True
                return
            self.received += data
            most -= len(data)

    @property
    def whole(self) -> bool:
        return self.received.endswith(b"data: [DONE]\n\n")


def metric(server: RunningServer, name: str) -> float:
    text = httpx.get(f"{server.base_url}/metrics", timeout=10).text
    return float(next(line for line in text.splitlines()
                      if line.startswith(name + " ")).split()[-1])


def rss_mb(server: RunningServer) -> float:
    status = Path(f"/proc/{server.process.pid}/status").read_text()
    return next(int(line.split()[1]) for line in status.splitlines()
                if line.startswith("VmRSS:")) / 1024


def read_slowly(readers: list[SlowReader], until: Callable[[], bool], seconds: float,
                *, every: float = 0.5, most: int = 2048) -> float:
    """Each reader takes up to `most` bytes every `every` seconds until `until`;
    returns the time taken."""
    start = time.monotonic()
    while not until():
        assert time.monotonic() - start < seconds, "timed out"
        for reader in readers:
            reader.read(most)
        time.sleep(every)
    return time.monotonic() - start


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


def test_slow_readers_of_long_streams_hold_at_most_the_send_buffer(tmp_path: Path) -> None:
    server = start_server(tmp_path, "--parallel", "4", "--ctx-size", "2048",
                          "--send-buffer-mb", "1", "--send-timeout", "600", name="bound")
    readers: list[SlowReader] = []
    try:
        baseline = rss_mb(server)
        readers = [SlowReader(server, max_tokens=1500) for _ in range(8)]
        peak_held, peak_rss = 0.0, baseline

        def some_closed() -> bool:
            nonlocal peak_held, peak_rss
            peak_held = max(peak_held, metric(server, "edge_server_send_buffer_bytes"))
            peak_rss = max(peak_rss, rss_mb(server))
            return metric(server, "edge_server_send_buffer_closed_over_limit_total") >= 2

        read_slowly(readers, some_closed, 240, most=512)  # 1 KB a second each
        assert peak_held <= 1024 * 1024  # sampled: at most the bound between requests
        assert peak_rss - baseline < 64, (baseline, peak_rss)
        # The readers closed were the ones longest behind: their requests were
        # cancelled, so another client is served at once, whole.
        closed = [r for r in readers if r.closed]
        assert closed and not any(r.whole for r in closed)
        start = time.monotonic()
        r = httpx.post(f"{server.v1}/chat/completions", timeout=60, json={
            "model": DEFAULT_MODEL, "max_tokens": 4,
            "messages": [{"role": "user", "content": "Hi"}]})
        assert r.status_code == 200, r.text
        assert time.monotonic() - start < 30
    finally:
        for reader in readers:
            reader.sock.close()
        stop_server(server)
    assert "Traceback" not in server.log_text()
    assert "over --send-buffer-mb" in server.log_text()


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
