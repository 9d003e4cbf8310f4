"""Clients written for llama-server work as they are: the OpenAI routes without /v1,
requests without `model`, llama-server's request fields (each honoured, accepted at its
neutral value, or refused by name), the context each model allows in /v1/models, and a
context overflow typed as OpenAI types it."""

from __future__ import annotations

import pytest
from conftest import DEFAULT_MODEL

from edge_server.api.common.llama_fields import NEUTRAL_VALUES

MSG = [{"role": "user", "content": "Say hi."}]


def test_openai_routes_answer_without_the_v1_prefix(server) -> None:
    import openai

    # A client given llama-server's base URL, which has no /v1.
    with openai.OpenAI(base_url=server.base_url, api_key="x", max_retries=0) as c:
        assert c.models.list().data[0].id == DEFAULT_MODEL
        assert c.models.retrieve("default").id == DEFAULT_MODEL
        chat = c.chat.completions.create(model=DEFAULT_MODEL, messages=MSG, max_tokens=3)
        assert chat.choices[0].message.content is not None
        text = c.completions.create(model=DEFAULT_MODEL, prompt="Hi", max_tokens=3)
        assert text.usage is not None and text.usage.completion_tokens >= 1
        vectors = c.embeddings.create(model=DEFAULT_MODEL, input="hi", encoding_format="float")
        assert len(vectors.data[0].embedding) > 0


def test_openapi_documents_the_unprefixed_routes(http) -> None:
    paths = http.get("/openapi.json").json()["paths"]
    for path in ("/chat/completions", "/completions", "/embeddings", "/models", "/infill"):
        assert path in paths


@pytest.mark.parametrize("path, body", [
    ("/v1/chat/completions", {"messages": MSG, "max_tokens": 2}),
    ("/completions", {"prompt": "Hi", "max_tokens": 2}),
    ("/embeddings", {"input": "hi"}),
])
def test_model_may_be_left_out_meaning_the_default_model(http, path: str, body: dict) -> None:
    r = http.post(path, json=body)
    assert r.status_code == 200, r.text
    assert r.json()["model"] == DEFAULT_MODEL


def test_models_carry_the_context_a_request_may_use(http) -> None:
    card = http.get("/v1/models/default").json()
    # The session server: 16,384 cells over 4 slots.
    assert card["context_length"] == 4096
    r = http.post("/v1/completions", json={"prompt": "x " * 5000, "max_tokens": 1})
    assert r.status_code == 400 and "4096" in r.json()["error"]["message"]


def test_context_overflow_is_typed_as_openai_types_it(http) -> None:
    for body in ({"prompt": "word " * 6000, "max_tokens": 1},
                 {"prompt": "Hi", "max_tokens": 5000, "context_length_exceeded_behavior": "error"}):
        error = http.post("/v1/completions", json=body).json()["error"]
        assert error["type"] == "invalid_request_error"
        assert error["code"] == "context_length_exceeded"


@pytest.mark.parametrize("name", sorted(NEUTRAL_VALUES))
def test_each_unimplemented_llama_server_field_is_refused_by_name(http, name: str) -> None:
    r = http.post("/v1/completions", json={"prompt": "Hi", "max_tokens": 1,
                                           name: {"not": "neutral"}})
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == name


def test_unimplemented_fields_at_their_neutral_values_are_accepted(http) -> None:
    neutral = {name: values[0] for name, values in NEUTRAL_VALUES.items() if values}
    for path, body in (("/v1/completions", {"prompt": "Hi"}), ("/v1/chat/completions",
                                                                {"messages": MSG})):
        r = http.post(path, json={**body, "max_tokens": 1, **neutral})
        assert r.status_code == 200, r.text


def test_n_predict_and_n_cmpl_are_max_tokens_and_n(http) -> None:
    r = http.post("/completions", json={"prompt": "Once", "n_predict": 3, "n_cmpl": 2,
                                        "ignore_eos": True})
    body = r.json()
    assert len(body["choices"]) == 2 and body["usage"]["completion_tokens"] == 6
    # n_predict 0: the prompt is evaluated (and cached), nothing generated.
    r = http.post("/completions", json={"prompt": "Once upon a time", "n_predict": 0})
    assert r.json()["choices"][0]["text"] == "" and r.json()["usage"]["completion_tokens"] == 0


def test_sampler_aliases_are_applied(http) -> None:
    base = {"prompt": "The list: a, b, c,", "max_tokens": 8, "seed": 5, "logprobs": 1}
    plain = http.post("/completions", json=base).json()["choices"][0]
    for extra in ({"repeat_penalty": 1.9}, {"mirostat": 2, "mirostat_tau": 0.5,
                                             "mirostat_eta": 0.2}):
        same_as = {"repeat_penalty": {"repetition_penalty": 1.9},
                   "mirostat": {"mirostat_target": 0.5, "mirostat_lr": 0.2}}[next(iter(extra))]
        a = http.post("/completions", json={**base, **extra}).json()["choices"][0]
        b = http.post("/completions", json={**base, **same_as}).json()["choices"][0]
        assert a["text"] == b["text"]  # the alias means the same sampler
        assert a["logprobs"]["tokens"] == b["logprobs"]["tokens"]
    # Whether a penalty changes these 8 tokens depends on the model's words, so the
    # canonical fields' own effect is checked in test_fields.py, not against `plain`.
    assert 1 <= len(plain["logprobs"]["tokens"]) <= 8


@pytest.mark.parametrize("field, value", [
    ("cache_prompt", False), ("mirostat", 1), ("n_predict", -2), ("n_indent", -1),
    ("t_max_predict_ms", -5), ("return_progress", "maybe"), ("grammar", 5),
])
def test_llama_server_fields_out_of_range_are_refused(http, field: str, value: object) -> None:
    r = http.post("/v1/chat/completions", json={"messages": MSG, "max_tokens": 1, field: value})
    assert r.status_code == 400 and r.json()["error"]["param"] == field, r.text


def test_cache_prompt_true_and_other_fields_are_accepted(http) -> None:
    r = http.post("/v1/chat/completions", json={
        "messages": MSG, "max_tokens": 1, "cache_prompt": True, "some_vendor_field": 1})
    assert r.status_code == 200, r.text


def test_chat_stream_reports_prompt_progress(http) -> None:
    import json

    body = {"messages": [{"role": "user", "content": "word " * 700}], "max_tokens": 1,
            "stream": True, "return_progress": True}
    progress = []
    with http.stream("POST", "/chat/completions", json=body) as r:
        for line in r.iter_lines():
            if line.startswith("data: {"):
                chunk = json.loads(line[6:])
                if "prompt_progress" in chunk:
                    progress.append(chunk["prompt_progress"])
    assert len(progress) >= 2 and progress[-1]["processed"] == progress[-1]["total"]
