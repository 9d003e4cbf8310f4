"""Requests that together want more cells than the shared KV cache holds: a long prompt
with eight short requests at once, on a cache that cannot hold them all. Every request
is answered in full (the long prompt waits, or starts over, while the short ones run),
none gets a 500, and llama.cpp's "no KV slot" never reaches a caller."""

from __future__ import annotations

import asyncio
import random
from pathlib import Path

import httpx
from conftest import start_server, stop_server

_WORDS = ["alpha", "beta", "gamma", "delta", "river", "mountain", "cloud", "paper",
          "window", "garden"]
SHORT_ANSWER = 32


def _text(rng: random.Random, n_words: int) -> str:
    return " ".join(rng.choice(_WORDS) for _ in range(n_words))


async def _burst(url: str, long_prompt: str, shorts: list[str]) -> list[httpx.Response]:
    async with httpx.AsyncClient(base_url=url, timeout=600) as http:
        async def ask(prompt: str, max_tokens: int) -> httpx.Response:
            return await http.post("/v1/completions", json={
                "model": "default", "prompt": prompt, "max_tokens": max_tokens,
                "temperature": 0, "ignore_eos": True})
        return await asyncio.gather(ask(long_prompt, 4),
                                    *(ask(p, SHORT_ANSWER) for p in shorts))


def test_eight_short_requests_and_a_long_one_share_a_small_cache(tmp_path: Path) -> None:
    # 768 cells: the long prompt (400 tokens) plus eight short ones (~40 + 32 each, ~580)
    # do not fit together.
    server = start_server(tmp_path, "--ctx-size", "768", "--parallel", "9",
                          "--draft-max", "0", name="room")
    try:
        rng = random.Random(7)
        with httpx.Client(base_url=server.base_url, timeout=60) as http:
            tokens = http.post("/tokenize", json={"content": _text(rng, 450)}).json()["tokens"]
            long_prompt = http.post("/detokenize",
                                    json={"tokens": tokens[:400]}).json()["content"]
        shorts = [_text(rng, 40) for _ in range(8)]
        answers = asyncio.run(_burst(server.base_url, long_prompt, shorts))
        assert [r.status_code for r in answers] == [200] * 9, [r.text for r in answers]
        long_usage = answers[0].json()["usage"]
        assert long_usage["prompt_tokens"] >= 395 and long_usage["completion_tokens"] == 4
        for r in answers[1:]:
            assert r.json()["usage"]["completion_tokens"] == SHORT_ANSWER
        # The same burst again, now with idle slots holding cached prefixes to evict.
        again = asyncio.run(_burst(server.base_url, long_prompt, shorts[::-1]))
        assert [r.status_code for r in again] == [200] * 9, [r.text for r in again]
        assert again[0].json()["usage"]["completion_tokens"] == 4
    finally:
        stop_server(server)
    log = server.log_text()
    assert "Traceback" not in log and "llama_decode failed" not in log, log[-3000:]
