"""Writes a tiny random-weight GGUF of one of the architectures whose memory is not a
plain attention KV cache, with a REAL tokenizer, for TESTS ONLY.

The small models people run are mostly not plain transformers: Qwen3.5 (gated delta-net
layers between attention layers), LFM2 (short convolutions), Nemotron-H and Granite 4-H
(Mamba-2 layers beside attention), Mamba-2 (recurrent only), Qwen3-MoE (experts) and
Gemma 3 (sliding-window attention). Each model here has llama.cpp's tensor names and
hyperparameters for its architecture (`src/models/<arch>.cpp` of the vendored sources:
load_arch_hparams / load_arch_tensors), a few layers of width 64, and the tokenizer and
chat template of a `models/ggml-vocab-*.gguf` (make_test_vocab_model.py), so llama.cpp
builds the very memory (recurrent states, hybrid caches, sliding windows) the real
model gets. What it generates means nothing; the output is deterministic (a fixed seed).

    python -m edge_testkit.models.make_test_arch_model ARCH VOCAB.gguf OUT.gguf [--seed 0]

ARCH: one of ARCHS (qwen35, lfm2, nemotron_h, granitehybrid, mamba2, qwen3moe, gemma3).
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path

import numpy as np
from gguf import GGUFWriter

from edge_testkit.models.gguf_test_weights import write_out
from edge_testkit.models.make_test_vocab_model import add_tokenizer

WIDTH = 64
HEADS = 4
HEAD = WIDTH // HEADS
N_FF = 128
CONTEXT = 8192
# Gemma 3's window, small enough that test prompts outgrow it.
SLIDING_WINDOW = 64
# Mamba-2 / gated delta-net state: small, as llama.cpp's kernels allow.
SSM_STATE = 16
SSM_CONV = 4


class Weights:
    """Adds random tensors to a writer. Shapes are given as ggml writes them in
    llama.cpp's sources ({ne0, ne1, ...}); numpy's order is the reverse."""

    def __init__(self, writer: GGUFWriter, rng: np.random.Generator) -> None:
        self.writer = writer
        self.rng = rng

    def matrix(self, name: str, *ne: int) -> None:
        values = self.rng.standard_normal(tuple(reversed(ne))) / np.sqrt(ne[0])
        self.writer.add_tensor(name, values.astype(np.float32))

    def ones(self, name: str, *ne: int) -> None:
        self.writer.add_tensor(name, np.ones(tuple(reversed(ne)), dtype=np.float32))

    def values(self, name: str, array: np.ndarray) -> None:
        self.writer.add_tensor(name, array.astype(np.float32))

    def embeddings(self, n_vocab: int) -> None:
        """token_embd and the output layer, F16 (the largest tensors). Not tied: tied to
        the embeddings, a random model's likeliest next token is the one it just read."""
        for name in ("token_embd.weight", "output.weight"):
            values = self.rng.standard_normal((n_vocab, WIDTH)) / np.sqrt(WIDTH)
            self.writer.add_tensor(name, values.astype(np.float16))

    def attention(self, block: str, *, q_width: int = WIDTH, kv_heads: int = HEADS,
                  norms: bool = True) -> None:
        self.matrix(f"{block}.attn_q.weight", WIDTH, q_width)
        self.matrix(f"{block}.attn_k.weight", WIDTH, kv_heads * HEAD)
        self.matrix(f"{block}.attn_v.weight", WIDTH, kv_heads * HEAD)
        self.matrix(f"{block}.attn_output.weight", HEADS * HEAD, WIDTH)
        if norms:
            self.ones(f"{block}.attn_q_norm.weight", HEAD)
            self.ones(f"{block}.attn_k_norm.weight", HEAD)

    def gated_ffn(self, block: str) -> None:
        self.matrix(f"{block}.ffn_gate.weight", WIDTH, N_FF)
        self.matrix(f"{block}.ffn_up.weight", WIDTH, N_FF)
        self.matrix(f"{block}.ffn_down.weight", N_FF, WIDTH)

    def mamba2(self, block: str, *, d_inner: int, n_group: int, n_head: int) -> None:
        """A Mamba-2 mixer (mamba2.cpp, nemotron-h.cpp, granite-hybrid.cpp)."""
        conv_dim = d_inner + 2 * n_group * SSM_STATE
        self.matrix(f"{block}.ssm_in.weight", WIDTH, d_inner + conv_dim + n_head)
        self.matrix(f"{block}.ssm_conv1d.weight", SSM_CONV, conv_dim)
        self.values(f"{block}.ssm_conv1d.bias", np.zeros(conv_dim))
        self.values(f"{block}.ssm_dt.bias", self.rng.uniform(-4, -2, n_head))
        # A < 0: the state decays (llama.cpp's test-llama-archs does the same).
        self.values(f"{block}.ssm_a", -np.abs(self.rng.standard_normal((n_head, 1))) - 0.5)
        self.values(f"{block}.ssm_d", np.ones((n_head, 1)))
        self.ones(f"{block}.ssm_norm.weight", d_inner // n_group, n_group)
        self.matrix(f"{block}.ssm_out.weight", d_inner, WIDTH)


def _common(writer: GGUFWriter, arch: str, layers: int) -> None:
    writer.add_context_length(CONTEXT)
    writer.add_embedding_length(WIDTH)
    writer.add_block_count(layers)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_file_type(0)  # mostly F32
    writer.add_float32(f"{arch}.rope.freq_base", 10000.0)


def _attention_keys(writer: GGUFWriter, kv_heads: int) -> None:
    """The FFN width and attention heads of the attention models: `kv_heads` KV heads,
    keys and values one head wide."""
    writer.add_feed_forward_length(N_FF)
    writer.add_head_count(HEADS)
    writer.add_head_count_kv(kv_heads)
    writer.add_key_length(HEAD)
    writer.add_value_length(HEAD)


def _ssm_keys(writer: GGUFWriter, arch: str, *, d_inner: int, n_group: int,
              n_head: int) -> None:
    writer.add_uint32(f"{arch}.ssm.conv_kernel", SSM_CONV)
    writer.add_uint32(f"{arch}.ssm.inner_size", d_inner)
    writer.add_uint32(f"{arch}.ssm.state_size", SSM_STATE)
    writer.add_uint32(f"{arch}.ssm.time_step_rank", n_head)
    writer.add_uint32(f"{arch}.ssm.group_count", n_group)


def _qwen35(writer: GGUFWriter, w: Weights) -> None:
    """Gated delta-net layers with a full-attention layer every 2nd (qwen35.cpp: the
    real models have one in 4)."""
    layers, n_group, n_v_heads = 4, 2, 4
    d_inner = SSM_STATE * n_v_heads
    _common(writer, "qwen35", layers)
    _attention_keys(writer, HEADS // 2)
    writer.add_rope_dimension_count(HEAD)
    writer.add_array("qwen35.rope.dimension_sections", [4, 2, 2, 0])
    writer.add_uint32("qwen35.full_attention_interval", 2)
    _ssm_keys(writer, "qwen35", d_inner=d_inner, n_group=n_group, n_head=n_v_heads)
    key_dim = SSM_STATE * n_group
    for i in range(layers):
        block = f"blk.{i}"
        w.ones(f"{block}.attn_norm.weight", WIDTH)
        w.ones(f"{block}.post_attention_norm.weight", WIDTH)
        if (i + 1) % 2 == 0:  # attention: q carries its output gate (2 x head)
            w.attention(block, q_width=2 * HEADS * HEAD, kv_heads=HEADS // 2)
        else:
            w.matrix(f"{block}.attn_qkv.weight", WIDTH, 2 * key_dim + d_inner)
            w.matrix(f"{block}.attn_gate.weight", WIDTH, d_inner)
            w.matrix(f"{block}.ssm_conv1d.weight", SSM_CONV, 2 * key_dim + d_inner)
            w.values(f"{block}.ssm_dt.bias", np.zeros(n_v_heads))
            w.values(f"{block}.ssm_a", -np.abs(w.rng.standard_normal(n_v_heads)) - 0.5)
            w.matrix(f"{block}.ssm_beta.weight", WIDTH, n_v_heads)
            w.matrix(f"{block}.ssm_alpha.weight", WIDTH, n_v_heads)
            w.ones(f"{block}.ssm_norm.weight", SSM_STATE)
            w.matrix(f"{block}.ssm_out.weight", d_inner, WIDTH)
        w.gated_ffn(block)


def _lfm2(writer: GGUFWriter, w: Weights) -> None:
    """Short-convolution layers and attention layers (lfm2.cpp: a layer with no KV
    heads is a convolution)."""
    kv_heads = [0, HEADS, 0]
    _common(writer, "lfm2", len(kv_heads))
    writer.add_feed_forward_length(N_FF)
    writer.add_head_count(HEADS)
    writer.add_head_count_kv(kv_heads)
    writer.add_uint32("lfm2.shortconv.l_cache", 3)
    w.ones("token_embd_norm.weight", WIDTH)  # LFM2's output norm, under this name
    for i, heads in enumerate(kv_heads):
        block = f"blk.{i}"
        w.ones(f"{block}.attn_norm.weight", WIDTH)
        w.ones(f"{block}.ffn_norm.weight", WIDTH)
        if heads:
            w.attention(block)
        else:
            w.matrix(f"{block}.shortconv.conv.weight", 3, WIDTH)
            w.matrix(f"{block}.shortconv.in_proj.weight", WIDTH, 3 * WIDTH)
            w.matrix(f"{block}.shortconv.out_proj.weight", WIDTH, WIDTH)
        w.gated_ffn(block)


def _nemotron_h(writer: GGUFWriter, w: Weights) -> None:
    """A Mamba-2 layer, an attention layer and an MLP layer (nemotron-h.cpp: no KV heads
    and no FFN is Mamba, no FFN attention, an FFN an MLP)."""
    kv_heads, n_ff = [0, HEADS, 0], [0, 0, N_FF]
    d_inner, n_group, n_head = 2 * WIDTH, 2, 4
    _common(writer, "nemotron_h", len(kv_heads))
    writer.add_feed_forward_length(n_ff)
    writer.add_head_count(HEADS)
    writer.add_head_count_kv(kv_heads)
    writer.add_float32("nemotron_h.attention.layer_norm_epsilon", 1e-5)
    _ssm_keys(writer, "nemotron_h", d_inner=d_inner, n_group=n_group, n_head=n_head)
    for i, (heads, ff) in enumerate(zip(kv_heads, n_ff, strict=True)):
        block = f"blk.{i}"
        w.ones(f"{block}.attn_norm.weight", WIDTH)
        if ff:
            w.matrix(f"{block}.ffn_up.weight", WIDTH, ff)
            w.matrix(f"{block}.ffn_down.weight", ff, WIDTH)
        elif heads:
            w.attention(block, norms=False)
        else:
            w.mamba2(block, d_inner=d_inner, n_group=n_group, n_head=n_head)


def _granitehybrid(writer: GGUFWriter, w: Weights) -> None:
    """Mamba-2 layers and an attention layer, each with a gated FFN (granite-hybrid.cpp:
    a layer with no KV heads is Mamba; its inner size must be twice the width)."""
    kv_heads = [0, HEADS, 0]
    d_inner, n_group, n_head = 2 * WIDTH, 1, 4
    _common(writer, "granitehybrid", len(kv_heads))
    writer.add_feed_forward_length(N_FF)
    writer.add_head_count(HEADS)
    writer.add_head_count_kv(kv_heads)
    writer.add_float32("granitehybrid.residual_scale", 0.5)
    writer.add_float32("granitehybrid.embedding_scale", 4.0)
    writer.add_float32("granitehybrid.attention.scale", 1.0 / HEAD)
    writer.add_float32("granitehybrid.logit_scale", 1.0)
    _ssm_keys(writer, "granitehybrid", d_inner=d_inner, n_group=n_group, n_head=n_head)
    for i, heads in enumerate(kv_heads):
        block = f"blk.{i}"
        w.ones(f"{block}.attn_norm.weight", WIDTH)
        if heads:
            w.attention(block, norms=False)
        else:
            w.mamba2(block, d_inner=d_inner, n_group=n_group, n_head=n_head)
        w.ones(f"{block}.ffn_norm.weight", WIDTH)
        w.gated_ffn(block)


def _mamba2(writer: GGUFWriter, w: Weights) -> None:
    """Mamba-2 layers only: a recurrent state, no KV cache at all (mamba2.cpp)."""
    layers, d_inner, n_group, n_head = 2, 2 * WIDTH, 1, 4
    _common(writer, "mamba2", layers)
    writer.add_feed_forward_length(0)
    writer.add_head_count(0)
    _ssm_keys(writer, "mamba2", d_inner=d_inner, n_group=n_group, n_head=n_head)
    for i in range(layers):
        block = f"blk.{i}"
        w.ones(f"{block}.attn_norm.weight", WIDTH)
        w.mamba2(block, d_inner=d_inner, n_group=n_group, n_head=n_head)


def _qwen3moe(writer: GGUFWriter, w: Weights) -> None:
    """Attention with a mixture of 4 experts (qwen3moe.cpp), all 4 used per token: with
    top-k routing a router's near-tie flips an expert under another batch shape's
    rounding (a discontinuity real MoE models have too), and a served answer parts from
    the reference's with no fault of the memory, which is what these models test. The
    experts' weights still come from the router (softmax), through the MoE kernels."""
    layers, experts, n_ff_exp = 2, 4, 64
    _common(writer, "qwen3moe", layers)
    _attention_keys(writer, HEADS // 2)
    writer.add_expert_count(experts)
    writer.add_expert_used_count(experts)
    writer.add_expert_feed_forward_length(n_ff_exp)
    for i in range(layers):
        block = f"blk.{i}"
        w.ones(f"{block}.attn_norm.weight", WIDTH)
        w.attention(block, kv_heads=HEADS // 2)
        w.ones(f"{block}.ffn_norm.weight", WIDTH)
        w.matrix(f"{block}.ffn_gate_inp.weight", WIDTH, experts)
        w.matrix(f"{block}.ffn_gate_exps.weight", WIDTH, n_ff_exp, experts)
        w.matrix(f"{block}.ffn_up_exps.weight", WIDTH, n_ff_exp, experts)
        w.matrix(f"{block}.ffn_down_exps.weight", n_ff_exp, WIDTH, experts)


def _gemma3(writer: GGUFWriter, w: Weights) -> None:
    """A sliding-window attention layer, then a full one (gemma3.cpp; the real models
    have five sliding layers to each full one)."""
    layers = 2
    _common(writer, "gemma3", layers)
    _attention_keys(writer, 1)
    writer.add_sliding_window(SLIDING_WINDOW)
    writer.add_uint32("gemma3.attention.sliding_window_pattern", 2)
    writer.add_float32("gemma3.rope.freq_base_swa", 10000.0)
    for i in range(layers):
        block = f"blk.{i}"
        w.ones(f"{block}.attn_norm.weight", WIDTH)
        w.attention(block, kv_heads=1)
        w.ones(f"{block}.post_attention_norm.weight", WIDTH)
        w.ones(f"{block}.ffn_norm.weight", WIDTH)
        w.gated_ffn(block)
        w.ones(f"{block}.post_ffw_norm.weight", WIDTH)


ARCHS: dict[str, Callable[[GGUFWriter, Weights], None]] = {
    "qwen35": _qwen35, "lfm2": _lfm2, "nemotron_h": _nemotron_h,
    "granitehybrid": _granitehybrid, "mamba2": _mamba2, "qwen3moe": _qwen3moe,
    "gemma3": _gemma3,
}


def write_model(arch: str, vocab: Path, out: Path, *, seed: int = 0) -> Path:
    if arch not in ARCHS:
        raise ValueError(f"unknown architecture {arch!r}; one of {', '.join(ARCHS)}")
    rng = np.random.default_rng(seed)
    writer = GGUFWriter(str(out), arch)
    writer.add_name(f"edge-server-test-{arch}")
    n_vocab = add_tokenizer(writer, vocab)
    weights = Weights(writer, rng)
    weights.embeddings(n_vocab)
    if arch != "lfm2":
        weights.ones("output_norm.weight", WIDTH)
    ARCHS[arch](writer, weights)
    return write_out(writer, out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("arch", choices=sorted(ARCHS))
    parser.add_argument("vocab", type=Path, help="a models/ggml-vocab-*.gguf of llama.cpp")
    parser.add_argument("out", type=Path)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    print(write_model(args.arch, args.vocab, args.out, seed=args.seed))


if __name__ == "__main__":
    main()
