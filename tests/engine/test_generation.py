"""What generation must guarantee: seeds, stop sequences, usage counts, sampler fields."""

from __future__ import annotations

import json

import pytest
from conftest import DEFAULT_MODEL, assert_independent_draws

PROMPT = "Here is a short story about a cat named Tom. Tom"


def complete(http, **body) -> dict:
    r = http.post("/v1/completions", json={"model": DEFAULT_MODEL, **body})
    assert r.status_code == 200, r.text
    return r.json()


def token(http, text: str) -> int:
    [only] = http.post("/tokenize", json={"model": DEFAULT_MODEL, "content": text}).json()["tokens"]
    return int(only)


def piece(http, token_id: int) -> str:
    r = http.post("/detokenize", json={"model": DEFAULT_MODEL, "tokens": [token_id]})
    return str(r.json()["content"])


def test_same_seed_same_text(http) -> None:
    args = dict(prompt=PROMPT, max_tokens=24, temperature=1.0, seed=1234)
    first = complete(http, **args)["choices"][0]["text"]
    second = complete(http, **args)["choices"][0]["text"]
    assert first == second


def test_other_seeds_vary(http) -> None:
    choices = [
        complete(http, prompt=PROMPT, max_tokens=24, temperature=1.0, seed=s, logprobs=0)[
            "choices"][0]
        for s in range(4)
    ]
    assert_independent_draws([c["text"] for c in choices],
                             [sum(c["logprobs"]["token_logprobs"]) for c in choices])


def test_chat_seed_determinism(http) -> None:
    body = {
        "model": DEFAULT_MODEL,
        "messages": [{"role": "user", "content": "Write a poem about rain."}],
        "max_tokens": 20,
        "seed": 7,
        "temperature": 0.9,
        "top_p": 0.9,
        "top_k": 40,
    }
    a = http.post("/v1/chat/completions", json=body).json()
    b = http.post("/v1/chat/completions", json=body).json()
    assert a["choices"][0]["message"]["content"] == b["choices"][0]["message"]["content"]


# The stop tests take their stop text from the request's own greedy output, so they hold
# whatever the model writes; ignore_eos keeps both runs on the same tokens however early
# the model would end.
GREEDY = dict(prompt=PROMPT, max_tokens=30, temperature=0, ignore_eos=True)


def greedy_text_and_stop(http) -> tuple[str, str]:
    text = complete(http, **GREEDY)["choices"][0]["text"]
    start = len(text) // 3
    stop = text[start : start + 4]
    assert len(stop) == 4, text
    return text, stop


def test_stop_sequence_cuts_before_stop_text(http) -> None:
    text, stop = greedy_text_and_stop(http)
    cut = complete(http, **GREEDY, stop=[stop, "@@@@"])
    choice = cut["choices"][0]
    assert choice["finish_reason"] == "stop"
    assert choice["text"] == text[: text.index(stop)]
    assert stop not in choice["text"]


def test_stop_text_kept_on_opt_in(http) -> None:
    text, stop = greedy_text_and_stop(http)
    kept = complete(http, **GREEDY, stop=stop, include_stop_str_in_output=True)
    assert kept["choices"][0]["text"] == text[: text.index(stop) + len(stop)]


def test_stop_in_stream(http) -> None:
    text, stop = greedy_text_and_stop(http)
    with http.stream(
        "POST",
        "/v1/completions",
        json={"model": DEFAULT_MODEL, **GREEDY, "stop": stop, "stream": True},
    ) as r:
        events = [line[6:] for line in r.iter_lines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    streamed = "".join(c["choices"][0]["text"] for c in chunks)
    assert streamed == text[: text.index(stop)]
    assert chunks[-1]["choices"][0]["finish_reason"] == "stop"


def test_usage_counts_tokens(http) -> None:
    tokens = [504, 3767, 314, 253, 1789]
    r = complete(http, prompt=tokens, max_tokens=7, ignore_eos=True, temperature=0)
    assert r["usage"]["prompt_tokens"] == len(tokens)
    assert r["usage"]["completion_tokens"] == 7
    assert r["usage"]["total_tokens"] == len(tokens) + 7
    assert r["choices"][0]["finish_reason"] == "length"


def test_multiple_prompts_give_indexed_choices(http) -> None:
    r = complete(http, prompt=["Red is", "Blue is"], max_tokens=4, n=2, temperature=0.8, seed=3)
    assert sorted(c["index"] for c in r["choices"]) == [0, 1, 2, 3]
    assert r["usage"]["completion_tokens"] <= 16


def test_echo_prepends_prompt(http) -> None:
    r = complete(http, prompt="Roses are red,", max_tokens=4, echo=True, temperature=0)
    assert r["choices"][0]["text"].startswith("Roses are red,")


def test_temperature_zero_is_deterministic_and_greedy(http) -> None:
    a = complete(http, prompt=PROMPT, max_tokens=16, temperature=0)["choices"][0]["text"]
    b = complete(http, prompt=PROMPT, max_tokens=16, temperature=0, seed=99)["choices"][0]["text"]
    assert a == b


def test_penalties_change_output(http) -> None:
    """+100 forces a token however the model ranks it, so the plain run repeats it; the
    context already holds it 64 times, so the penalties take more than 100 off it (the
    repetition penalty alone divides its +100 by 1.8) and it cannot win the first step."""
    forced = token(http, " banana")
    args = dict(prompt=[forced] * 64, max_tokens=8, temperature=0, ignore_eos=True,
                logit_bias={str(forced): 100}, logprobs=0)
    plain = complete(http, **args)["choices"][0]
    assert plain["text"] == piece(http, forced) * 8
    penalised = complete(
        http, **args, repetition_penalty=1.8, frequency_penalty=1.5, presence_penalty=1.5
    )["choices"][0]
    tokens = penalised["logprobs"]["tokens"]
    assert tokens[0] != piece(http, forced)
    assert tokens.count(piece(http, forced)) < len(tokens)


def model_logprob(http, context: list[int], token_id: int) -> float:
    """The model's log-probability of `token_id` after `context` (echo scores the prompt)."""
    r = complete(http, prompt=[*context, token_id], max_tokens=1, echo=True, logprobs=0)
    return float(r["choices"][0]["logprobs"]["token_logprobs"][len(context)])


@pytest.mark.parametrize(("penalty", "value"), [
    ("presence_penalty", 2.0), ("frequency_penalty", 2.0), ("repetition_penalty", 1.9),
    ("frequency_penalty", -2.0),
])
def test_each_penalty_moves_a_near_tie(http, penalty: str, value: float) -> None:
    """Two tokens are lifted far above the rest with biases that leave them one nat
    apart, measured on the model's own logprobs. The context repeats one of them, so a
    penalty pulls that one down past the other (a negative one pushes it up past it),
    whichever tokens this model would prefer on its own."""
    repeated, fresh = token(http, " banana"), token(http, " apple")
    context = [repeated] * 8
    gap = model_logprob(http, context, repeated) - model_logprob(http, context, fresh)
    lead = 1.0 if value > 0 else -1.0  # the repeated token's lead before the penalty
    shift = lead - gap  # bias(repeated) - bias(fresh)
    bias = {str(repeated): 100 + min(shift, 0), str(fresh): 100 - max(shift, 0)}
    assert min(bias.values()) > 50, gap  # both still far above every other token
    args = dict(prompt=context, max_tokens=1, temperature=0, logit_bias=bias)
    before, after = (repeated, fresh) if value > 0 else (fresh, repeated)
    assert complete(http, **args)["choices"][0]["text"] == piece(http, before)
    assert complete(http, **args, **{penalty: value})["choices"][0]["text"] == piece(http, after)


def test_chat_name_field_reaches_the_prompt(http) -> None:
    def prompt_tokens(messages: list[dict]) -> int:
        r = http.post(
            "/v1/chat/completions",
            json={"model": DEFAULT_MODEL, "messages": messages, "max_tokens": 1},
        )
        return r.json()["usage"]["prompt_tokens"]

    plain = prompt_tokens([{"role": "user", "content": "Hello"}])
    named = prompt_tokens([{"role": "user", "content": "Hello", "name": "Alice_Smith"}])
    assert named > plain


def test_text_parts_are_joined(http) -> None:
    r = http.post(
        "/v1/chat/completions",
        json={
            "model": DEFAULT_MODEL,
            "max_tokens": 3,
            "messages": [
                {
                    "role": "user",
                    "content": [{"type": "text", "text": "Say"}, {"type": "text", "text": "hello"}],
                }
            ],
        },
    )
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["message"]["content"] is not None
