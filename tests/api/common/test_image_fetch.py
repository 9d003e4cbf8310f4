"""Image URL fetches off the preparation threads, within one deadline each, against a
local origin on 127.0.0.1 (allowed by `--image-url-networks`, as in test_image_urls.py).

Asserted: an origin that trickles header bytes (each read answered within a second) is
cut off at the fetch's deadline and its fetch thread freed; /tokenize and
/apply-template fetch image URLs on the fetch threads first, so four of them held by a
slow origin leave two chats to be answered at once; redirects to NAT64, IPv4-mapped,
6to4, site-local and multicast addresses are refused by name.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
from conftest import DEFAULT_MODEL, RunningServer, start_server, stop_server, write_test_projector

from edge_testkit.images import RELEASE, Origin, chat, png_url

DEADLINE_S = 5  # --image-url-timeout of the server whose origin trickles
FETCH_THREADS = 4  # edge_server.api.common.image_input.image_fetch.FETCH_THREADS
PARAM = "messages[0].content[0].image_url.url"
CUT_OFF: list[float] = []  # seconds each trickled connection lasted, as the origin saw


class SlowOrigin(Origin):
    """Origin's paths, and /slow-headers: a status line, then a header a byte at a time."""

    def do_GET(self) -> None:
        if self.path != "/slow-headers":
            super().do_GET()
            return
        started = time.monotonic()
        try:
            self.wfile.write(b"HTTP/1.1 200 OK\r\nX-Slow: ")
            for _ in range(1200):  # five minutes at most
                self.wfile.write(b"a")
                time.sleep(0.25)
        except OSError:
            CUT_OFF.append(time.monotonic() - started)


@pytest.fixture(scope="module")
def origin() -> Iterator[str]:
    import http.server

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), SlowOrigin)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


def _fetching(tmp: Path, deadline_s: int, name: str) -> RunningServer:
    projector = write_test_projector(tmp / "mmproj.gguf")
    return start_server(tmp, "--mmproj", str(projector), "--image-urls", "on",
                        "--image-url-networks", "127.0.0.1/32", "--image-url-timeout",
                        str(deadline_s), "--parallel", "2", name=name)


@pytest.fixture(scope="module")
def fetching(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    """A deadline longer than a chat takes on a busy machine: fetches stay held."""
    server = _fetching(tmp_path_factory.mktemp("image-fetch"), 150, "image-fetch")
    yield server
    stop_server(server)
    assert "Traceback" not in server.log_text()


def test_trickled_headers_are_cut_off_at_the_deadline(tmp_path: Path, origin: str) -> None:
    CUT_OFF.clear()
    server = _fetching(tmp_path, DEADLINE_S, "trickled")
    try:
        started = time.monotonic()
        with ThreadPoolExecutor(FETCH_THREADS) as pool:
            answers = list(pool.map(lambda _: chat(server, f"{origin}/slow-headers"),
                                    range(FETCH_THREADS)))
        took = time.monotonic() - started
        _check_cut_off(answers, took)
        # ... so every fetch thread is free again.
        r = chat(server, f"{origin}/picture.png", max_tokens=1)
        assert r.status_code == 200, r.text
    finally:
        stop_server(server)
    assert "Traceback" not in server.log_text()


def _check_cut_off(answers: list[httpx.Response], took: float) -> None:
    for r in answers:
        assert r.status_code == 400, r.text
        error = r.json()["error"]
        assert error["param"] == PARAM and error["code"] == "image_fetch_failed"
        assert "deadline" in error["message"], error
    assert took < DEADLINE_S + 15, took  # answered once the fetches gave up
    # The origin saw every connection dropped at the deadline: before, each read of a
    # header byte renewed the timeout and the fetch threads were held for good ...
    for _ in range(40):
        if len(CUT_OFF) == FETCH_THREADS:
            break
        time.sleep(0.25)
    assert len(CUT_OFF) == FETCH_THREADS, CUT_OFF
    assert max(CUT_OFF) < DEADLINE_S + 3, CUT_OFF


def _held_template(server: RunningServer, origin: str, route: str) -> httpx.Response:
    parts = [{"type": "image_url", "image_url": {"url": f"{origin}/held.png"}},
             {"type": "text", "text": "What is in the picture?"}]
    return httpx.post(f"{server.base_url}/{route}", timeout=180, json={
        "model": DEFAULT_MODEL, "messages": [{"role": "user", "content": parts}]})


def test_held_tokenize_and_apply_template_fetches_leave_chats_alone(
        fetching: RunningServer, origin: str) -> None:
    RELEASE.clear()
    try:
        with ThreadPoolExecutor(6) as pool:
            held = [pool.submit(_held_template, fetching, origin, route)
                    for route in ("tokenize", "apply-template") * 2]
            time.sleep(1.0)  # the four fetches have started
            inline = [pool.submit(chat, fetching, png_url(60 + i), max_tokens=1)
                      for i in range(2)]
            # Answered while the four fetches are held: before, /tokenize and
            # /apply-template fetched on the preparation threads and held them all.
            assert [f.result(timeout=140).status_code for f in inline] == [200, 200]
            assert not any(f.done() for f in held), [f.result().text for f in held if f.done()]
            RELEASE.set()
            answers = [f.result(timeout=140) for f in held]
    finally:
        RELEASE.set()
    assert [r.status_code for r in answers] == [200] * 4, [r.text for r in answers]
    tokens, prompt = answers[0].json()["tokens"], answers[1].json()["prompt"]
    assert len(tokens) > 16 and "<__media__>" in prompt


@pytest.mark.parametrize("target", [
    "http://[64:ff9b::a9fe:a9fe]/x.png",  # NAT64 of 169.254.169.254
    "http://[::ffff:169.254.169.254]/x.png",  # IPv4-mapped
    "http://[2002:a9fe:a9fe::1]/x.png",  # 6to4
    "http://[fec0::1]/x.png",  # site-local
    "http://224.0.0.1/x.png",  # multicast
])
def test_redirects_to_denied_ranges_are_refused(fetching: RunningServer, origin: str,
                                                target: str) -> None:
    r = chat(fetching, f"{origin}/to?url={target}")
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["code"] == "image_url_not_allowed" and error["param"] == PARAM, error
