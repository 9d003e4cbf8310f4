"""OpenAI's predicted outputs (`prediction` on chat): drafts are looked up in the text the
answer is expected to repeat, the answer stays the sampler's own, and usage counts the
prediction's tokens the answer followed (accepted) and the rest (rejected)."""

from __future__ import annotations

import json

import pytest
from conftest import DEFAULT_MODEL

MESSAGES = [{"role": "user", "content": "Repeat the word."}]
WORD = " sky"  # one token, which a text of it repeated tokenizes back to


@pytest.fixture
def forced(http) -> dict[str, int]:
    """A logit_bias that makes every token WORD: the answer is known in advance."""
    [token] = http.post("/tokenize", json={"content": WORD}).json()["tokens"]
    return {str(token): 100}


def chat(http, forced: dict[str, int], **extra) -> dict:
    r = http.post("/v1/chat/completions", json={
        "model": DEFAULT_MODEL, "messages": MESSAGES, "max_tokens": 12, "temperature": 0,
        "logit_bias": forced, **extra})
    assert r.status_code == 200, r.text
    return r.json()  # type: ignore[no-any-return]


def prediction_tokens(http, text: str) -> int:
    return len(http.post("/tokenize", json={"content": text, "parse_special": False})
               .json()["tokens"])


def test_a_prediction_followed_is_accepted(http, forced) -> None:
    text = WORD * 12
    assert prediction_tokens(http, text) == 12
    plain = chat(http, forced)
    body = chat(http, forced, prediction={"type": "content", "content": text})
    # The answer is the sampler's: a prediction only shapes drafting.
    assert body["choices"][0]["message"]["content"] == plain["choices"][0]["message"]["content"]
    details = body["usage"]["completion_tokens_details"]
    # Every token after the first (sampled from the prompt) was looked up in it.
    assert details["accepted_prediction_tokens"] >= 10
    assert details["accepted_prediction_tokens"] + details["rejected_prediction_tokens"] \
        == prediction_tokens(http, text)
    assert "completion_tokens_details" not in plain["usage"] \
        or plain["usage"]["completion_tokens_details"] is None


def test_a_prediction_not_followed_is_rejected_whole(http, forced) -> None:
    text = "Completely different words, nothing like the answer."
    details = chat(http, forced, prediction={"type": "content", "content": [
        {"type": "text", "text": text}]})["usage"]["completion_tokens_details"]
    assert details == {"accepted_prediction_tokens": 0,
                       "rejected_prediction_tokens": prediction_tokens(http, text)}


def test_a_streamed_answer_reports_the_prediction_in_its_usage(http, forced) -> None:
    text = WORD * 12
    usage = None
    with http.stream("POST", "/v1/chat/completions", json={
            "messages": MESSAGES, "max_tokens": 12, "temperature": 0, "stream": True,
            "stream_options": {"include_usage": True}, "logit_bias": forced,
            "prediction": {"type": "content", "content": text}}) as r:
        for line in r.iter_lines():
            if line.startswith("data: {"):
                usage = json.loads(line[6:]).get("usage") or usage
    assert usage is not None
    assert usage["completion_tokens_details"]["accepted_prediction_tokens"] >= 10


@pytest.mark.parametrize("prediction, param", [
    ({"type": "code", "content": "x"}, "prediction"),
    ({"type": "content"}, "prediction"),
    ({"type": "content", "content": [{"type": "image_url", "image_url": "data:,"}]},
     "prediction"),
    ({"type": "content", "content": "word " * 20000}, "prediction"),
])
def test_bad_predictions_are_refused_by_name(http, prediction: dict, param: str) -> None:
    r = http.post("/v1/chat/completions", json={"messages": MESSAGES, "max_tokens": 1,
                                                "prediction": prediction})
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"].startswith(param)


def test_openai_client_sends_a_prediction_and_reads_its_usage(server, forced) -> None:
    import openai

    with openai.OpenAI(base_url=server.v1, api_key="x", max_retries=0) as client:
        done = client.chat.completions.create(
            model=DEFAULT_MODEL, messages=MESSAGES, max_tokens=12, temperature=0,
            logit_bias=forced, prediction={"type": "content", "content": WORD * 12})
    assert done.usage is not None and done.usage.completion_tokens_details is not None
    details = done.usage.completion_tokens_details
    assert details.accepted_prediction_tokens is not None
    assert details.accepted_prediction_tokens >= 10
    assert details.accepted_prediction_tokens + (details.rejected_prediction_tokens or 0) == 12
