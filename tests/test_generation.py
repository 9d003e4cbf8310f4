"""What generation must guarantee: seeds, stop sequences, usage counts, sampler fields."""

from __future__ import annotations

from conftest import DEFAULT_MODEL

PROMPT = "Here is a short story about a cat named Tom. Tom"


def complete(http, **body) -> dict:
    r = http.post("/v1/completions", json={"model": DEFAULT_MODEL, **body})
    assert r.status_code == 200, r.text
    return r.json()


def test_same_seed_same_text(http) -> None:
    args = dict(prompt=PROMPT, max_tokens=24, temperature=1.0, seed=1234)
    first = complete(http, **args)["choices"][0]["text"]
    second = complete(http, **args)["choices"][0]["text"]
    assert first == second


def test_other_seeds_vary(http) -> None:
    texts = {
        complete(http, prompt=PROMPT, max_tokens=24, temperature=1.5, seed=s)["choices"][0]["text"]
        for s in range(4)
    }
    assert len(texts) > 1


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


def test_stop_sequence_cuts_before_stop_text(http) -> None:
    base = complete(http, prompt=PROMPT, max_tokens=30, temperature=0, ignore_eos=True)
    text = base["choices"][0]["text"]
    assert len(text) > 12
    stop = text[8:12]
    cut = complete(http, prompt=PROMPT, max_tokens=30, temperature=0, stop=[stop, "@@@@"])
    choice = cut["choices"][0]
    assert choice["finish_reason"] == "stop"
    assert choice["text"] == text[: text.index(stop)]
    assert stop not in choice["text"]


def test_stop_text_kept_on_opt_in(http) -> None:
    text = complete(http, prompt=PROMPT, max_tokens=30, temperature=0, ignore_eos=True)["choices"][
        0
    ]["text"]
    stop = text[8:12]
    kept = complete(
        http,
        prompt=PROMPT,
        max_tokens=30,
        temperature=0,
        stop=stop,
        include_stop_str_in_output=True,
    )["choices"][0]["text"]
    assert kept == text[: text.index(stop) + len(stop)]


def test_stop_in_stream(http) -> None:
    text = complete(http, prompt=PROMPT, max_tokens=30, temperature=0, ignore_eos=True)["choices"][
        0
    ]["text"]
    stop = text[10:14]
    with http.stream(
        "POST",
        "/v1/completions",
        json={
            "model": DEFAULT_MODEL,
            "prompt": PROMPT,
            "max_tokens": 30,
            "temperature": 0,
            "stop": stop,
            "stream": True,
        },
    ) as r:
        import json

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
    plain = complete(
        http, prompt="la la la la la la", max_tokens=20, temperature=0, ignore_eos=True
    )["choices"][0]["text"]
    penalised = complete(
        http,
        prompt="la la la la la la",
        max_tokens=20,
        temperature=0,
        ignore_eos=True,
        repetition_penalty=1.8,
        frequency_penalty=1.5,
        presence_penalty=1.5,
    )["choices"][0]["text"]
    assert plain != penalised
    assert penalised.count("la") < plain.count("la")


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
