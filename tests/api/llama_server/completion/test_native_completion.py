"""llama-server's native POST /completion, as the scripts of llama-server's README call
it: `content` and its counts, `stop_type` and `stopping_word`, `timings`, llama-server's
sampler defaults, an array for several prompts, and streams of `data:` events with the
whole result last and no `[DONE]`."""

from __future__ import annotations

import json

import pytest
from conftest import DEFAULT_MODEL

WORD = " sky"  # one token, which a text of it repeated tokenizes back to


@pytest.fixture
def forced(http) -> tuple[int, dict[str, int]]:
    """WORD's token, and a logit_bias that makes every generated token WORD."""
    [token] = http.post("/tokenize", json={"content": WORD}).json()["tokens"]
    return token, {str(token): 100}


def completion(http, **body) -> dict | list:
    r = http.post("/completion", json=body)
    assert r.status_code == 200, r.text
    return r.json()  # type: ignore[no-any-return]


def test_the_readme_request_gets_content_and_counts(http) -> None:
    # llama-server's README: {"prompt": ..., "n_predict": 128}; kept short here.
    body = completion(http, prompt="Building a website can be done in 10 simple steps:",
                      n_predict=8, ignore_eos=True)
    assert isinstance(body, dict)
    assert body["stop"] is True and body["model"] == DEFAULT_MODEL
    assert body["tokens_predicted"] == 8 and body["stop_type"] == "limit"
    assert body["tokens_evaluated"] == len(http.post("/tokenize", json={
        "content": body["prompt"], "add_special": True}).json()["tokens"])
    assert body["content"] and body["tokens"] == []  # tokens only with return_tokens
    timings = body["timings"]
    assert timings["predicted_n"] == 8 and timings["predicted_ms"] > 0
    assert timings["prompt_n"] + timings["cache_n"] == body["tokens_evaluated"]
    # llama-server's sampler when the request names none.
    settings = body["generation_settings"]
    assert (settings["temperature"], settings["top_k"], settings["top_p"],
            settings["min_p"]) == (0.8, 40, 0.95, 0.05)
    assert settings["n_predict"] == 8


def test_stop_types_and_words(http, forced) -> None:
    token, bias = forced
    limit = completion(http, prompt="Weather:", n_predict=4, logit_bias=bias,
                       return_tokens=True, temperature=0)
    assert limit["content"] == WORD * 4 and limit["tokens"] == [token] * 4
    assert (limit["stop_type"], limit["stopping_word"]) == ("limit", "")
    word = completion(http, prompt="Weather:", n_predict=12, logit_bias=bias,
                      stop=["nothing", WORD * 3], temperature=0)
    # The text is the stop string from its start, and a stop string is not returned.
    assert word["content"] == "" and word["tokens_predicted"] == 3
    assert (word["stop_type"], word["stopping_word"]) == ("word", WORD * 3)
    assert not word["has_new_line"]


def test_an_explicit_sampler_replaces_the_defaults(http) -> None:
    body = completion(http, prompt="Hi", n_predict=1, temperature=0.2, top_k=0, top_p=1,
                      min_p=0, seed=7)
    settings = body["generation_settings"]
    # top_k 0 is llama-server's "no top-k" (the whole vocabulary).
    assert (settings["temperature"], settings["top_k"], settings["top_p"], settings["min_p"],
            settings["seed"]) == (0.2, 0, 1.0, 0.0, 7)
    assert completion(http, prompt="Hi", n_predict=1, top_k=-1)["generation_settings"][
        "top_k"] == 0


def test_several_prompts_answer_an_array(http) -> None:
    body = completion(http, prompt=["One,", "Two,"], n_predict=2, ignore_eos=True)
    assert isinstance(body, list) and [r["index"] for r in body] == [0, 1]
    assert all(r["tokens_predicted"] == 2 for r in body)


def test_a_stream_ends_with_the_whole_result_and_no_done(http, forced) -> None:
    token, bias = forced
    events = []
    with http.stream("POST", "/completion", json={
            "prompt": "Weather:", "n_predict": 5, "stream": True, "logit_bias": bias,
            "temperature": 0, "return_tokens": True}) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if line.startswith("data: "):
                assert line != "data: [DONE]"
                events.append(json.loads(line[6:]))
    *partials, last = events
    assert all(e["stop"] is False for e in partials) and last["stop"] is True
    assert "".join(e["content"] for e in events) == WORD * 5
    assert [t for e in events for t in e["tokens"]] == [token] * 5
    assert last["tokens_predicted"] == 5 and last["stop_type"] == "limit"
    assert last["timings"]["predicted_n"] == 5


def test_n_probs_scores_every_token(http, forced) -> None:
    token, bias = forced
    body = completion(http, prompt="Weather:", n_predict=4, logit_bias=bias, n_probs=3)
    probs = body["completion_probabilities"]
    assert [p["id"] for p in probs] == [token] * 4
    for entry in probs:
        assert entry["token"] == WORD and bytes(entry["bytes"]) == WORD.encode()
        assert entry["logprob"] <= 0 and len(entry["top_logprobs"]) == 3
        top = [t["logprob"] for t in entry["top_logprobs"]]
        assert top == sorted(top, reverse=True)
    assert "completion_probabilities" not in completion(http, prompt="Hi", n_predict=1)
    # Streamed: each event scores the tokens it carries.
    scored = 0
    with http.stream("POST", "/completion", json={
            "prompt": "Weather:", "n_predict": 4, "stream": True, "logit_bias": bias,
            "n_probs": 2}) as r:
        for line in r.iter_lines():
            if line.startswith("data: "):
                event = json.loads(line[6:])
                scored += len(event.get("completion_probabilities", []))
    assert scored == 4


@pytest.mark.parametrize("field, value", [("best_of", 2), ("echo", True), ("logprobs", 1),
                                          ("n_probs", 21), ("top_p", 2)])
def test_fields_without_a_place_here_are_refused_by_name(http, field: str,
                                                         value: object) -> None:
    r = http.post("/completion", json={"prompt": "Hi", "n_predict": 1, field: value})
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == field
