"""Prompt prefixes are evaluated once: shared across slots (busy or idle), fanned out to
concurrent requests, kept for distinct prompts side by side, spilled to host RAM, and
saved across restarts. Outputs with copied prefixes agree with a fresh server."""

from __future__ import annotations

import random
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
from conftest import (
    DEFAULT_MODEL,
    RunningServer,
    agree_up_to_near_ties,
    start_server,
    stop_server,
)

WORDS = ["amber", "brook", "cedar", "delta", "ember", "fjord", "grove", "heron", "inlet",
         "juniper", "kestrel", "lagoon", "maple", "nettle", "osprey", "prairie"]


def long_text(seed: int, words: int = 220) -> str:
    rng = random.Random(seed)
    return f"Note {seed}: " + " ".join(rng.choice(WORDS) for _ in range(words))


def complete(url: str, prompt: str, **extra) -> dict:
    r = httpx.post(f"{url}/v1/completions", timeout=180, json={
        "model": DEFAULT_MODEL, "prompt": prompt, "max_tokens": 4, "temperature": 0, **extra})
    assert r.status_code == 200, r.text
    return r.json()


def cached_share(body: dict) -> float:
    usage = body["usage"]
    return usage["prompt_tokens_details"]["cached_tokens"] / usage["prompt_tokens"]


@pytest.fixture(scope="module")
def four_slots(tmp_path_factory: pytest.TempPathFactory) -> RunningServer:
    server = start_server(tmp_path_factory.mktemp("prefix"), "--parallel", "4",
                          "--ctx-size", "4096", name="prefix")
    yield server
    stop_server(server)


def test_busy_slot_prefix_is_copied_and_output_agrees(four_slots: RunningServer,
                                                      tmp_path: Path) -> None:
    base = long_text(1)
    started = threading.Event()

    def long_stream() -> None:
        body = {"model": DEFAULT_MODEL, "prompt": base, "max_tokens": 48, "stream": True,
                "ignore_eos": True}
        with httpx.stream("POST", f"{four_slots.v1}/completions", json=body, timeout=120) as r:
            for _ in r.iter_lines():
                started.set()

    with ThreadPoolExecutor(1) as pool:
        running = pool.submit(long_stream)
        assert started.wait(60)
        # While that slot is busy generating, a request sharing its prompt copies its KV.
        follow = complete(four_slots.v1.removesuffix("/v1"), base + " and then",
                          logprobs=2, max_tokens=8)
        running.result()
    assert cached_share(follow) > 0.9
    fresh = start_server(tmp_path, "--parallel", "4", "--ctx-size", "4096", name="fresh")
    try:
        alone = complete(fresh.base_url, base + " and then", logprobs=2, max_tokens=8)
    finally:
        stop_server(fresh)
    assert cached_share(alone) == 0
    agree_up_to_near_ties(alone, follow)


def test_concurrent_identical_prefixes_are_evaluated_once(four_slots: RunningServer) -> None:
    system = long_text(2, words=300)
    with ThreadPoolExecutor(4) as pool:
        answers = list(pool.map(
            lambda i: complete(four_slots.base_url, f"{system}\nQuestion {i}: why?"), range(4)))
    evaluated = sum(a["usage"]["prompt_tokens"] - a["usage"]["prompt_tokens_details"][
        "cached_tokens"] for a in answers)
    one = answers[0]["usage"]["prompt_tokens"]
    assert evaluated < one + 4 * 40, evaluated  # the shared part once, the tails each


def test_distinct_prompts_stay_cached_side_by_side(four_slots: RunningServer) -> None:
    prompts = [long_text(10 + i) for i in range(4)]
    for p in prompts:
        complete(four_slots.base_url, p)
    for p in prompts:
        assert cached_share(complete(four_slots.base_url, p)) > 0.9


def test_evicted_prefix_comes_back_from_host_memory(tmp_path: Path) -> None:
    server = start_server(tmp_path, "--parallel", "2", "--ctx-size", "2048", name="spill")
    try:
        first = long_text(20)
        complete(server.base_url, first)
        for seed in (21, 22, 23):  # two slots: these overwrite the first prompt's slot
            complete(server.base_url, long_text(seed))
        assert cached_share(complete(server.base_url, first)) > 0.9
        stats = httpx.get(f"{server.base_url}/health").json()["models"][DEFAULT_MODEL]
        assert stats["prompt_store_entries"] >= 1
    finally:
        stop_server(server)


def test_prompt_cache_survives_restart_and_ignores_corrupt_files(tmp_path: Path) -> None:
    models = tmp_path / "models"
    args = ("--parallel", "2", "--ctx-size", "2048", "--models-dir", str(models))
    system = long_text(30, words=300)
    server = start_server(tmp_path, *args, name="before")
    complete(server.base_url, system + "\nFirst question?")
    assert stop_server(server) == 0
    saved = list((models / "prompt-cache").glob("*/*.kv"))
    assert saved
    server = start_server(tmp_path, *args, name="after")
    try:
        again = complete(server.base_url, system + "\nSecond question?")
        assert cached_share(again) > 0.8
    finally:
        assert stop_server(server) == 0
    for path in (models / "prompt-cache").glob("*/*.kv"):
        data = bytearray(path.read_bytes())
        data[len(data) // 2] ^= 0xFF  # one flipped byte: the checksum must catch it
        path.write_bytes(bytes(data))
    server = start_server(tmp_path, *args, name="corrupt")
    try:
        body = complete(server.base_url, system + "\nThird question?")
        assert cached_share(body) < 0.5  # the damaged entry was not used
    finally:
        stop_server(server)
    assert "Traceback" not in server.log_text()


def test_more_choices_than_slots(tmp_path: Path) -> None:
    server = start_server(tmp_path, "--parallel", "2", "--ctx-size", "2048", name="waves")
    try:
        body = complete(server.base_url, "My favourite colour is", n=6, temperature=1.0,
                        max_tokens=12, seed=5, ignore_eos=True)
        texts = [c["text"] for c in body["choices"]]
        assert sorted(c["index"] for c in body["choices"]) == list(range(6))
        assert len(set(texts)) >= 5, texts
        assert body["usage"]["completion_tokens"] == 72
    finally:
        stop_server(server)
