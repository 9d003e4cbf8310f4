"""LoRA adapters through Ollama's /api/create, with the official `ollama` client as users
run it (create_blob, then create with `adapters`), and in a Modelfile's ADAPTER line: the
made model serves its source's file under the adapter (at scale 1), after a restart too,
and deleting the last model made with an adapter removes its blob. The adapter is the
scaling one of edge_testkit/models/make_test_lora.py: at scale 1 the gap between the two
likeliest first tokens grows by 1 + FACTOR."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import ollama
import pytest
from conftest import RunningServer, arch_model, start_server, stop_server

from edge_testkit.models.make_test_lora import FACTOR, write_adapter

BASE = "moe"


def first_gap(server: RunningServer, model: str) -> float:
    r = httpx.post(f"{server.v1}/completions", timeout=120, json={
        "model": model, "prompt": "river stone lamp", "max_tokens": 1, "temperature": 0,
        "logprobs": 2})
    assert r.status_code == 200, r.text
    top = sorted(r.json()["choices"][0]["logprobs"]["top_logprobs"][0].values(), reverse=True)
    return top[0] - top[1]


def create(server: RunningServer, body: dict[str, Any]) -> httpx.Response:
    return httpx.post(f"{server.base_url}/api/create", json={"stream": False, **body},
                      timeout=120)


def test_adapters_made_with_the_ollama_client_serve_and_outlive_a_restart(
        tmp_path: Path) -> None:
    model = arch_model("qwen3moe")
    adapter = write_adapter("scaling", model, tmp_path / "scaling.gguf")
    args = ("--model", str(model), "--model-id", BASE)
    server = start_server(tmp_path, *args)
    try:
        client = ollama.Client(host=server.base_url)
        digest = client.create_blob(adapter)
        client.create(model="moe-scaled", from_=BASE, adapters={"scaling.gguf": digest})
        r = create(server, {"model": "moe-modelfile",
                            "modelfile": f"FROM {BASE}\nADAPTER {digest}\n"})
        assert r.status_code == 200, r.text
        base = first_gap(server, BASE)
        for name in ("moe-scaled", "moe-modelfile"):
            assert first_gap(server, name) == pytest.approx(base * (1 + FACTOR), rel=0.01)
        assert {"moe-scaled:latest", "moe-modelfile:latest"} <= {
            m.model for m in client.list().models}
        answer = client.chat(model="moe-scaled", messages=[{"role": "user", "content": "hi"}],
                             options={"num_predict": 4})
        assert answer.message.role == "assistant"

        assert stop_server(server) == 0
        server = start_server(tmp_path, *args, name="restarted")
        assert first_gap(server, "moe-scaled") == pytest.approx(base * (1 + FACTOR), rel=0.01)

        blob = tmp_path / "data" / "edge-server" / "models" / "blobs" / \
            f"sha256-{digest.removeprefix('sha256:')}"
        assert blob.is_file()
        client = ollama.Client(host=server.base_url)
        client.delete("moe-scaled")
        assert blob.is_file()  # moe-modelfile still uses it
        client.delete("moe-modelfile")
        assert not blob.exists()
    finally:
        stop_server(server)
    assert "Traceback" not in server.log_text()


def test_what_is_no_adapter_of_the_model_is_a_400_naming_adapters(tmp_path: Path) -> None:
    model = arch_model("qwen3moe")
    server = start_server(tmp_path, "--model", str(model), "--model-id", BASE)
    try:
        client = ollama.Client(host=server.base_url)
        other = write_adapter("scaling", arch_model("gemma3"), tmp_path / "gemma-lora.gguf")
        cases = [
            {"adapters": {"m.gguf": client.create_blob(model)}},  # a model, not an adapter
            {"adapters": {"g.gguf": client.create_blob(other)}},  # another architecture
            {"adapters": {"x.gguf": "sha256:" + "0" * 64}},  # never uploaded
            {"modelfile": f"FROM {BASE}\nADAPTER ./lora.gguf\n"},  # a client-side path
        ]
        for case in cases:
            r = create(server, {"model": "bad", "from": BASE, **case})
            assert r.status_code == 400, (case, r.text)
            assert "adapters" in r.text, r.text
        assert "bad:latest" not in {m.model for m in client.list().models}
    finally:
        assert stop_server(server) == 0
