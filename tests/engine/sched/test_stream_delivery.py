"""Tokens held back between posts to the event loop (--stream-interval-ms): a stream
still carries every token as its own event, in order, with the text, finish reason and
usage of the same request answered whole; stops and n choices hold in the middle of a
held batch. The server here holds tokens for 300 ms, far longer than a decode step, so
most events travel in batches."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator

import httpx
import pytest
from conftest import DEFAULT_MODEL, RunningServer, start_server, stop_server

SEEDED = {"temperature": 0.8, "seed": 11, "max_tokens": 24, "draft": False}


@pytest.fixture(scope="module")
def holding(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    running = start_server(tmp_path_factory.mktemp("hold"), "--stream-interval-ms", "300",
                           "--parallel", "2", "--ctx-size", "4096", name="holding")
    yield running
    stop_server(running)


def stream_completion(server: RunningServer, body: dict) -> list[dict]:
    """The stream's chunks."""
    chunks = []
    with httpx.stream("POST", f"{server.v1}/completions", timeout=120,
                      json={"model": DEFAULT_MODEL, "stream": True,
                            "stream_options": {"include_usage": True}, **body}) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if line.startswith("data: {"):
                chunks.append(json.loads(line[6:]))
    return chunks


def test_every_token_is_its_own_event_with_the_whole_answers_text(
        holding: RunningServer) -> None:
    body = {"prompt": "Write about rivers and stones.", "ignore_eos": True, **SEEDED}
    whole = httpx.post(f"{holding.v1}/completions", timeout=120,
                       json={"model": DEFAULT_MODEL, **body}).json()
    chunks = stream_completion(holding, body)
    texts = [c["choices"][0]["text"] for c in chunks if c["choices"]]
    usage = chunks[-1]["usage"]
    assert usage["completion_tokens"] == whole["usage"]["completion_tokens"] == 24
    # One event per token (a token may carry no text of its own: part of a character).
    assert len([c for c in chunks if c["choices"]]) <= 24
    assert len([t for t in texts if t]) >= 12
    assert "".join(texts) == whole["choices"][0]["text"]
    assert chunks[-2]["choices"][0]["finish_reason"] == "length"


def test_a_stop_inside_a_held_batch_ends_the_stream_there(holding: RunningServer) -> None:
    body = {"prompt": "Count: 1, 2, 3, 4,", "max_tokens": 40, "temperature": 0,
            "draft": False}
    whole = httpx.post(f"{holding.v1}/completions", timeout=120,
                       json={"model": DEFAULT_MODEL, **body}).json()["choices"][0]["text"]
    assert len(whole) > 6
    stop = whole[4:6]  # a stop string the answer reaches after a few tokens
    chunks = stream_completion(holding, {**body, "stop": [stop]})
    text = "".join(c["choices"][0]["text"] for c in chunks if c["choices"])
    assert text == whole[: whole.index(stop)]
    assert [c["choices"][0]["finish_reason"] for c in chunks if c["choices"]][-1] == "stop"


def test_n_choices_each_get_all_their_tokens(holding: RunningServer) -> None:
    body = {"prompt": "Name a colour:", "n": 2, **SEEDED}
    whole = httpx.post(f"{holding.v1}/completions", timeout=120,
                       json={"model": DEFAULT_MODEL, **body}).json()
    chunks = stream_completion(holding, body)
    texts = {0: "", 1: ""}
    reasons = {}
    for chunk in chunks:
        for choice in chunk["choices"]:
            texts[choice["index"]] += choice["text"]
            if choice["finish_reason"]:
                reasons[choice["index"]] = choice["finish_reason"]
    assert texts == {c["index"]: c["text"] for c in whole["choices"]}
    assert reasons == {c["index"]: c["finish_reason"] for c in whole["choices"]}
    usage = chunks[-1]["usage"]  # (the second time, the prompt is cached)
    assert usage["completion_tokens"] == whole["usage"]["completion_tokens"]


def test_a_client_leaving_while_tokens_are_held_frees_its_slot(
        holding: RunningServer) -> None:
    body = {"model": DEFAULT_MODEL, "prompt": "Tell a long story.", "max_tokens": 2000,
            "ignore_eos": True, "stream": True, "draft": False}
    with httpx.stream("POST", f"{holding.v1}/completions", json=body, timeout=120) as r:
        for line in r.iter_lines():
            if line.startswith("data: {"):
                break  # the first token came: leave
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        busy = httpx.get(f"{holding.base_url}/health").json()["models"][DEFAULT_MODEL]
        if busy["busy_slots"] == 0:
            break
        time.sleep(0.1)
    assert busy["busy_slots"] == 0
