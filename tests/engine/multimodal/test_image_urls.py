"""http(s) image URLs (`--image-urls on`) against a local origin on 127.0.0.1.

Loopback is refused unless a network allows it, so the fetching server here allows
127.0.0.1/32 (`--image-url-networks`) and a second server, without it, shows the
refusal. Asserted: one deadline per fetch (a server trickling a byte a second is cut
off), slow fetches leaving other requests' images alone, redirects checked again at
each hop, and refusals by name.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from conftest import RunningServer, start_server, stop_server

from edge_testkit.images import RELEASE, chat, origin, png_url, projector

__all__ = ["origin", "projector"]  # fixtures

FETCH_TIMEOUT_S = 3  # the trickle test's server


@pytest.fixture(scope="module")
def fetching(tmp_path_factory: pytest.TempPathFactory, projector: Path
             ) -> Iterator[RunningServer]:
    server = start_server(tmp_path_factory.mktemp("fetching"), "--mmproj", str(projector),
                          "--image-urls", "on", "--image-url-networks", "127.0.0.1/32",
                          "--image-url-timeout", "120", "--parallel", "2", name="fetching")
    yield server
    stop_server(server)


def test_image_urls_are_fetched_where_allowed(fetching: RunningServer, origin: str) -> None:
    r = chat(fetching, f"{origin}/picture.png")
    assert r.status_code == 200, r.text
    missing = chat(fetching, "http://127.0.0.1:9/none.png")
    assert missing.status_code == 400
    assert missing.json()["error"]["code"] == "image_fetch_failed"


def test_a_trickling_server_is_cut_off_at_the_deadline(
        tmp_path: Path, projector: Path, origin: str) -> None:
    server = start_server(tmp_path, "--mmproj", str(projector), "--image-urls", "on",
                          "--image-url-networks", "127.0.0.1/32", "--image-url-timeout",
                          str(FETCH_TIMEOUT_S), "--parallel", "1", name="trickled")
    try:
        started = time.monotonic()
        r = chat(server, f"{origin}/trickle.png")
        took = time.monotonic() - started
    finally:
        stop_server(server)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == "messages[0].content[0].image_url.url"
    assert "deadline" in r.json()["error"]["message"]
    # One deadline for the whole fetch, though every read got a byte within a second
    # (the PNG's 400-odd bytes would take minutes).
    assert took < FETCH_TIMEOUT_S + 10, took


def test_slow_fetches_leave_other_requests_images_alone(fetching: RunningServer,
                                                        origin: str) -> None:
    RELEASE.clear()
    with ThreadPoolExecutor(6) as pool:
        held = [pool.submit(chat, fetching, f"{origin}/held.png", max_tokens=1)
                for _ in range(4)]
        time.sleep(1.0)  # the four fetches have started
        inline = [pool.submit(chat, fetching, png_url(40 + i), max_tokens=1) for i in range(2)]
        # Prepared and answered while the four fetches are held: before, they held
        # both preparation threads until they ended.
        assert [f.result().status_code for f in inline] == [200, 200]
        assert not any(f.done() for f in held)
        RELEASE.set()
        assert [f.result().status_code for f in held] == [200] * 4


def test_redirects_are_checked_at_every_hop(fetching: RunningServer, origin: str) -> None:
    followed = chat(fetching, f"{origin}/to?url={origin}/picture.png")
    assert followed.status_code == 200, followed.text
    for target in ("http://169.254.169.254/latest/meta-data/", "http://10.1.2.3/x.png",
                   "http://[::1]:9/x.png", "http://127.0.0.2:9/x.png"):
        r = chat(fetching, f"{origin}/to?url={target}")
        assert r.status_code == 400, (target, r.text)
        error = r.json()["error"]
        assert error["code"] == "image_url_not_allowed", (target, error)
        assert error["param"] == "messages[0].content[0].image_url.url"


def test_private_addresses_are_refused_without_an_allowed_network(
        tmp_path: Path, projector: Path, origin: str) -> None:
    server = start_server(tmp_path, "--mmproj", str(projector), "--image-urls", "on",
                          "--parallel", "1", name="refusing")
    try:
        for url in (f"{origin}/picture.png", "http://localhost:9/x.png",
                    "http://192.168.0.1/x.png"):
            r = chat(server, url)
            assert r.status_code == 400, (url, r.text)
            assert r.json()["error"]["code"] == "image_url_not_allowed", (url, r.text)
    finally:
        stop_server(server)
