"""A stored turn's http(s) image URL keeps its chain working: the follow-up turn renders
the whole conversation, images and all, so the stored URL is fetched again with the new
input's (the store keeps the URL as it was sent, not the image)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from conftest import DEFAULT_MODEL, RunningServer, start_server, stop_server

from edge_testkit.images import origin, projector

__all__ = ["origin", "projector"]


@pytest.fixture(scope="module")
def fetching(tmp_path_factory: pytest.TempPathFactory, projector: Path,
             ) -> Iterator[RunningServer]:
    tmp = tmp_path_factory.mktemp("chained-images")
    server = start_server(tmp, "--mmproj", str(projector), "--image-urls", "on",
                          "--image-url-networks", "127.0.0.1/32", "--parallel", "2",
                          "--state-dir", str(tmp / "state"), name="chained-images")
    yield server
    stop_server(server)
    assert "Traceback" not in server.log_text()


def create(server: RunningServer, **body: object) -> httpx.Response:
    return httpx.post(f"{server.v1}/responses", timeout=120, json={
        "model": DEFAULT_MODEL, "max_output_tokens": 3, "temperature": 0, **body})


def test_a_stored_image_url_is_fetched_again_for_the_next_turn(
        fetching: RunningServer, origin: str) -> None:
    first = create(fetching, input=[{"role": "user", "content": [
        {"type": "input_text", "text": "What is in the picture?"},
        {"type": "input_image", "image_url": f"{origin}/picture.png"}]}])
    assert first.status_code == 200, first.text
    second = create(fetching, input="And its colours?",
                    previous_response_id=first.json()["id"])
    assert second.status_code == 200, second.text
    assert second.json()["usage"]["input_tokens"] > first.json()["usage"]["input_tokens"]
    third = create(fetching, input="Thanks.", previous_response_id=second.json()["id"])
    assert third.status_code == 200, third.text
    # The stored item lists the URL as it was sent.
    items = httpx.get(f"{fetching.v1}/responses/{third.json()['id']}/input_items",
                      params={"order": "asc"}).json()["data"]
    assert items[0]["content"][1] == {"type": "input_image",
                                      "image_url": f"{origin}/picture.png"}
