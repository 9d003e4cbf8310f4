"""What a restarted server holds in RAM at idle: the prompt store's saved entries stay on
disk until a request restores one (then it is read, checked, and reused), and the
embedding context does not exist until the first embeddings request."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from conftest import DEFAULT_MODEL, RunningServer, start_server, stop_server

ARGS = ("--parallel", "1", "--ctx-size", "2048", "--prompt-cache-mb", "64")
# Two prompts of a few hundred tokens (prefixes under 128 tokens are not saved).
PROMPTS = [f"Chapter {k}: " + " ".join(f"item{k}x{j}" for j in range(120)) for k in range(2)]


def complete(server: RunningServer, prompt: str) -> dict[str, Any]:
    r = httpx.post(f"{server.v1}/completions", timeout=120, json={
        "model": DEFAULT_MODEL, "prompt": prompt, "max_tokens": 1, "temperature": 0})
    assert r.status_code == 200, r.text
    return r.json()


def health(server: RunningServer) -> dict[str, Any]:
    body: dict[str, Any] = httpx.get(f"{server.base_url}/health", timeout=30).json()
    return body


def model_stats(server: RunningServer) -> dict[str, int]:
    return health(server)["models"][DEFAULT_MODEL]


@pytest.fixture(scope="module")
def restarted(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    """A server whose previous run saved both prompts' KV at shutdown."""
    tmp = tmp_path_factory.mktemp("prompt-store")
    first = start_server(tmp, *ARGS, name="first")
    try:
        for prompt in PROMPTS:  # one slot: the second prompt spills the first to RAM
            complete(first, prompt)
    finally:
        assert stop_server(first) == 0
    assert len(list((tmp / "data").rglob("prompt-cache/*/*.kv"))) == 2
    server = start_server(tmp, *ARGS, name="restarted")
    yield server
    stop_server(server)
    assert "Traceback" not in server.log_text()


def test_saved_prompts_stay_on_disk_until_used(restarted: RunningServer) -> None:
    memory = health(restarted)["memory"]
    assert memory["prompt_store"] == 0
    assert memory["embedding_context"] == 0
    stats = model_stats(restarted)
    assert stats["prompt_store_entries"] == 2 and stats["prompt_store_on_disk_only"] == 2
    assert stats["prompt_store_bytes"] == 0

    # The first prompt again, longer: its saved prefix is read from disk and restored.
    body = complete(restarted, PROMPTS[0] + " And then?")
    assert body["usage"]["prompt_tokens_details"]["cached_tokens"] >= 128
    stats = model_stats(restarted)
    assert stats["prompt_store_on_disk_only"] == 1  # the other one still is not read
    assert 0 < stats["prompt_store_bytes"] == health(restarted)["memory"]["prompt_store"]


def test_a_corrupt_saved_prompt_is_evaluated_again(restarted: RunningServer) -> None:
    files = list((restarted.log_path.parent / "data").rglob("prompt-cache/*/*.kv"))
    assert len(files) == 2
    for path in files:  # flip the last byte of each: the checksum no longer matches
        raw = bytearray(path.read_bytes())
        raw[-1] ^= 0xFF
        path.write_bytes(bytes(raw))
    # The second prompt's entry is still unread: reading it now finds the damage.
    body = complete(restarted, PROMPTS[1] + " And then?")
    assert body["usage"]["prompt_tokens_details"]["cached_tokens"] < 128
    assert model_stats(restarted)["prompt_store_on_disk_only"] == 0
    assert complete(restarted, PROMPTS[1] + " And then?")["choices"][0]["text"] == \
        body["choices"][0]["text"]


def test_the_embedding_context_is_made_by_the_first_embeddings_request(
        restarted: RunningServer) -> None:
    before = health(restarted)["memory"]
    assert before["embedding_context"] == 0
    r = httpx.post(f"{restarted.v1}/embeddings", timeout=120,
                   json={"model": DEFAULT_MODEL, "input": "a text to embed"})
    assert r.status_code == 200, r.text
    assert len(r.json()["data"][0]["embedding"]) > 0
    after = health(restarted)["memory"]
    assert after["embedding_context"] > 0
