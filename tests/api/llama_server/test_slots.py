"""GET /slots, llama-server's read-only view of the slots: 501 unless the server runs
with --slots, behind the API key, and it follows a request through its slot."""

from __future__ import annotations

import json
from collections.abc import Iterator

import httpx
import pytest
from conftest import RunningServer, start_server, stop_server

KEY = "slots-test-key"
AUTH = {"Authorization": f"Bearer {KEY}"}
SLOT_KEYS = {"id", "n_ctx", "speculative", "is_processing", "n_cached_tokens",
             "n_prompt_tokens", "params", "next_token"}


@pytest.fixture(scope="module")
def with_slots(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    server = start_server(tmp_path_factory.mktemp("slots"), "--slots", "--api-key", KEY,
                          "--ctx-size", "1024", "--parallel", "1")
    yield server
    stop_server(server)
    assert "Traceback" not in server.log_text()


def test_slots_are_off_by_default_with_a_501(http: httpx.Client) -> None:
    answer = http.get("/slots")
    assert answer.status_code == 501
    error = answer.json()["error"]
    assert error["type"] == "not_supported_error" and "--slots" in error["message"]


def test_slots_need_the_api_key(with_slots: RunningServer) -> None:
    assert httpx.get(with_slots.base_url + "/slots").status_code == 401


def test_an_idle_slot(with_slots: RunningServer) -> None:
    answer = httpx.get(with_slots.base_url + "/slots", headers=AUTH)
    assert answer.status_code == 200, answer.text
    [slot] = answer.json()
    assert set(slot) == SLOT_KEYS
    assert slot["id"] == 0 and slot["n_ctx"] == 1024 and slot["is_processing"] is False
    assert slot["next_token"]["has_next_token"] is False
    ok = httpx.get(with_slots.base_url + "/slots?fail_on_no_slot=1", headers=AUTH)
    assert ok.status_code == 200


def test_a_slot_serving_a_stream_and_after(with_slots: RunningServer) -> None:
    body = {"prompt": "Once upon a time", "max_tokens": 64, "stream": True,
            "ignore_eos": True}
    with httpx.Client(base_url=with_slots.base_url, headers=AUTH, timeout=60) as client:
        with client.stream("POST", "/v1/completions", json=body) as stream:
            lines = stream.iter_lines()
            first = next(line for line in lines if line.startswith("data: "))
            assert json.loads(first[6:])["choices"]
            [slot] = client.get("/slots").json()
            assert slot["is_processing"] is True
            assert slot["params"] == {"n_predict": 64}
            assert slot["n_prompt_tokens"] > 0
            progress = slot["next_token"]
            assert progress["has_next_token"] is True
            assert 1 <= progress["n_decoded"] <= 64
            assert progress["n_remain"] == 64 - progress["n_decoded"]
            # Every slot busy: llama-server's check for load balancers says so.
            busy = client.get("/slots?fail_on_no_slot=1")
            assert busy.status_code == 503 and busy.json()["error"]["type"]
            for _ in lines:
                pass
        [slot] = client.get("/slots").json()
    assert slot["is_processing"] is False
    assert slot["n_cached_tokens"] > 0  # the stream keeps the tokens for the next prompt
