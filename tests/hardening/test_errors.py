"""Bad input gets an OpenAI-shaped error with the right status and `error.param`, and the
server keeps serving."""

from __future__ import annotations

import pytest
from conftest import DEFAULT_MODEL

CHAT = "/v1/chat/completions"
COMP = "/v1/completions"
MSG = [{"role": "user", "content": "hi"}]

CASES = [
    # (endpoint, body, status, param)
    (CHAT, {"model": 5, "messages": MSG}, 400, "model"),
    (CHAT, {"model": "no-such-model", "messages": MSG}, 404, "model"),
    (COMP, {"model": "no-such-model", "prompt": "x"}, 404, "model"),
    (CHAT, {"model": DEFAULT_MODEL, "messages": MSG, "temperature": 3}, 400, "temperature"),
    (CHAT, {"model": DEFAULT_MODEL, "messages": MSG, "top_p": 0}, 400, "top_p"),
    (COMP, {"model": DEFAULT_MODEL, "prompt": "x", "top_k": 0}, 400, "top_k"),
    (COMP, {"model": DEFAULT_MODEL, "prompt": "x", "min_p": 1.5}, 400, "min_p"),
    (CHAT, {"model": DEFAULT_MODEL, "messages": MSG, "n": 0}, 400, "n"),
    (COMP, {"model": DEFAULT_MODEL, "prompt": "x", "n": 129}, 400, "n"),
    (COMP, {"model": DEFAULT_MODEL, "prompt": "x", "max_tokens": 0}, 400, "max_tokens"),
    (
        CHAT,
        {"model": DEFAULT_MODEL, "messages": MSG, "stop": ["a", "b", "c", "d", "e"]},
        400,
        "stop",
    ),
    (CHAT, {"model": DEFAULT_MODEL, "messages": []}, 400, "messages"),
    (
        CHAT,
        {"model": DEFAULT_MODEL, "messages": [{"role": "wizard", "content": "x"}]},
        400,
        "messages[0].role",
    ),
    (CHAT, {"model": DEFAULT_MODEL, "messages": [{"role": "user"}]}, 400, "messages[0]"),
    (COMP, {"model": DEFAULT_MODEL, "prompt": [1, 2, 99999999]}, 400, "prompt"),
    (COMP, {"model": DEFAULT_MODEL, "prompt": [[5, 6], [-1]]}, 400, "prompt[1]"),
    (COMP, {"model": DEFAULT_MODEL, "prompt": "x", "logit_bias": {"abc": 1}}, 400, "logit_bias"),
    (COMP, {"model": DEFAULT_MODEL, "prompt": "x", "logit_bias": {"999999": 5}}, 400, "logit_bias"),
    (COMP, {"model": DEFAULT_MODEL, "prompt": "x", "logit_bias": {"5": 101}}, 400, "logit_bias"),
    (
        CHAT,
        {"model": DEFAULT_MODEL, "messages": MSG, "presence_penalty": 2.5},
        400,
        "presence_penalty",
    ),
    (
        CHAT,
        {"model": DEFAULT_MODEL, "messages": MSG, "repetition_penalty": 0},
        400,
        "repetition_penalty",
    ),
    (COMP, {"model": DEFAULT_MODEL, "prompt": "x", "logprobs": 6}, 400, "logprobs"),
    (CHAT, {"model": DEFAULT_MODEL, "messages": MSG, "top_logprobs": 21}, 400, "top_logprobs"),
    (
        COMP,
        {
            "model": DEFAULT_MODEL,
            "prompt": "x",
            "max_tokens": 100000,
            "context_length_exceeded_behavior": "error",
        },
        400,
        "max_tokens",
    ),
    (
        COMP,
        {"model": DEFAULT_MODEL, "prompt": "x", "context_length_exceeded_behavior": "drop"},
        400,
        "context_length_exceeded_behavior",
    ),
    (COMP, {"model": DEFAULT_MODEL, "prompt": ""}, 400, "prompt"),
    (COMP, {"model": DEFAULT_MODEL, "prompt": []}, 400, "prompt"),
    (
        CHAT,
        {
            "model": DEFAULT_MODEL,
            "messages": [
                {
                    "role": "user",
                    "content": [
                        {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}
                    ],
                }
            ],
        },
        400,
        "messages[0].content[0].image_url",
    ),
    (CHAT, {"model": DEFAULT_MODEL, "messages": MSG, "stream": "yes please"}, 400, "stream"),
    (
        CHAT,
        {
            "model": DEFAULT_MODEL,
            "messages": [{"role": "user", "content": "x", "name": "bad name!"}],
        },
        400,
        "messages[0].name",
    ),
]


@pytest.mark.parametrize(("path", "body", "status", "param"), CASES)
def test_bad_input(http, path: str, body: dict, status: int, param: str) -> None:
    r = http.post(path, json=body)
    assert r.status_code == status, r.text
    error = r.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["param"] == param, error
    assert error["message"]
    assert "Traceback" not in r.text and "/" not in error["message"].replace("/v1", "")


@pytest.mark.parametrize("raw", [b"{not json", b"[1, 2]", b"", b'"text"'])
def test_malformed_body(http, raw: bytes) -> None:
    r = http.post(CHAT, content=raw, headers={"Content-Type": "application/json"})
    assert r.status_code == 400
    assert r.json()["error"]["type"] == "invalid_request_error"


def test_context_overflow_error_names_sizes(http) -> None:
    r = http.post(
        COMP,
        json={
            "model": DEFAULT_MODEL,
            "prompt": "hello",
            "max_tokens": 100000,
            "context_length_exceeded_behavior": "error",
        },
    )
    error = r.json()["error"]
    assert error["type"] == "invalid_request_error"
    assert "4096" in error["message"]


def test_truncate_lowers_max_tokens(http) -> None:
    # A forced "." meets the stop list at once: the request ends quickly however long the
    # model would have gone on, and is served rather than refused.
    [dot] = http.post("/tokenize", json={"model": DEFAULT_MODEL, "content": "."}).json()["tokens"]
    r = http.post(
        COMP,
        json={
            "model": DEFAULT_MODEL,
            "prompt": "hello",
            "max_tokens": 100000,
            "temperature": 0,
            "stop": ["\n", "."],
            "logit_bias": {str(dot): 100},
        },
    )
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["finish_reason"] == "stop"


def test_prompt_longer_than_context_is_400(http) -> None:
    r = http.post(COMP, json={"model": DEFAULT_MODEL, "prompt": [42] * 5000, "max_tokens": 1})
    assert r.status_code == 400
    assert r.json()["error"]["type"] == "invalid_request_error"


def test_unknown_route_is_404_json(http) -> None:
    r = http.get("/v1/nothing-here")
    assert r.status_code == 404
    assert r.json()["error"]["type"] == "invalid_request_error"


def test_unknown_fields_are_ignored(http) -> None:
    r = http.post(
        COMP,
        json={
            "model": DEFAULT_MODEL,
            "prompt": "x",
            "max_tokens": 1,
            "some_future_field": {"a": 1},
        },
    )
    assert r.status_code == 200


def test_server_still_healthy_after_bad_input(http) -> None:
    assert http.get("/health").json()["status"] == "ok"
    r = http.post(CHAT, json={"model": DEFAULT_MODEL, "messages": MSG, "max_tokens": 2})
    assert r.status_code == 200
