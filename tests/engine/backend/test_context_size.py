"""How many tokens one request may use: by default the model's trained context where its
slots' KV streams (one per slot, resident from load) fit a share of the memory budget,
else as many cells as fit, never fewer than 2,048; --ctx-size is the tokens one request
may use, at most the trained context; stated on /v1/models, /props, /api/ps and
/api/show, and the streams counted whole in /health's memory account."""

from __future__ import annotations

import random
import re
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from conftest import RunningServer, start_server, stop_server

from edge_server.catalogue.budget import memory_budget_bytes
from edge_server.engine.backend.context_size import default_context
from edge_testkit.models.gemma import gemma_gguf

SMOLLM2_TRAINED = 8192
SMOLLM2_CELL = 23040  # KV bytes of a token: 30 layers x 3 KV heads x 64 x 2 (K, V) x f16
GEMMA3_TRAINED = 32768
_WORDS = ["alpha", "beta", "gamma", "delta", "river", "mountain", "cloud", "paper",
          "window", "garden"]


def words_of_tokens(http: httpx.Client, n_tokens: int, seed: int = 0) -> str:
    """Text of about `n_tokens` tokens as the model counts them (pieces of at most 2,000
    tokens, each cut exactly; a join may merge two tokens)."""
    rng = random.Random(seed)
    pieces = []
    for start in range(0, n_tokens, 2000):
        size = min(2000, n_tokens - start)
        text = " ".join(rng.choice(_WORDS) for _ in range(size))
        tokens = http.post("/tokenize", json={"content": text}).json()["tokens"][:size]
        pieces.append(http.post("/detokenize", json={"tokens": tokens}).json()["content"])
    return " ".join(piece.strip() for piece in pieces)


def context_lengths(http: httpx.Client, model: str) -> dict[str, int]:
    """What each route says one request may use, and the trained context /api/show gives."""
    listed = next(m for m in http.get("/v1/models").json()["data"] if model in
                  (m["id"], *m.get("aliases", [])))
    props = http.get("/props").json()["default_generation_settings"]["n_ctx"]
    running = http.get("/api/ps").json()["models"][0]["context_length"]
    info = http.post("/api/show", json={"model": model}).json()["model_info"]
    trained = next(v for k, v in info.items() if k.endswith(".context_length"))
    return {"models": listed["context_length"], "props": props, "ps": running,
            "show": trained}


@pytest.fixture(scope="module")
def default_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    server = start_server(tmp_path_factory.mktemp("default-context"), name="default-context")
    yield server
    stop_server(server)
    assert "Traceback" not in server.log_text()


def served_context(http: httpx.Client) -> int:
    return context_lengths(http, "default")["models"]


def test_default_context_fits_the_budget_share_on_every_route(default_server) -> None:
    """Eight slots' streams in KV_SHARE_OF_BUDGET of the default budget (75% of RAM): the
    same figure on every route, the trained context on /api/show."""
    expected = default_context(SMOLLM2_TRAINED, SMOLLM2_CELL, memory_budget_bytes(0), 8)
    assert 2048 <= expected <= SMOLLM2_TRAINED
    with httpx.Client(base_url=default_server.base_url, timeout=60) as http:
        assert context_lengths(http, "default") == {
            "models": expected, "props": expected, "ps": expected, "show": SMOLLM2_TRAINED}


def test_kv_streams_are_resident_and_counted_whole(default_server) -> None:
    """llama.cpp clears every stream when it makes the context: the memory account counts
    all eight as allocated, at idle, and the process's RSS holds them."""
    with httpx.Client(base_url=default_server.base_url, timeout=60) as http:
        streams = 8 * served_context(http) * SMOLLM2_CELL
        memory = http.get("/health").json()["memory"]
        assert memory["kv_cache"] == streams
        assert memory["rss"] >= streams + memory["file_backed"]


@pytest.mark.slow
def test_default_server_answers_a_prompt_near_its_context(default_server) -> None:
    # Minutes on two busy cores (over 10 there with other work): a generous timeout.
    with httpx.Client(base_url=default_server.base_url, timeout=1800) as http:
        n_tokens = served_context(http) - 500
        prompt = words_of_tokens(http, n_tokens)
        r = http.post("/v1/completions", json={"model": "default", "prompt": prompt,
                                               "max_tokens": 2, "temperature": 0})
        assert r.status_code == 200, r.text
        assert r.json()["usage"]["prompt_tokens"] >= n_tokens - 50


def test_overflow_is_still_a_400_naming_both_sizes(default_server) -> None:
    with httpx.Client(base_url=default_server.base_url, timeout=60) as http:
        served = served_context(http)
        prompt = words_of_tokens(http, served + 100)
        r = http.post("/v1/completions", json={"model": "default", "prompt": prompt,
                                               "max_tokens": 1})
        assert r.status_code == 400, r.text
        message = r.json()["error"]["message"]
        sizes = [int(n) for n in re.findall(r"\d[\d,]*", message.replace(",", ""))]
        assert served in sizes and any(n > served for n in sizes), message


def test_num_ctx_is_honoured_up_to_the_served_context_and_capped(default_server) -> None:
    """Ollama's num_ctx up to the served context: a prompt fits a num_ctx just above it;
    a num_ctx past the served context is capped there; one below the prompt is a 400."""
    with httpx.Client(base_url=default_server.base_url, timeout=900) as http:
        served = served_context(http)
        n_tokens = served - 200
        prompt = words_of_tokens(http, n_tokens, seed=1)
        r = http.post("/api/generate", json={
            "model": "default", "prompt": prompt, "raw": True, "stream": False,
            "options": {"num_ctx": served - 100, "num_predict": 1, "temperature": 0}})
        assert r.status_code == 200, r.text
        assert r.json()["prompt_eval_count"] >= n_tokens - 10
        over = http.post("/api/generate", json={
            "model": "default", "prompt": prompt, "raw": True, "stream": False,
            "options": {"num_ctx": 10**6, "num_predict": 1, "temperature": 0}})
        assert over.status_code == 200, over.text
        too_long = http.post("/api/generate", json={
            "model": "default", "prompt": prompt, "raw": True, "stream": False,
            "options": {"num_ctx": n_tokens - 100, "num_predict": 1}})
        assert too_long.status_code == 400, too_long.text
        assert "num_ctx" in str(too_long.json())


def test_ctx_size_is_per_request_and_capped_at_the_trained_context(tmp_path: Path) -> None:
    for asked, served in ((1024, 1024), (100_000, SMOLLM2_TRAINED)):
        server = start_server(tmp_path, "--ctx-size", str(asked), "--parallel", "8",
                              name=f"ctx-{asked}")
        try:
            with httpx.Client(base_url=server.base_url, timeout=60) as http:
                lengths = context_lengths(http, "default")
                assert lengths["models"] == lengths["props"] == lengths["ps"] == served
        finally:
            stop_server(server)


def test_memory_budget_caps_the_default_context(tmp_path: Path) -> None:
    # A 32nd of 16,000 MB for eight streams: 500 MiB / (8 x 23,040 bytes a cell), in
    # whole 256-cell granules; all of it allocated, and counted, from the start.
    server = start_server(tmp_path, "--memory-budget-mb", "16000", "--parallel", "8",
                          name="budget")
    try:
        with httpx.Client(base_url=server.base_url, timeout=60) as http:
            expected = (16000 * 2**20 // 32 // (8 * SMOLLM2_CELL)) // 256 * 256
            assert context_lengths(http, "default")["models"] == expected == 2816
            assert http.get("/health").json()["memory"]["kv_cache"] == (
                8 * expected * SMOLLM2_CELL)
    finally:
        stop_server(server)


@pytest.mark.slow
def test_gemma3_answers_a_20000_token_prompt_in_its_trained_context(tmp_path: Path) -> None:
    gguf = gemma_gguf(tmp_path)
    server = start_server(tmp_path, "--model", str(gguf), "--ctx-size", str(GEMMA3_TRAINED),
                          "--parallel", "1", name="gemma-context")
    try:
        with httpx.Client(base_url=server.base_url, timeout=3600) as http:
            assert context_lengths(http, "default") == dict.fromkeys(
                ("models", "props", "ps", "show"), GEMMA3_TRAINED)
            prompt = words_of_tokens(http, 20_000)
            r = http.post("/v1/completions", json={"model": "default", "prompt": prompt,
                                                   "max_tokens": 1, "temperature": 0})
            assert r.status_code == 200, r.text
            assert r.json()["usage"]["prompt_tokens"] >= 19_900
    finally:
        stop_server(server)
        gguf.unlink()


def test_default_context_is_a_share_of_the_budget() -> None:
    """Eight SmolLM2 streams (23,040 bytes a cell), all resident from load: the trained
    8,192 where a 32nd of the budget holds them; fewer cells, in 256-cell granules,
    where it does not; never below 2,048 (nor above the trained context)."""
    cell, mib = SMOLLM2_CELL, 2**20
    assert default_context(8192, cell, 48 * 1024 * mib, 8) == 8192  # 64 GiB of RAM
    assert default_context(8192, cell, 18079 * mib, 8) == 3072  # 24 GiB
    assert default_context(8192, cell, 12 * 1024 * mib, 8) == 2048  # 16 GiB
    assert default_context(8192, cell, 100 * mib, 8) == 2048
    assert default_context(1024, cell, 100 * mib, 8) == 1024
    assert default_context(8192, cell, 0, 8) == 8192  # no budget: the trained context
