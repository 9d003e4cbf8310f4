"""Cheap refusal: once every slot and queue place is taken, a generation request gets a
429 with Retry-After before its body is read, parsed or validated, so that clients
retrying at once in a storm cost the server little. Other routes are still served."""

from __future__ import annotations

import contextlib
import json
import socket
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from urllib.parse import urlsplit

import httpx
import pytest
from conftest import DEFAULT_MODEL, RunningServer, start_server, stop_server


@pytest.fixture(scope="module")
def one_slot(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    # One slot and one queue place: two requests in flight fill it.
    server = start_server(tmp_path_factory.mktemp("admission"), "--parallel", "1",
                          "--max-queue", "1", "--ctx-size", "4096", name="admission")
    yield server
    stop_server(server)
    assert "Traceback" not in server.log_text()


@contextlib.contextmanager
def held_streams(server: RunningServer, count: int) -> Iterator[None]:
    """`count` streaming completions admitted and still running (raw connections that
    send their request and read nothing: a queued stream sends no headers until it
    starts), until the block ends and they are dropped. Long ones: a place is held
    while the engine works on its request, not while a client does not read."""
    url = urlsplit(server.base_url)
    # Undrafted: a looping answer drafts so well that 4,000 tokens took seconds.
    body = json.dumps({"model": DEFAULT_MODEL, "prompt": "Once upon a time",
                       "max_tokens": 4000, "ignore_eos": True, "stream": True,
                       "draft": False}).encode()
    with contextlib.ExitStack() as stack:
        for held in range(1, count + 1):
            sock = stack.enter_context(socket.create_connection((url.hostname, url.port)))
            sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                         b"Content-Type: application/json\r\n"
                         + f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
            # One at a time: seated or queued before the next comes.
            deadline = time.monotonic() + 30
            # Both counts: the engine's slots may still show the last test's dropped streams.
            while (engine_holds(server) < held
                   or metric(server, "edge_server_requests_admitted") < held):
                assert time.monotonic() < deadline, "the streams were not admitted"
                time.sleep(0.1)
        yield
    # Dropped: their places are free once the server has seen them go.
    deadline = time.monotonic() + 30
    # ...and the engine has let go of their slots too (the next test counts them).
    while metric(server, "edge_server_requests_admitted") > 0 or engine_holds(server) > 0:
        assert time.monotonic() < deadline, "the dropped streams kept their places"
        time.sleep(0.1)


def engine_holds(server: RunningServer) -> int:
    stats = httpx.get(f"{server.base_url}/health", timeout=10).json()["models"][DEFAULT_MODEL]
    return int(stats["busy_slots"] + stats["waiting"])


def metric(server: RunningServer, name: str) -> float:
    text = httpx.get(f"{server.base_url}/metrics", timeout=10).text
    return float(next(line for line in text.splitlines() if line.startswith(name)).split()[-1])


def raw_post_without_body(server: RunningServer, path: str) -> bytes:
    """Headers that promise a body which never comes: only an answer that reads no body
    can arrive."""
    url = urlsplit(server.base_url)
    with socket.create_connection((url.hostname, url.port), timeout=10) as sock:
        sock.sendall(f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: "
                     "application/json\r\nContent-Length: 100000\r\n\r\n".encode())
        return sock.recv(4096)


def test_refused_before_the_body_is_read(one_slot: RunningServer) -> None:
    with held_streams(one_slot, 2):
        # A body that is not even JSON: refused for load, not for its content.
        r = httpx.post(f"{one_slot.v1}/chat/completions", content=b"{not json",
                       headers={"Content-Type": "application/json"}, timeout=10)
        assert r.status_code == 429, r.text
        assert int(r.headers["Retry-After"]) >= 1
        assert r.json()["error"]["code"] == "server_overloaded"
        # A body that never arrives: answered at once all the same.
        head = raw_post_without_body(one_slot, "/v1/completions")
        assert head.startswith(b"HTTP/1.1 429"), head[:80]
        assert b"retry-after: 1" in head.lower()
        # Anthropic's door answers in Anthropic's shape.
        r = httpx.post(f"{one_slot.v1}/messages", content=b"[]", timeout=10)
        assert r.status_code == 429 and r.json()["error"]["type"] == "rate_limit_error"
        # What is not generation is served.
        assert httpx.get(f"{one_slot.v1}/models", timeout=10).status_code == 200
        assert httpx.post(f"{one_slot.base_url}/tokenize", timeout=10, json={
            "model": DEFAULT_MODEL, "content": "hi"}).status_code == 200
        assert metric(one_slot, "edge_server_requests_refused_unread_total") >= 3


    # The held streams are dropped: their requests end, and the door opens again.
    deadline = time.monotonic() + 60
    while True:
        r = httpx.post(f"{one_slot.v1}/completions", timeout=60, json={
            "model": DEFAULT_MODEL, "prompt": "Hello", "max_tokens": 2})
        if r.status_code == 200 or time.monotonic() > deadline:
            break
        assert r.status_code == 429
        time.sleep(0.2)
    assert r.status_code == 200, r.text


# Every door that queues for a slot: OpenAI's (also without /v1), Anthropic's,
# Ollama's and llama-server's.
GENERATING_PATHS = ["/v1/completions", "/completions", "/v1/chat/completions",
                    "/chat/completions", "/v1/responses", "/v1/messages", "/api/chat",
                    "/api/generate", "/completion", "/infill"]


def test_every_generating_door_refuses_unread(one_slot: RunningServer) -> None:
    with held_streams(one_slot, 2):
        for path in GENERATING_PATHS:
            head = raw_post_without_body(one_slot, path)
            assert head.split(b"\r\n")[0] == b"HTTP/1.1 429 Too Many Requests", (path, head)
        # Each counted under its own route.
        text = httpx.get(f"{one_slot.base_url}/metrics", timeout=10).text
        for path in GENERATING_PATHS:
            assert f'endpoint="{path}",status="429"' in text, path


def test_a_storm_of_refusals_is_held_for_retry_after(one_slot: RunningServer) -> None:
    """Refusals faster than 20 a second are held for Retry-After before they are sent:
    a client retrying at once then retries once a second, and costs the server a
    sleeping coroutine, not CPU. The first refusals of a quiet second go out at once."""
    with held_streams(one_slot, 2):
        time.sleep(2.2)  # earlier refusals of this module's tests are out of the window

        def refuse() -> float:
            start = time.monotonic()
            r = httpx.post(f"{one_slot.v1}/completions", content=b"{}", timeout=10)
            assert r.status_code == 429 and r.headers["Retry-After"] == "1"
            return time.monotonic() - start

        first = [refuse() for _ in range(10)]
        assert max(first) < 0.5  # a few refusals: answered at once
        # A storm: 30 clients retrying together, so well over 20 refusals fall within
        # one second however slow this machine is at making one connection.
        with ThreadPoolExecutor(max_workers=30) as pool:
            waits = list(pool.map(lambda _: refuse(), range(30)))
        assert max(waits) >= 0.9
        assert metric(one_slot, "edge_server_requests_refused_unread_total") >= 40
