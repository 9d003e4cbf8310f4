"""What the make_test_* makers share: random llama-architecture weights, and writing
a GGUFWriter's file out (the files mean nothing; llama.cpp loads and runs them)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from gguf import GGUFWriter


def llama_writer(out: Path, name: str, *, context: int, width: int, layers: int, n_ff: int,
                 heads: int) -> GGUFWriter:
    """A writer for a llama model of these sizes, its hyperparameters written (F16)."""
    writer = GGUFWriter(str(out), "llama")
    writer.add_name(name)
    writer.add_context_length(context)
    writer.add_embedding_length(width)
    writer.add_block_count(layers)
    writer.add_feed_forward_length(n_ff)
    writer.add_head_count(heads)
    writer.add_head_count_kv(heads)
    writer.add_rope_dimension_count(width // heads)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_file_type(1)  # mostly F16
    return writer


def add_llama_weights(writer: GGUFWriter, rng: np.random.Generator, *, n_vocab: int,
                      width: int, layers: int, n_ff: int, tied: bool) -> None:
    """A llama model's tensors, F16 matrices scaled as trained weights are; `tied`: no
    output.weight (llama.cpp ties the output layer to the embeddings, halving the file)."""

    def matrix(rows: int, cols: int) -> np.ndarray:
        return (rng.standard_normal((rows, cols)) / np.sqrt(cols)).astype(np.float16)

    def norm() -> np.ndarray:
        return np.ones(width, dtype=np.float32)

    writer.add_tensor("token_embd.weight", matrix(n_vocab, width))
    writer.add_tensor("output_norm.weight", norm())
    if not tied:
        writer.add_tensor("output.weight", matrix(n_vocab, width))
    for i in range(layers):
        block = f"blk.{i}"
        writer.add_tensor(f"{block}.attn_norm.weight", norm())
        for name in ("attn_q", "attn_k", "attn_v", "attn_output"):
            writer.add_tensor(f"{block}.{name}.weight", matrix(width, width))
        writer.add_tensor(f"{block}.ffn_norm.weight", norm())
        writer.add_tensor(f"{block}.ffn_gate.weight", matrix(n_ff, width))
        writer.add_tensor(f"{block}.ffn_up.weight", matrix(n_ff, width))
        writer.add_tensor(f"{block}.ffn_down.weight", matrix(width, n_ff))


class EncoderWeights:
    """Random weights of the test projectors' encoders (CLIP- and Whisper-style): small
    enough to stay finite through any number of blocks, drawn in a fixed order from
    `rng` so the files are deterministic."""

    def __init__(self, rng: np.random.Generator) -> None:
        self.rng = rng

    def matrix(self, rows: int, cols: int) -> np.ndarray:
        return (self.rng.standard_normal((rows, cols)) / np.sqrt(cols)).astype(np.float16)

    def vector(self, n: int, value: float | None = None) -> np.ndarray:
        if value is not None:
            return np.full(n, value, dtype=np.float32)
        return (self.rng.standard_normal(n) * 0.02).astype(np.float32)

    def block(self, prefix: str, hidden: int, feed_forward: int, *,
              key_bias: bool = True) -> dict[str, np.ndarray]:
        """One pre-norm transformer block's tensors, named as clip.cpp reads them
        (`prefix`: "v.blk.0", "a.blk.0"); Whisper's key projection has no bias."""
        tensors = {}
        for name in ("attn_q", "attn_k", "attn_v", "attn_out"):
            tensors[f"{prefix}.{name}.weight"] = self.matrix(hidden, hidden)
            if key_bias or name != "attn_k":
                tensors[f"{prefix}.{name}.bias"] = self.vector(hidden)
        for name in ("ln1", "ln2"):
            tensors[f"{prefix}.{name}.weight"] = self.vector(hidden, 1.0)
            tensors[f"{prefix}.{name}.bias"] = self.vector(hidden, 0.0)
        tensors[f"{prefix}.ffn_up.weight"] = self.matrix(feed_forward, hidden)
        tensors[f"{prefix}.ffn_up.bias"] = self.vector(feed_forward)
        tensors[f"{prefix}.ffn_down.weight"] = self.matrix(hidden, feed_forward)
        tensors[f"{prefix}.ffn_down.bias"] = self.vector(hidden)
        return tensors


def write_out(writer: GGUFWriter, out: Path) -> Path:
    """Header, metadata and tensors to the file, closed."""
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return out
