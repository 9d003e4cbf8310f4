"""Each documented field has an effect, checked through HTTP against the real model."""

from __future__ import annotations

import math

import pytest
from conftest import DEFAULT_MODEL, assert_independent_draws

PROMPT = "My favourite fruit is"


def complete(http, **body) -> dict:
    r = http.post("/v1/completions", json={"model": DEFAULT_MODEL, **body})
    assert r.status_code == 200, r.text
    return r.json()


def chat(http, **body) -> dict:
    r = http.post("/v1/chat/completions", json={"model": DEFAULT_MODEL, **body})
    assert r.status_code == 200, r.text
    return r.json()


def tokenize(http, text: str) -> list[int]:
    return http.post("/tokenize", json={"model": DEFAULT_MODEL, "content": text}).json()["tokens"]


def is_greedy(logprob: float, top: dict[str, float]) -> bool:
    """The chosen token is the most likely one (logprobs are the model's own)."""
    return math.isclose(logprob, max(top.values()), abs_tol=1e-4)


def test_logit_bias_plus_100_forces_a_token(http) -> None:
    token = tokenize(http, " banana")[0]
    piece = http.post("/detokenize", json={"model": DEFAULT_MODEL, "tokens": [token]}).json()
    r = complete(
        http, prompt=PROMPT, max_tokens=3, temperature=1.0, seed=5, logit_bias={str(token): 100}
    )
    assert r["choices"][0]["text"] == piece["content"] * 3


def test_logit_bias_minus_100_bans_a_token(http) -> None:
    args = dict(prompt=PROMPT, max_tokens=1, temperature=0, logprobs=1)
    greedy = complete(http, **args)["choices"][0]["logprobs"]
    # Whatever the model's favourite is, ban it (every id its text tokenizes to).
    ids = tokenize(http, greedy["tokens"][0])
    assert ids, greedy
    banned = complete(http, **args, logit_bias={str(t): -100 for t in ids})["choices"][0]
    assert banned["logprobs"]["tokens"][0] != greedy["tokens"][0]
    # The next best was chosen: less likely than the banned favourite.
    assert banned["logprobs"]["token_logprobs"][0] < greedy["token_logprobs"][0]


def test_mirostat_is_applied_and_repeatable(http) -> None:
    """Mirostat v2 keeps only tokens whose surprise is below mu, which starts at twice the
    target and grows by at most lr x target per token. With a target of 0.05 bits mu stays
    under 0.22 bits over 24 tokens, which no token but the most likely one can meet (when
    none does, llama.cpp keeps the most likely): at temperature 1.0 the output is greedy
    whatever the model's distribution."""
    args = dict(prompt=PROMPT, max_tokens=24, temperature=1.0, seed=11, ignore_eos=True,
                logprobs=2, mirostat_target=0.05, mirostat_lr=0.1)
    miro = complete(http, **args)["choices"][0]
    lp = miro["logprobs"]
    assert len(lp["tokens"]) == 24
    assert all(is_greedy(x, top) for x, top in zip(lp["token_logprobs"], lp["top_logprobs"],
                                                    strict=True))
    again = complete(http, **args)["choices"][0]
    assert again["text"] == miro["text"]  # seeded mirostat is repeatable too


def test_completion_logprobs(http) -> None:
    r = complete(http, prompt=PROMPT, max_tokens=6, temperature=0, logprobs=3, ignore_eos=True)
    lp = r["choices"][0]["logprobs"]
    assert len(lp["tokens"]) == len(lp["token_logprobs"]) == len(lp["top_logprobs"]) == 6
    assert "".join(lp["tokens"]) == r["choices"][0]["text"]
    assert lp["text_offset"][0] == 0
    for token, logprob, top in zip(
        lp["tokens"], lp["token_logprobs"], lp["top_logprobs"], strict=True
    ):
        assert logprob <= 0
        assert 1 <= len(top) <= 3
        # Greedy picks the most likely token: its logprob is the top entry's.
        assert is_greedy(logprob, top)
        assert math.isclose(top[token], logprob, abs_tol=1e-4)


def test_logprobs_zero_gives_chosen_token_only(http) -> None:
    lp = complete(http, prompt=PROMPT, max_tokens=3, logprobs=0, seed=1)["choices"][0]["logprobs"]
    assert all(top == {} for top in lp["top_logprobs"])
    assert all(isinstance(x, float) for x in lp["token_logprobs"])


def test_chat_logprobs(http) -> None:
    r = chat(
        http,
        messages=[{"role": "user", "content": "Say hello"}],
        max_tokens=5,
        temperature=0,
        ignore_eos=True,
        logprobs=True,
        top_logprobs=4,
    )
    content = r["choices"][0]["logprobs"]["content"]
    assert content
    for entry in content:
        assert set(entry) == {"token", "logprob", "bytes", "top_logprobs"}
        assert bytes(entry["bytes"]).decode("utf-8", "replace") == entry["token"]
        assert len(entry["top_logprobs"]) == 4
        assert math.isclose(entry["logprob"], entry["top_logprobs"][0]["logprob"], abs_tol=1e-4)
        assert entry["top_logprobs"][0]["token"] == entry["token"]


def test_chat_logprobs_stream(http) -> None:
    import json

    with http.stream(
        "POST",
        "/v1/chat/completions",
        json={
            "model": DEFAULT_MODEL,
            "messages": [{"role": "user", "content": "Hi"}],
            "max_tokens": 4,
            "logprobs": True,
            "top_logprobs": 2,
            "stream": True,
            "temperature": 0,
            "ignore_eos": True,
        },
    ) as r:
        chunks = [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: {")]
    entries = [
        e
        for c in chunks
        if c["choices"] and c["choices"][0]["logprobs"]
        for e in c["choices"][0]["logprobs"]["content"]
    ]
    assert entries and all(len(e["top_logprobs"]) == 2 for e in entries)


def test_echo_with_logprobs_scores_prompt(http) -> None:
    r = complete(http, prompt=PROMPT, max_tokens=3, temperature=0, echo=True, logprobs=1,
                 ignore_eos=True)
    choice = r["choices"][0]
    lp = choice["logprobs"]
    n_prompt = r["usage"]["prompt_tokens"]
    assert choice["text"].startswith(PROMPT)
    assert lp["token_logprobs"][0] is None
    assert lp["top_logprobs"][0] is None
    assert all(isinstance(x, float) for x in lp["token_logprobs"][1:])
    assert len(lp["tokens"]) == n_prompt + 3
    assert "".join(lp["tokens"]) == choice["text"]


def test_n_choices_share_prompt_and_differ(http) -> None:
    r = complete(http, prompt=PROMPT, max_tokens=12, temperature=1.0, n=4, seed=3, ignore_eos=True)
    assert [c["index"] for c in r["choices"]] == [0, 1, 2, 3]
    assert r["usage"]["completion_tokens"] == 48
    assert r["usage"]["prompt_tokens"] == len(tokenize(http, PROMPT))
    # Without ignore_eos the draws are the model's own distribution: their logprobs tell
    # how likely identical choices were.
    drawn = complete(http, prompt=PROMPT, max_tokens=12, temperature=1.0, n=4, seed=3,
                     logprobs=0)["choices"]
    assert_independent_draws([c["text"] for c in drawn],
                             [sum(c["logprobs"]["token_logprobs"]) for c in drawn])


def test_chat_n_choices(http) -> None:
    r = chat(
        http,
        messages=[{"role": "user", "content": "Tell me a word"}],
        max_tokens=8,
        n=3,
        temperature=1.0,
        seed=8,
        logprobs=True,
    )
    assert [c["index"] for c in r["choices"]] == [0, 1, 2]
    assert_independent_draws(
        [c["message"]["content"] for c in r["choices"]],
        [sum(e["logprob"] for e in c["logprobs"]["content"]) for c in r["choices"]],
    )


def test_best_of_returns_highest_mean_logprob(http) -> None:
    args = dict(prompt=PROMPT, max_tokens=8, temperature=1.0, seed=21, ignore_eos=True)
    every = complete(http, **args, n=4, logprobs=0)["choices"]

    def mean(choice: dict) -> float:
        values = choice["logprobs"]["token_logprobs"]
        return sum(values) / len(values)

    ranked = sorted(every, key=mean, reverse=True)
    best = complete(http, **args, n=2, best_of=4, logprobs=0)["choices"]
    assert [c["text"] for c in best] == [c["text"] for c in ranked[:2]]
    assert [c["index"] for c in best] == [0, 1]
    plain = complete(http, **args, n=1, best_of=4)["choices"]
    assert plain[0]["text"] == ranked[0]["text"]
    assert plain[0]["logprobs"] is None


def test_best_of_rules(http) -> None:
    r = http.post(
        "/v1/completions", json={"model": DEFAULT_MODEL, "prompt": "x", "n": 3, "best_of": 2}
    )
    assert r.status_code == 400 and r.json()["error"]["param"] == "best_of"
    r = http.post(
        "/v1/completions",
        json={"model": DEFAULT_MODEL, "prompt": "x", "n": 1, "best_of": 2, "stream": True},
    )
    assert r.status_code == 400 and r.json()["error"]["param"] == "best_of"


def test_suffix_needs_fim_tokens(http) -> None:
    r = http.post(
        "/v1/completions",
        json={"model": DEFAULT_MODEL, "prompt": "def f(", "suffix": "    return x\n"},
    )
    assert r.status_code == 400
    assert r.json()["error"]["param"] == "suffix"


def test_images_on_text_only_model(http) -> None:
    r = http.post(
        "/v1/completions",
        json={
            "model": DEFAULT_MODEL,
            "prompt": "<image> what?",
            "images": ["data:image/png;base64,AAAA"],
        },
    )
    assert r.status_code == 400
    assert r.json()["error"]["param"] == "images"


@pytest.mark.parametrize("part", ["video_url", "input_audio"])
def test_other_media_parts_refused(http, part: str) -> None:
    payload = (
        {"url": "data:video/mp4;base64,AAAA"}
        if part == "video_url"
        else {"data": "AAAA", "format": "wav"}
    )
    r = http.post(
        "/v1/chat/completions",
        json={
            "model": DEFAULT_MODEL,
            "messages": [{"role": "user", "content": [{"type": part, part: payload}]}],
        },
    )
    assert r.status_code == 400
    assert r.json()["error"]["param"] == f"messages[0].content[0].{part}"


def test_chat_max_tokens_may_be_omitted(http) -> None:
    # The forced "." meets the stop list at once, however long the model would go on.
    [dot] = tokenize(http, ".")
    r = chat(
        http, messages=[{"role": "user", "content": "Say yes."}], temperature=0,
        stop=["\n", "."], logit_bias={str(dot): 100},
    )
    assert r["choices"][0]["finish_reason"] == "stop"


def test_max_completion_tokens_alias(http) -> None:
    r = chat(
        http,
        messages=[{"role": "user", "content": "Count to ten"}],
        max_completion_tokens=3,
        ignore_eos=True,
    )
    assert r["usage"]["completion_tokens"] == 3


def test_system_fingerprint_is_stable(http) -> None:
    a = complete(http, prompt="a", max_tokens=1)["system_fingerprint"]
    b = chat(http, messages=[{"role": "user", "content": "b"}], max_tokens=1)["system_fingerprint"]
    assert a == b and a.startswith("fp_")


@pytest.mark.parametrize("sampler", [{}, {"top_k": 40}, {"top_p": 0.9}, {"min_p": 0.1},
                                     {"mirostat": 2}])
@pytest.mark.parametrize("temperature", [1e-40, 5e-324])
def test_a_vanishing_temperature_samples_greedily(http, sampler: dict,
                                                  temperature: float) -> None:
    """Dividing logits by it overflows float32: served as its limit, greedy, not a 500 or
    a token drawn from NaNs."""
    body = complete(http, prompt=PROMPT, max_tokens=6, temperature=temperature, logprobs=3,
                    ignore_eos=True, **sampler)
    lp = body["choices"][0]["logprobs"]
    assert all(is_greedy(p, top) for p, top in zip(lp["token_logprobs"], lp["top_logprobs"],
                                                     strict=True))
