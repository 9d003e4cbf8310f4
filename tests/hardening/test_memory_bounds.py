"""Memory bounds, enforced before any work: the JSON-schema grammar cache (bounded in
bytes, keyed on the schema without annotations), the size of one answer (the product of
prompts, choices, echoed tokens and logprobs), and /tokenize and /detokenize (bounded
like prompts). Large answers are built off the event loop and still arrive whole."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from conftest import DEFAULT_MODEL, RunningServer, start_server, stop_server

from edge_server.api.common.bounds.response_bounds import MAX_LOGPROB_ENTRIES
from edge_server.engine.grammar.json_grammar import compile_schema, grammar_cache_bytes
from edge_server.engine.grammar.schema_cache import CACHE_BYTES, without_annotations


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


def big_schema(seed: int, megabytes: float = 7.0) -> dict:
    """A schema of ~`megabytes`, nearly all of it descriptions (as generated API
    schemas are), distinct for each seed."""
    props = 100
    text = f"seed {seed} " + "lorem ipsum dolor sit amet " * int(megabytes * 2**20 / props / 27)
    return {"type": "object", "description": f"record {seed}",
            "properties": {f"p{i}": {"type": "integer", "description": f"{i} {text}",
                                     "title": f"P{i}", "examples": [seed]}
                           for i in range(props)}}


# --- the grammar cache -----------------------------------------------------------------


def test_annotations_do_not_make_another_grammar() -> None:
    a = {"type": "object", "title": "A", "description": "first",
         "properties": {"x": {"type": "string", "description": "one", "$comment": "c"},
                        "description": {"type": "integer", "examples": [1]}},
         "required": ["x", "description"]}
    b = {**a, "title": "B", "description": "second",
         "properties": {"x": {"type": "string", "description": "two"},
                        "description": {"type": "integer"}}}
    assert compile_schema(a) is compile_schema(b)  # one cache entry for both
    # A property *named* description is data, not an annotation: it stays.
    assert "description" in without_annotations(a)["properties"]
    assert '\\"description\\"' in compile_schema(a).grammar
    assert compile_schema(a) is not compile_schema({**a, "required": ["x"]})


def test_the_grammar_cache_is_bounded_in_bytes() -> None:
    for i in range(300):
        compile_schema({"type": "object", "properties": {
            f"k{i}_{j}": {"type": "string", "maxLength": 20} for j in range(40)}})
    assert 0 < grammar_cache_bytes() <= CACHE_BYTES


@pytest.fixture(scope="module")
def small(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    server = start_server(tmp_path_factory.mktemp("bounds"), "--parallel", "1",
                          "--ctx-size", "1024", name="bounds")
    yield server
    stop_server(server)
    assert "Traceback" not in server.log_text()


def test_ten_large_schemas_leave_little_behind(small: RunningServer) -> None:
    """Ten distinct ~7 MB schemas: RSS grows by less than 50 MB (their texts once
    stayed in the cache's keys: 70-150 MB)."""

    def ask(seed: int) -> None:
        r = httpx.post(f"{small.v1}/chat/completions", timeout=300, json={
            "model": DEFAULT_MODEL, "max_tokens": 2,
            "messages": [{"role": "user", "content": "Give a record."}],
            "response_format": {"type": "json_schema", "json_schema": {
                "name": "record", "schema": big_schema(seed)}}})
        assert r.status_code == 200, r.text[:300]

    ask(0)  # the first one warms what any request warms
    before = rss_mb(small.process.pid)
    for seed in range(1, 11):
        ask(seed)
    grown = rss_mb(small.process.pid) - before
    assert grown < 50, f"RSS grew by {grown:.0f} MB"


# --- the size of one answer --------------------------------------------------------------


def test_echo_logprobs_n_product_is_refused_before_work(server: RunningServer) -> None:
    """8 prompts of 2,000 token ids, n 128, echo, logprobs 5: once a 328 MB answer after
    81 s; now a 400 naming the field, at once."""
    prompts = [[100 + (p * 7 + i) % 5000 for i in range(2000)] for p in range(8)]
    started = time.monotonic()
    r = httpx.post(f"{server.v1}/completions", timeout=60, json={
        "model": DEFAULT_MODEL, "prompt": prompts, "n": 128, "echo": True, "logprobs": 5,
        "max_tokens": 1})
    assert r.status_code == 400, r.text[:300]
    error = r.json()["error"]
    assert error["param"] == "n" and error["code"] == "response_too_large"
    assert f"{MAX_LOGPROB_ENTRIES:,}" in error["message"]
    assert time.monotonic() - started < 10
    # One prompt alone with echo and logprobs 5 stays answerable: the field is named
    # only when it multiplies.
    r = httpx.post(f"{server.v1}/completions", timeout=60, json={
        "model": DEFAULT_MODEL, "prompt": prompts[0] * 60, "echo": True, "logprobs": 5,
        "max_tokens": 1})
    assert r.status_code == 400 and r.json()["error"]["param"] == "prompt"  # the context


def test_chat_choices_with_many_logprobs_are_refused(server: RunningServer) -> None:
    r = httpx.post(f"{server.v1}/chat/completions", timeout=30, json={
        "model": DEFAULT_MODEL, "messages": [{"role": "user", "content": "Count."}],
        "n": 128, "logprobs": True, "top_logprobs": 20})
    assert r.status_code == 400, r.text[:300]
    assert r.json()["error"]["param"] == "n"


def test_a_large_answer_arrives_whole(server: RunningServer) -> None:
    """Echo with logprobs over 16 choices: ~290,000 entries, below the bound, built off
    the event loop; every choice carries every prompt token's entry."""
    prompt = [100 + i % 3000 for i in range(3000)]
    r = httpx.post(f"{server.v1}/completions", timeout=300, json={
        "model": DEFAULT_MODEL, "prompt": prompt, "n": 16, "echo": True, "logprobs": 5,
        "max_tokens": 1, "temperature": 0})
    assert r.status_code == 200, r.text[:300]
    choices = r.json()["choices"]
    assert len(choices) == 16
    for choice in choices:
        lp = choice["logprobs"]
        assert len(lp["tokens"]) == len(lp["top_logprobs"]) == 3001
        assert lp["token_logprobs"][0] is None and lp["top_logprobs"][5]


# --- /tokenize and /detokenize ----------------------------------------------------------------


def test_tokenize_is_bounded_like_prompts(server: RunningServer) -> None:
    huge = httpx.post(f"{server.base_url}/tokenize", timeout=60, json={
        "model": DEFAULT_MODEL, "content": "ab " * 1_000_000})
    assert huge.status_code == 400
    assert huge.json()["error"]["param"] == "content"
    # Short enough in bytes, but more tokens than the context holds (4,096).
    over = httpx.post(f"{server.base_url}/tokenize", timeout=60, json={
        "model": DEFAULT_MODEL, "content": " 7" * 5000})
    assert over.status_code == 400
    assert over.json()["error"]["type"] == "invalid_request_error"
    assert over.json()["error"]["code"] == "context_length_exceeded"
    fits = httpx.post(f"{server.base_url}/tokenize", timeout=60, json={
        "model": DEFAULT_MODEL, "content": " 7" * 1000})
    assert fits.status_code == 200 and 1000 <= len(fits.json()["tokens"]) <= 4096


def test_detokenize_is_bounded_like_prompts(server: RunningServer) -> None:
    r = httpx.post(f"{server.base_url}/detokenize", timeout=60, json={
        "model": DEFAULT_MODEL, "tokens": [100] * 5000})
    assert r.status_code == 400 and r.json()["error"]["param"] == "tokens"
    r = httpx.post(f"{server.base_url}/detokenize", timeout=60, json={
        "model": DEFAULT_MODEL, "tokens": [100] * 4096})
    assert r.status_code == 200


# --- the memory account -------------------------------------------------------------------


def test_health_and_metrics_account_for_memory(server: RunningServer) -> None:
    r = httpx.post(f"{server.v1}/embeddings", timeout=120,
                   json={"model": DEFAULT_MODEL, "input": "a text to embed"})
    assert r.status_code == 200
    r = httpx.post(f"{server.v1}/completions", timeout=120,
                   json={"model": DEFAULT_MODEL, "prompt": "Memory", "max_tokens": 2})
    assert r.status_code == 200  # a step has used the compute buffers
    memory = httpx.get(f"{server.base_url}/health", timeout=30).json()["memory"]
    assert set(memory) == {"rss", "weights", "weights_mapped", "weights_copied", "kv_cache",
                           "compute_buffers", "prompt_store", "checkpoints", "embedding_context",
                           "projector", "image_cache", "lora_adapters", "draft_model",
                           "grammar_cache", "file_backed", "other"}
    assert memory["rss"] == pytest.approx(rss_mb(server.process.pid) * 2**20, rel=0.2)
    assert memory["weights"] > 50 * 2**20  # SmolLM2's 145 MB (Q8_0), as llama.cpp allocated them
    # 4 streams of 4,096 cells, 30 layers x 3 KV heads x 64 x 2 (K and V) in f16: 360 MiB,
    # all of it resident from load (llama.cpp clears it), so counted whole.
    assert memory["kv_cache"] == 4 * 4096 * 30 * 3 * 64 * 2 * 2
    assert memory["compute_buffers"] > 0 and memory["embedding_context"] > 0
    # The file is memory-mapped: its pages read so far are file-backed, with the libraries.
    assert 0 < memory["weights_mapped"] <= memory["weights"]
    assert memory["weights_copied"] == memory["weights"] - memory["weights_mapped"]
    assert memory["file_backed"] > 0
    # Resident for sure: the KV cache and the file-backed pages (the compute buffers are
    # counted as allocated, their untouched pages not resident).
    assert memory["rss"] >= memory["kv_cache"] + memory["file_backed"]
    summed = ("weights", "weights_mapped", "rss", "other")
    parts = sum(v for k, v in memory.items() if k not in summed)
    assert memory["other"] == memory["rss"] - parts
    metrics = httpx.get(f"{server.base_url}/metrics", timeout=30).text
    gauges = {line.split('"')[1]: float(line.split()[-1]) for line in metrics.splitlines()
              if line.startswith("edge_server_memory_bytes{")}
    assert set(gauges) == set(memory)
    assert gauges["kv_cache"] == memory["kv_cache"] and gauges["rss"] > 0


# --- freed snapshots go back to the system ---------------------------------------------


def test_prompt_store_churn_does_not_grow_the_rest_of_memory(tmp_path: Path) -> None:
    """Every new long prompt snapshots its KV state into the prompt store (megabytes,
    copied once more into bytes) and evicts an older entry. With glibc's sliding mmap
    threshold those freed buffers stayed resident: RSS less the store grew by tens of
    MB per new prompt. Fixed at start (malloc_tuning.py), it stays flat."""
    server = start_server(tmp_path, "--prompt-cache-mb", "48", "--parallel", "2")
    try:
        def outside_store() -> float:
            memory = httpx.get(f"{server.base_url}/health").json()["memory"]
            return (memory["rss"] - memory["prompt_store"]) / 2**20

        def ask(k: int) -> None:
            system = f"Rules of set {k}: " + " ".join(f"item {k}-{i} is {i * k % 97}"
                                                      for i in range(110))
            r = httpx.post(f"{server.base_url}/v1/chat/completions", timeout=120, json={
                "messages": [{"role": "system", "content": system},
                             {"role": "user", "content": "ok?"}], "max_tokens": 1})
            assert r.status_code == 200

        for k in range(4):  # fill the store (about 12 MB an entry) and warm up
            ask(k)
        before = outside_store()
        for k in range(4, 14):  # each saves a new entry and evicts one
            ask(k)
        grown = outside_store() - before
        assert grown < 20, f"RSS less the prompt store grew {grown:.0f} MiB"
    finally:
        stop_server(server)
