"""An answer nobody bounded: at most --default-max-tokens, and ended by
--max-answer-seconds after it arrived (finish_reason length), on every door; a bound the
request sets (max_tokens, n_predict, num_predict, max_output_tokens) is its own."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from conftest import RunningServer, start_server, stop_server

DEFAULT_CAP = 7
# A request that runs until something stops it: the end-of-generation token is ignored.
ENDLESS = {"messages": [{"role": "user", "content": "Count from one to one thousand."}],
           "temperature": 0, "ignore_eos": True}


def _server(tmp_path_factory: pytest.TempPathFactory, *args: str) -> Iterator[RunningServer]:
    server = start_server(tmp_path_factory.mktemp("answer-bounds"), *args)
    yield server
    stop_server(server)
    assert "Traceback" not in server.log_text()


@pytest.fixture(scope="module")
def capped(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    yield from _server(tmp_path_factory, "--parallel", "2", "--ctx-size", "1024",
                       "--default-max-tokens", str(DEFAULT_CAP), "--max-answer-seconds", "0")


@pytest.fixture(scope="module")
def timed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    yield from _server(tmp_path_factory, "--parallel", "2", "--max-answer-seconds", "1")


def post(server: RunningServer, path: str, body: dict[str, Any]) -> dict[str, Any]:
    r = httpx.post(f"{server.base_url}{path}", json=body, timeout=300)
    assert r.status_code == 200, r.text
    return r.json()  # type: ignore[no-any-return]


def test_an_unbounded_chat_takes_the_default_cap(capped: RunningServer) -> None:
    body = post(capped, "/v1/chat/completions", ENDLESS)
    assert body["usage"]["completion_tokens"] == DEFAULT_CAP
    assert body["choices"][0]["finish_reason"] == "length"


def test_a_bound_the_request_sets_is_its_own(capped: RunningServer) -> None:
    body = post(capped, "/v1/chat/completions", {**ENDLESS, "max_tokens": DEFAULT_CAP + 5})
    assert body["usage"]["completion_tokens"] == DEFAULT_CAP + 5
    native = post(capped, "/completion", {"prompt": "Count: one, two,", "n_predict": 20,
                                          "ignore_eos": True, "temperature": 0})
    assert native["tokens_predicted"] == 20
    # /v1/completions keeps OpenAI's default of 16 tokens.
    legacy = post(capped, "/v1/completions", {"prompt": "Count: one, two,", "ignore_eos": True,
                                              "temperature": 0})
    assert legacy["usage"]["completion_tokens"] == 16


def test_the_other_doors_take_the_default_cap(capped: RunningServer) -> None:
    question = "Write a long story about a lighthouse keeper and the sea."
    ollama = post(capped, "/api/chat", {"model": "default", "stream": False,
                                        "messages": [{"role": "user", "content": question}]})
    assert 1 <= ollama["eval_count"] <= DEFAULT_CAP
    if ollama["eval_count"] == DEFAULT_CAP:
        assert ollama["done_reason"] == "length"
    chosen = post(capped, "/api/chat", {"model": "default", "stream": False,
                                        "options": {"num_predict": DEFAULT_CAP + 3},
                                        "messages": [{"role": "user", "content": question}]})
    assert chosen["eval_count"] <= DEFAULT_CAP + 3
    responses = post(capped, "/v1/responses", {"model": "default", "input": question})
    assert 1 <= responses["usage"]["output_tokens"] <= DEFAULT_CAP
    if responses["usage"]["output_tokens"] == DEFAULT_CAP:
        assert responses["status"] == "incomplete"
        assert responses["incomplete_details"] == {"reason": "max_output_tokens"}


def test_an_unbounded_answer_ends_at_the_time_ceiling(timed: RunningServer) -> None:
    started = time.monotonic()
    body = post(timed, "/v1/chat/completions", ENDLESS)
    elapsed = time.monotonic() - started
    room = timed_room(timed) - body["usage"]["prompt_tokens"]
    assert body["choices"][0]["finish_reason"] == "length"
    assert 1 <= body["usage"]["completion_tokens"] < room
    assert elapsed < 30, elapsed
    # Streamed, the same ceiling ends it with a length.
    with httpx.stream("POST", f"{timed.v1}/chat/completions", timeout=300,
                      json={**ENDLESS, "stream": True}) as r:
        assert r.status_code == 200
        reasons = [line for line in r.iter_lines() if '"finish_reason":"length"' in line]
    assert reasons


def test_a_bounded_answer_is_not_cut_by_the_time_ceiling(timed: RunningServer) -> None:
    body = post(timed, "/v1/chat/completions", {**ENDLESS, "max_tokens": 300})
    assert body["usage"]["completion_tokens"] == 300
    budget = post(timed, "/v1/chat/completions", {**ENDLESS, "max_tokens": None,
                                                  "t_max_predict_ms": 60_000, "n_predict": 200})
    assert budget["usage"]["completion_tokens"] == 200


def timed_room(server: RunningServer) -> int:
    props = httpx.get(f"{server.base_url}/props", timeout=30).json()
    return int(props["default_generation_settings"]["n_ctx"])
