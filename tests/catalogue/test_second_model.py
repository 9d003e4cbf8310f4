"""A second real model beside the default one: Gemma 3 270M, whose GGUF file carries no
chat template, served through a registry entry with a chat-template override."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from conftest import DEFAULT_MODEL, RunningServer, start_server, stop_server

from edge_testkit.models.gemma import GEMMA_TEMPLATE, gemma_gguf


@pytest.fixture(scope="module")
def gemma_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    tmp = tmp_path_factory.mktemp("gemma")
    gguf = gemma_gguf(tmp)
    registry = tmp / "registry.toml"
    registry.write_text(
        f'[[models]]\nid = "gemma3-270m"\naliases = ["gemma3"]\npath = "{gguf}"\n'
        f'ctx_size = 2048\nchat_template_file = "{GEMMA_TEMPLATE}"\n'
    )
    server = start_server(tmp, "--registry", str(registry), "--ctx-size", "2048",
                          "--parallel", "2", name="gemma")
    yield server
    stop_server(server)
    Path(gguf).unlink()


def test_gemma_gguf_has_no_template_and_the_override_is_used(gemma_server) -> None:
    messages = [{"role": "system", "content": "Be brief."},
                {"role": "user", "content": "Name a fruit."}]
    r = httpx.post(f"{gemma_server.v1}/chat/completions", timeout=120, json={
        "model": "gemma3", "messages": messages, "max_tokens": 6, "ignore_eos": True,
        "temperature": 0})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["choices"][0]["message"]["content"]
    expected = ("<bos><start_of_turn>user\nBe brief.\n\nName a fruit.<end_of_turn>\n"
                "<start_of_turn>model\n")
    tokens = httpx.post(f"{gemma_server.base_url}/tokenize", json={
        "model": "gemma3", "content": expected}).json()["tokens"]
    assert body["usage"]["prompt_tokens"] == len(tokens)


def test_both_models_answer_from_one_server(gemma_server) -> None:
    prompt = "The capital of France is"

    def complete(model: str) -> dict:
        r = httpx.post(f"{gemma_server.v1}/completions", timeout=120, json={
            "model": model, "prompt": prompt, "max_tokens": 8, "temperature": 0,
            "ignore_eos": True})
        assert r.status_code == 200, r.text
        return r.json()

    def tokens(model: str) -> list[int]:
        return httpx.post(f"{gemma_server.base_url}/tokenize", json={
            "model": model, "content": prompt, "add_special": True}).json()["tokens"]

    gemma, smol = complete("gemma3-270m"), complete(DEFAULT_MODEL)
    assert gemma["choices"][0]["text"] and smol["choices"][0]["text"]
    # Each request ran on its own model: the two vocabularies tokenize the prompt
    # differently, and each count is its model's (the texts may well agree).
    assert tokens("gemma3-270m") != tokens(DEFAULT_MODEL)
    assert gemma["usage"]["prompt_tokens"] == len(tokens("gemma3-270m"))
    assert smol["usage"]["prompt_tokens"] == len(tokens(DEFAULT_MODEL))
    assert gemma["usage"]["completion_tokens"] == smol["usage"]["completion_tokens"] == 8
    models = {m["id"]: m["status"] for m in
              httpx.get(f"{gemma_server.v1}/models").json()["data"]}
    assert models == {DEFAULT_MODEL: "loaded", "gemma3-270m": "loaded"}
