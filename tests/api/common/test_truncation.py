"""A prompt that outgrows the context: a 400 by default; cut to fit where the request
(OpenAI chat's `truncation`, Ollama's `truncate`) or the server (--truncation auto) asks,
the system message and the latest turn kept, what was dropped in the headers."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from conftest import DEFAULT_MODEL, RunningServer, start_server, stop_server

N_CTX = 1024
ARGS = ("--ctx-size", str(N_CTX), "--parallel", "1")
SYSTEM = {"role": "system", "content": "You keep a ship's log. Answer in one short line."}


def conversation(turns: int) -> list[dict[str, str]]:
    """A system message and `turns` exchanges of about 120 tokens each, then a question."""
    messages: list[dict[str, str]] = [SYSTEM]
    for k in range(turns):
        entry = " ".join(f"log{k}entry{j}" for j in range(25))
        messages += [{"role": "user", "content": f"Day {k}: {entry}"},
                     {"role": "assistant", "content": f"Noted day {k}."}]
    return [*messages, {"role": "user", "content": "What happened last?"}]


LONG = conversation(12)  # well over 1,024 tokens
RAW = "Once upon a time " + " ".join(f"word{j}" for j in range(700))


def _server(tmp_path_factory: pytest.TempPathFactory, *extra: str) -> Iterator[RunningServer]:
    server = start_server(tmp_path_factory.mktemp("truncation"), *ARGS, *extra)
    yield server
    stop_server(server)
    assert "Traceback" not in server.log_text()


@pytest.fixture(scope="module")
def plain(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    yield from _server(tmp_path_factory)


@pytest.fixture(scope="module")
def cutting(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    yield from _server(tmp_path_factory, "--truncation", "auto")


def chat(server: RunningServer, **fields: Any) -> httpx.Response:
    return httpx.post(f"{server.v1}/chat/completions", timeout=120, json={
        "model": DEFAULT_MODEL, "messages": LONG, "max_tokens": 8, "temperature": 0,
        **fields})


def chat_tokens(server: RunningServer, messages: list[dict[str, str]]) -> int:
    """Tokens of the chat's prompt (more than the context: N_CTX + 1)."""
    r = httpx.post(f"{server.base_url}/tokenize", timeout=60,
                   json={"model": DEFAULT_MODEL, "messages": messages})
    if r.status_code == 400 and r.json()["error"]["code"] == "context_length_exceeded":
        return N_CTX + 1
    assert r.status_code == 200, r.text
    return len(r.json()["tokens"])


def assert_kept_system_and_latest(server: RunningServer, response: httpx.Response,
                                  prompt_tokens: int) -> None:
    """The dropped count is whole turns; the prompt evaluated is exactly the system
    message and the turns after the dropped ones, and fits with room for the answer."""
    dropped = int(response.headers["X-Truncated-Messages"])
    assert dropped > 0 and dropped % 2 == 0  # user + assistant, turn by turn
    kept = [LONG[0], *LONG[1 + dropped:]]
    assert prompt_tokens == chat_tokens(server, kept)
    assert prompt_tokens + 8 <= N_CTX
    # Only as many turns as needed went: with one turn fewer dropped it would not fit.
    assert chat_tokens(server, [LONG[0], *LONG[dropped - 1:]]) > N_CTX - 8


def assert_too_long(response: httpx.Response) -> None:
    assert response.status_code == 400, response.text
    assert "X-Truncated-Messages" not in response.headers


def test_openai_chat_is_refused_unless_asked(plain: RunningServer) -> None:
    refused = chat(plain)
    assert_too_long(refused)
    assert refused.json()["error"]["code"] == "context_length_exceeded"
    assert_too_long(chat(plain, truncation="disabled"))

    r = chat(plain, truncation="auto")
    assert r.status_code == 200, r.text
    assert_kept_system_and_latest(plain, r, r.json()["usage"]["prompt_tokens"])
    assert r.json()["choices"][0]["finish_reason"] in ("stop", "length")
    # A chat that fits is not touched.
    short = chat(plain, truncation="auto", messages=conversation(1))
    assert short.status_code == 200 and "X-Truncated-Messages" not in short.headers


def test_openai_chat_streamed_says_what_it_dropped(plain: RunningServer) -> None:
    with httpx.stream("POST", f"{plain.v1}/chat/completions", timeout=120, json={
            "model": DEFAULT_MODEL, "messages": LONG, "max_tokens": 4, "stream": True,
            "truncation": "auto"}) as r:
        assert r.status_code == 200
        assert int(r.headers["X-Truncated-Messages"]) > 0
        assert any(line == "data: [DONE]" for line in r.iter_lines())


def test_a_latest_turn_that_alone_does_not_fit_is_still_refused(plain: RunningServer) -> None:
    huge = [SYSTEM, {"role": "user", "content": " ".join(f"w{j}" for j in range(1500))}]
    assert_too_long(chat(plain, truncation="auto", messages=huge))


def test_ollama_chat_truncate(plain: RunningServer) -> None:
    body = {"model": DEFAULT_MODEL, "messages": LONG, "stream": False,
            "options": {"num_predict": 8, "temperature": 0}}
    refused = httpx.post(f"{plain.base_url}/api/chat", timeout=120, json=body)
    assert refused.status_code == 400 and "error" in refused.json()
    r = httpx.post(f"{plain.base_url}/api/chat", timeout=120,
                   json={**body, "truncate": True, "shift": True})
    assert r.status_code == 200, r.text
    assert_kept_system_and_latest(plain, r, r.json()["prompt_eval_count"])
    # A smaller num_ctx: more turns go, the prompt fits it.
    small = httpx.post(f"{plain.base_url}/api/chat", timeout=120, json={
        **body, "truncate": True, "options": {"num_predict": 8, "num_ctx": 512}})
    assert small.status_code == 200, small.text
    assert int(small.headers["X-Truncated-Messages"]) > int(r.headers["X-Truncated-Messages"])
    assert small.json()["prompt_eval_count"] + 8 <= 512


def test_ollama_generate_truncate(plain: RunningServer) -> None:
    for extra in ({"raw": True}, {}):  # a raw prompt, and one in the chat template
        body = {"model": DEFAULT_MODEL, "prompt": RAW, "stream": False, **extra,
                "options": {"num_predict": 8, "temperature": 0, "num_keep": 5}}
        refused = httpx.post(f"{plain.base_url}/api/generate", timeout=120, json=body)
        assert refused.status_code == 400, refused.text
        r = httpx.post(f"{plain.base_url}/api/generate", timeout=120,
                       json={**body, "truncate": True})
        assert r.status_code == 200, r.text
        dropped = int(r.headers["X-Truncated-Tokens"])
        count = r.json()["prompt_eval_count"]
        # Cut to leave exactly num_predict's room: its head (num_keep) and its tail.
        assert dropped > 0 and count == N_CTX - 8
        if not extra:  # the `context` given back is the cut prompt and the answer
            assert len(r.json()["context"]) == count + r.json()["eval_count"]


def test_server_default_and_request_override(cutting: RunningServer) -> None:
    r = chat(cutting)
    assert r.status_code == 200, r.text
    assert_kept_system_and_latest(cutting, r, r.json()["usage"]["prompt_tokens"])
    assert_too_long(chat(cutting, truncation="disabled"))
    ollama = httpx.post(f"{cutting.base_url}/api/chat", timeout=120, json={
        "model": DEFAULT_MODEL, "messages": LONG, "stream": False, "truncate": False,
        "options": {"num_predict": 8}})
    assert ollama.status_code == 400
    # Anthropic's Messages has no field of its own: the server's choice holds there.
    messages = httpx.post(f"{cutting.v1}/messages", timeout=120, json={
        "model": DEFAULT_MODEL, "system": SYSTEM["content"], "messages": LONG[1:],
        "max_tokens": 8})
    assert messages.status_code == 200, messages.text
    assert int(messages.headers["X-Truncated-Messages"]) > 0
    # The Responses API's own default holds: a conversation is continued whole or refused.
    responses = httpx.post(f"{cutting.v1}/responses", timeout=120, json={
        "model": DEFAULT_MODEL, "input": LONG, "max_output_tokens": 8, "store": False})
    assert_too_long(responses)
