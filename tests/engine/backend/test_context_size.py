"""How many tokens one request may use: by default the model's trained context (a KV
stream per slot, its memory taken as cells are used), capped by the memory budget;
--ctx-size is the tokens one request may use, at most the trained context; stated on
/v1/models, /props, /api/ps and /api/show."""

from __future__ import annotations

import random
import re
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from conftest import RunningServer, start_server, stop_server
from test_second_model import gemma_gguf

from edge_server.engine.backend.context_size import default_context

SMOLLM2_TRAINED = 8192
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


def test_default_context_is_the_trained_one_on_every_route(default_server) -> None:
    with httpx.Client(base_url=default_server.base_url, timeout=60) as http:
        assert context_lengths(http, "default") == dict.fromkeys(
            ("models", "props", "ps", "show"), SMOLLM2_TRAINED)


def test_kv_streams_take_memory_as_their_cells_are_used(default_server) -> None:
    """Eight streams of 8,192 cells are 1,440 MiB allocated, but only written cells are
    resident: at idle the cache holds almost nothing, and a 1,000-token prompt adds about
    its own cells (23,040 bytes each), not a stream's."""
    with httpx.Client(base_url=default_server.base_url, timeout=600) as http:
        allocated = 8 * SMOLLM2_TRAINED * 23040
        idle = http.get("/health").json()["memory"]["kv_cache"]
        assert idle < allocated / 20, idle
        prompt = words_of_tokens(http, 1000, seed=2)
        r = http.post("/v1/completions", json={"model": "default", "prompt": prompt,
                                               "max_tokens": 2, "temperature": 0})
        assert r.status_code == 200, r.text
        used = http.get("/health").json()["memory"]["kv_cache"] - idle
        assert 900 * 23040 <= used <= 1300 * 23040 + 64 * 2**20, used


@pytest.mark.slow
def test_default_server_answers_a_7500_token_prompt(default_server) -> None:
    # Minutes on two busy cores (over 10 there with other work): a generous timeout.
    with httpx.Client(base_url=default_server.base_url, timeout=1800) as http:
        prompt = words_of_tokens(http, 7500)
        r = http.post("/v1/completions", json={"model": "default", "prompt": prompt,
                                               "max_tokens": 2, "temperature": 0})
        assert r.status_code == 200, r.text
        assert r.json()["usage"]["prompt_tokens"] >= 7450


def test_overflow_is_still_a_400_naming_both_sizes(default_server) -> None:
    with httpx.Client(base_url=default_server.base_url, timeout=60) as http:
        prompt = words_of_tokens(http, SMOLLM2_TRAINED + 100)
        r = http.post("/v1/completions", json={"model": "default", "prompt": prompt,
                                               "max_tokens": 1})
        assert r.status_code == 400, r.text
        message = r.json()["error"]["message"]
        sizes = [int(n) for n in re.findall(r"\d[\d,]*", message.replace(",", ""))]
        assert SMOLLM2_TRAINED in sizes and any(n > SMOLLM2_TRAINED for n in sizes), message


def test_num_ctx_above_the_old_default_is_honoured_and_capped(default_server) -> None:
    """Ollama's num_ctx up to the trained context: a 2,100-token prompt fits num_ctx
    2,200 (it was capped at 2,048 a request); a num_ctx past the trained context is
    capped there, so an answer may take what the prompt leaves of 8,192."""
    with httpx.Client(base_url=default_server.base_url, timeout=900) as http:
        prompt = words_of_tokens(http, 2100, seed=1)
        r = http.post("/api/generate", json={
            "model": "default", "prompt": prompt, "raw": True, "stream": False,
            "options": {"num_ctx": 2200, "num_predict": 1, "temperature": 0}})
        assert r.status_code == 200, r.text
        assert r.json()["prompt_eval_count"] >= 2090
        over = http.post("/api/generate", json={
            "model": "default", "prompt": prompt, "raw": True, "stream": False,
            "options": {"num_ctx": 10**6, "num_predict": 1, "temperature": 0}})
        assert over.status_code == 200, over.text
        too_long = http.post("/api/generate", json={
            "model": "default", "prompt": prompt, "raw": True, "stream": False,
            "options": {"num_ctx": 2000, "num_predict": 1}})
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
    # Half of 2,000 MB for eight full streams: 1,000 MiB / (8 x 23,040 bytes a cell:
    # SmolLM2, f16), in whole 256-cell granules.
    server = start_server(tmp_path, "--memory-budget-mb", "2000", "--parallel", "8",
                          name="budget")
    try:
        with httpx.Client(base_url=server.base_url, timeout=60) as http:
            expected = (1000 * 2**20 // (8 * 23040)) // 256 * 256
            assert context_lengths(http, "default")["models"] == expected < SMOLLM2_TRAINED
            assert http.get("/health").json()["memory"]["kv_cache"] <= 1000 * 2**20
    finally:
        stop_server(server)


@pytest.mark.slow
def test_gemma3_answers_a_20000_token_prompt_by_default(tmp_path: Path) -> None:
    gguf = gemma_gguf(tmp_path)
    server = start_server(tmp_path, "--model", str(gguf), name="gemma-context")
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


def test_default_context_budgets_full_streams_and_resident_ones() -> None:
    """Eight SmolLM2 streams (23,040 bytes a cell): the trained 8,192 where half the
    budget holds them all full; fewer cells, in 256-cell granules, where it does not; an
    eighth of the budget where pages cannot be given back (all resident from the start);
    never below 2,048."""
    cell, mib = 23040, 2**20
    assert default_context(8192, cell, 18 * 1024 * mib, 8) == 8192
    assert default_context(8192, cell, 2000 * mib, 8) == 5632
    assert default_context(8192, cell, 18 * 1024 * mib, 8, lazy=False) == 8192
    assert default_context(8192, cell, 8 * 1024 * mib, 8, lazy=False) == 5632
    assert default_context(8192, cell, 100 * mib, 8) == 2048
    assert default_context(1024, cell, 100 * mib, 8) == 1024
    assert default_context(8192, cell, 0, 8) == 8192  # no budget: the trained context
