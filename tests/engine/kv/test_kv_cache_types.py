"""KV cache types: --cache-type-k / --cache-type-v and per-model registry fields, flash
attention for a quantized V cache (and a clear refusal where it is turned off), /health
reporting the types, and saved prompt caches kept apart per type."""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path

import httpx
from conftest import ROOT, start_server, stop_server

from edge_testkit.models.make_test_fim_model import write_model as write_fim_model


def test_types_from_flags_and_registry_are_served_and_reported(tmp_path: Path) -> None:
    model = write_fim_model(tmp_path / "fim.gguf")
    registry = tmp_path / "registry.toml"
    registry.write_text(f'[[models]]\nid = "fim-f16"\npath = "{model}"\n'
                        'cache_type_k = "f16"\ncache_type_v = "f16"\n')
    server = start_server(tmp_path, "--model", str(model), "--registry", str(registry),
                          "--cache-type-k", "q8_0", "--cache-type-v", "q4_0",
                          "--parallel", "2", "--ctx-size", "4096")
    try:
        with httpx.Client(base_url=server.base_url, timeout=120) as http:
            text = "def f(x):\n    return x + 1\n" * 8
            for model_id in ("fim", "fim-f16"):
                r = http.post("/v1/completions", json={
                    "model": model_id, "prompt": text, "max_tokens": 4, "echo": True,
                    "logprobs": 0})
                assert r.status_code == 200, r.text
                scores = r.json()["choices"][0]["logprobs"]["token_logprobs"][1:]
                assert all(math.isfinite(s) for s in scores)
            kv = http.get("/health").json()["kv_cache"]
        assert kv["fim"] == {"type_k": "q8_0", "type_v": "q4_0", "flash_attn": True}
        assert kv["fim-f16"]["type_k"] == "f16" and kv["fim-f16"]["type_v"] == "f16"
    finally:
        assert stop_server(server) == 0
    # The saved prompt caches of the two models (one file, two KV types) are kept apart.
    saved = [d for d in (tmp_path / "data/edge-server/models/prompt-cache").iterdir()
             if d.name.startswith("fim-")]
    assert len(saved) == 2, saved


def test_quantized_v_cache_without_flash_attention_is_refused(tmp_path: Path) -> None:
    model = write_fim_model(tmp_path / "fim.gguf")
    server = start_server(tmp_path, "--model", str(model), "--cache-type-v", "q8_0",
                          "--flash-attn", "off", wait=False)
    try:
        assert server.process.wait(timeout=120) != 0
    finally:
        stop_server(server)
    log = server.log_text()
    assert "needs flash attention" in log and "Traceback" not in log


def test_unknown_types_are_refused_at_start(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "edge_server", "serve", "--cache-type-k", "q3_x"],
        cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert result.returncode == 2 and "--cache-type-k" in result.stderr
    registry = tmp_path / "registry.toml"
    registry.write_text('[[models]]\nid = "m"\npath = "/nonexistent.gguf"\n'
                        'cache_type_v = "int3"\n')
    result = subprocess.run(
        [sys.executable, "-m", "edge_server", "serve", "--registry", str(registry)],
        cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert result.returncode == 2 and "cache_type_v must be one of" in result.stderr
