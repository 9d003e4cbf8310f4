"""Slow readers hold no capacity: a request's admission place and model lease are
released once the engine is done with it, not when a client that stopped reading has
read its answer; the answer waits for it whole. A client that stops reading has its
connection closed --send-timeout seconds after it fell behind, and what it held is freed."""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Callable, Iterator
from urllib.parse import urlsplit

import h11
import httpx
import pytest
from conftest import DEFAULT_MODEL, RunningServer, start_server, stop_server

TOKENS = 1500


@pytest.fixture(scope="module")
def one_slot(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    # One slot and one queue place: two requests in flight fill it. Sends may wait long
    # here, and the queued stream too (on a loaded machine the first takes minutes): the
    # readers below read only once the engine has finished both streams.
    server = start_server(tmp_path_factory.mktemp("slow"), "--parallel", "1",
                          "--max-queue", "1", "--ctx-size", "2048", "--send-timeout",
                          "1200", "--queue-timeout", "1200", name="slow-readers")
    yield server
    stop_server(server)
    assert "Traceback" not in server.log_text()


class StalledReader:
    """A raw connection that sends a long streamed completion and reads nothing until
    told to, made so that the server's sends soon wait on it: its receive buffer is
    small, and so are its segments (on loopback, whose segments are 64 KiB, the
    server's send buffer would otherwise start at megabytes and hold the whole answer);
    the server then holds about 200 KB before a send waits, and the answer with its
    logprobs is some 600 KB."""

    def __init__(self, server: RunningServer, max_tokens: int = TOKENS) -> None:
        url = urlsplit(server.base_url)
        self.sock = socket.socket()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_MAXSEG, 536)
        self.sock.connect((url.hostname, url.port))
        self.http = h11.Connection(h11.CLIENT)
        body = json.dumps({"model": DEFAULT_MODEL, "prompt": "Once upon a time",
                           "max_tokens": max_tokens, "ignore_eos": True, "stream": True,
                           "logprobs": 5, "stream_options": {"include_usage": True}}
                          ).encode()
        request = h11.Request(method="POST", target="/v1/completions", headers=[
            ("Host", "127.0.0.1"), ("Content-Type", "application/json"),
            ("Content-Length", str(len(body)))])
        self.sock.sendall(self.http.send(request) + self.http.send(h11.Data(data=body))
                          + self.http.send(h11.EndOfMessage()))

    def read_all(self, timeout: float = 60) -> tuple[int, bytes, bool]:
        """The status, the body, and whether it ended whole (not cut off)."""
        self.sock.settimeout(timeout)
        status, body = 0, bytearray()
        while True:
            event = self.http.next_event()
            if event is h11.NEED_DATA:
                try:
                    data = self.sock.recv(65536)
                except ConnectionResetError:
                    return status, bytes(body), False
                if not data:
                    return status, bytes(body), False
                self.http.receive_data(data)
            elif isinstance(event, h11.Response):
                status = event.status_code
            elif isinstance(event, h11.Data):
                body += event.data
            elif isinstance(event, h11.EndOfMessage):
                return status, bytes(body), True

    def close(self) -> None:
        self.sock.close()


def health(server: RunningServer) -> dict:
    return httpx.get(f"{server.base_url}/health", timeout=10).json()


def engine_holds(server: RunningServer) -> int:
    stats = health(server).get("models", {}).get(DEFAULT_MODEL)
    return int(stats["busy_slots"] + stats["waiting"]) if stats else 0


def metric(server: RunningServer, name: str) -> float:
    text = httpx.get(f"{server.base_url}/metrics", timeout=10).text
    return float(next(line for line in text.splitlines()
                      if line.startswith(name + " ")).split()[-1])


def wait_for(condition: Callable[[], bool], what: str, timeout: float = 1200) -> None:
    """Waits for `condition`; long by default: a loaded 2-core machine decodes these
    streams at a few tokens a second."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.2)


def short_completion(server: RunningServer) -> httpx.Response:
    return httpx.post(f"{server.v1}/completions", timeout=60, json={
        "model": DEFAULT_MODEL, "prompt": "Hello", "max_tokens": 2})


def sse_events(body: bytes) -> list[str]:
    return [block.removeprefix("data: ") for block in body.decode().split("\n\n") if block]


def test_readers_that_stop_reading_hold_nothing_once_the_engine_is_done(
        one_slot: RunningServer) -> None:
    readers = []
    try:
        for held in (1, 2):  # one seated, one queued: the server is full
            readers.append(StalledReader(one_slot))
            wait_for(lambda held=held: engine_holds(one_slot) >= held,  # type: ignore[misc]
                     "the streams were not admitted", timeout=30)
        assert short_completion(one_slot).status_code == 429

        # The engine finishes both streams although neither client read a byte.
        wait_for(lambda: engine_holds(one_slot) == 0, "the engine did not finish")
        # Their sends wait on the readers: both responses are still being sent...
        assert metric(one_slot, "edge_server_requests_in_flight") == 2
        # ...yet they hold no admission place, and no lease on the model.
        assert metric(one_slot, "edge_server_requests_admitted") == 0
        assert health(one_slot)["models"][DEFAULT_MODEL]["leases"] == 0
        r = short_completion(one_slot)
        assert r.status_code == 200, r.text
        # The model can unload (Ollama's keep_alive 0 unloads it once unused).
        r = httpx.post(f"{one_slot.base_url}/api/generate", timeout=60,
                       json={"model": DEFAULT_MODEL, "keep_alive": 0})
        assert r.status_code == 200, r.text
        ps = httpx.get(f"{one_slot.base_url}/api/ps", timeout=10).json()
        assert ps["models"] == []

        # The readers read at last: every token of their answers is there.
        for reader in readers:
            status, body, whole = reader.read_all()
            assert status == 200 and whole
            events = sse_events(body)
            assert events[-1] == "[DONE]"
            chunks = [json.loads(e) for e in events[:-1]]
            usage = chunks[-1]["usage"]
            assert usage["completion_tokens"] == TOKENS
            texts = [c["choices"][0] for c in chunks if c["choices"]]
            assert texts[-1]["finish_reason"] == "length"
            assert len(texts) >= TOKENS * 0.9  # each token its own event (a few merge)
    finally:
        for reader in readers:
            reader.close()
    wait_for(lambda: metric(one_slot, "edge_server_requests_in_flight") == 0,
             "the responses did not end", timeout=30)


def test_a_reader_that_reads_nothing_past_the_send_timeout_is_cut_off(
        tmp_path_factory: pytest.TempPathFactory) -> None:
    server = start_server(tmp_path_factory.mktemp("send-timeout"), "--parallel", "1",
                          "--ctx-size", "2048", "--send-timeout", "2", name="send-timeout")
    try:
        reader = StalledReader(server)
        try:
            wait_for(lambda: engine_holds(server) == 1, "the stream was not admitted", 30)
            wait_for(lambda: engine_holds(server) == 0, "the engine did not finish")
            # Closed the timeout (and a tick) after it fell behind: perhaps before the
            # engine finished, whose work is then cancelled.
            wait_for(lambda: metric(server, "edge_server_requests_in_flight") == 0,
                     "the connection was not closed", timeout=15)
            status, body, whole = reader.read_all(timeout=10)
            assert status == 200 and not whole
            assert b"[DONE]" not in body
        finally:
            reader.close()
        assert short_completion(server).status_code == 200
    finally:
        stop_server(server)
    assert "Traceback" not in server.log_text()
    assert "it has been behind for 2 s" in server.log_text()
