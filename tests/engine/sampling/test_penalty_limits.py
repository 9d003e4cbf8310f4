"""A vanishing repetition penalty (5e-324, 2.2e-308: numbers a client may send) is served
as its limit, MIN_REPETITION_PENALTY, through every door: not a token drawn from NaN
logits, and not a process aborted by a grammar handed such a token."""

from __future__ import annotations

import json

import httpx
import pytest
from conftest import DEFAULT_MODEL

from edge_server.engine.sampling.chain import MIN_REPETITION_PENALTY

PROMPT = "My favourite fruit is"
VANISHING = [5e-324, 2.2250738585072014e-308, 1e-40]


def completion(http: httpx.Client, penalty: float, **body: object) -> dict:
    r = http.post("/v1/completions", json={
        "model": DEFAULT_MODEL, "prompt": PROMPT, "max_tokens": 8, "seed": 7,
        "ignore_eos": True, "repetition_penalty": penalty, **body})
    assert r.status_code == 200, r.text
    return r.json()["choices"][0]


@pytest.mark.parametrize("penalty", VANISHING)
def test_a_vanishing_repetition_penalty_acts_as_its_limit(http: httpx.Client,
                                                          penalty: float) -> None:
    vanishing = completion(http, penalty, logprobs=1)
    limit = completion(http, MIN_REPETITION_PENALTY, logprobs=1)
    assert vanishing["text"] == limit["text"]
    assert vanishing["logprobs"]["tokens"] == limit["logprobs"]["tokens"]


@pytest.mark.parametrize("penalty", VANISHING)
def test_ollama_repeat_penalty_vanishing(http: httpx.Client, penalty: float) -> None:
    def generate(value: float) -> str:
        r = http.post("/api/generate", json={
            "model": DEFAULT_MODEL, "prompt": PROMPT, "raw": True, "stream": False,
            "options": {"num_predict": 8, "seed": 7, "repeat_penalty": value}})
        assert r.status_code == 200, r.text
        return str(r.json()["response"])

    assert generate(penalty) == generate(MIN_REPETITION_PENALTY)


@pytest.mark.parametrize("door", ["chat", "native"])
def test_a_grammar_with_a_vanishing_penalty_is_kept(http: httpx.Client, door: str) -> None:
    """The grammar's answer, rather than the process aborted in C ("Unexpected empty
    grammar stack") by a token drawn from NaNs."""
    schema = {"type": "string", "maxLength": 4}
    if door == "chat":
        r = http.post("/v1/chat/completions", json={
            "model": DEFAULT_MODEL, "messages": [{"role": "user", "content": "Hi"}],
            "max_tokens": 16, "json_schema": schema, "repeat_penalty": VANISHING[1]})
        assert r.status_code == 200, r.text
        text = r.json()["choices"][0]["message"]["content"]
    else:
        r = http.post("/completion", json={
            "model": DEFAULT_MODEL, "prompt": "Hi", "n_predict": 16, "json_schema": schema,
            "repeat_penalty": VANISHING[0]})
        assert r.status_code == 200, r.text
        text = r.json()["content"]
    assert isinstance(json.loads(text), str)
    assert http.get("/health").status_code == 200
