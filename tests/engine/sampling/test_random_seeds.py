"""A seed below 0 draws a fresh seed, on every door: -1 is llama-server's and many
clients' "random", and it used to sample with seed 0, so every such request wrote the
same text. At temperature 1 with no other sampler, requests seeded -1 are independent
draws; the same positive seed stays repeatable."""

from __future__ import annotations

from collections.abc import Callable

import httpx
import pytest
from conftest import DEFAULT_MODEL, assert_independent_draws

DRAWS = 4
TOKENS = 6
Draw = Callable[[httpx.Client, int], tuple[str, float]]


def _chat(http: httpx.Client, seed: int) -> tuple[str, float]:
    body = http.post("/v1/chat/completions", json={
        "model": DEFAULT_MODEL, "messages": [{"role": "user", "content": "Tell a story."}],
        "max_tokens": TOKENS, "temperature": 1, "seed": seed, "logprobs": True}).json()
    choice = body["choices"][0]
    return (choice["message"]["content"],
            sum(t["logprob"] for t in choice["logprobs"]["content"]))


def _native(http: httpx.Client, seed: int) -> tuple[str, float]:
    # llama-server's own sampler defaults would truncate the distribution: off here.
    body = http.post("/completion", json={
        "prompt": "Once upon a time", "n_predict": TOKENS, "temperature": 1, "seed": seed,
        "top_k": 0, "top_p": 1, "min_p": 0, "n_probs": 1}).json()
    return body["content"], sum(p["logprob"] for p in body["completion_probabilities"])


def _ollama(http: httpx.Client, seed: int) -> tuple[str, float]:
    body = http.post("/api/generate", json={
        "model": DEFAULT_MODEL, "prompt": "Tell a story.", "stream": False, "logprobs": True,
        "options": {"num_predict": TOKENS, "temperature": 1, "seed": seed, "top_k": 0,
                    "top_p": 1, "repeat_penalty": 1}}).json()
    return body["response"], sum(t["logprob"] for t in body["logprobs"])


DOORS = {"chat": _chat, "native": _native, "ollama": _ollama}


@pytest.mark.parametrize("door", DOORS)
@pytest.mark.parametrize("seed", [-1, -12345])
def test_negative_seeds_draw_independently(http: httpx.Client, door: str, seed: int) -> None:
    draws = [DOORS[door](http, seed) for _ in range(DRAWS)]
    assert_independent_draws([text for text, _ in draws], [lp for _, lp in draws])


@pytest.mark.parametrize("door", DOORS)
def test_a_positive_seed_repeats(http: httpx.Client, door: str) -> None:
    assert DOORS[door](http, 7) == DOORS[door](http, 7)
