"""What a model will hold, worked out from its GGUF header before it loads: at least what
llama.cpp then allocates (weights, KV streams, compute buffers) and not far above it,
for the default and for set contexts; a file whose header cannot be read falls back to
its size and a margin."""

from __future__ import annotations

from pathlib import Path

import pytest

from edge_server.catalogue.default_conversion import served_default_model_path
from edge_server.engine.backend.gguf_header import GGUFHeader
from edge_server.engine.backend.llama_model import ContextSettings, LlamaModel
from edge_server.engine.backend.load_estimate import estimated_bytes


def test_the_header_gives_the_model_shape() -> None:
    header = GGUFHeader(served_default_model_path())
    assert header.values["general.architecture"] == "llama"
    assert header.number("llama.block_count") == 30
    assert header.number("llama.attention.head_count_kv") == 3
    assert header.lengths["tokenizer.ggml.tokens"] == 49152


@pytest.mark.parametrize("settings", [
    ContextSettings(n_seq_max=8, kv_budget_bytes=16 << 30, n_threads=1),
    ContextSettings(n_ctx=1000, n_seq_max=3, n_threads=1),
    ContextSettings(n_ctx=2048, n_seq_max=2, flash_attn="off", cache_type_k="q8_0",
                    n_threads=1),
], ids=["default", "small", "no-flash-q8"])
def test_the_estimate_covers_what_llama_cpp_allocates(settings: ContextSettings) -> None:
    path = served_default_model_path()
    estimate = estimated_bytes(path, settings)
    model = LlamaModel(path, settings)
    try:
        held = model.held_bytes()
    finally:
        model.close()
    assert held <= estimate <= held * 1.25 + (16 << 20), (held, estimate)


def test_an_unreadable_header_falls_back_to_the_file_size(tmp_path: Path) -> None:
    broken = tmp_path / "broken.gguf"
    broken.write_bytes(b"GGUF\x03\x00\x00\x00" + b"\xff" * 4096)
    with pytest.raises(ValueError):
        GGUFHeader(broken)
    assert estimated_bytes(broken, ContextSettings()) == int(4104 * 1.25) + (64 << 20)
