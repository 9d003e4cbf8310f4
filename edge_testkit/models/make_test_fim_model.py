"""Writes a tiny llama-architecture GGUF model for TESTS ONLY: random weights and a
character-level vocabulary that declares fill-in-the-middle tokens (prefix, suffix,
middle, pad, repo name, file separator), which neither of the real test models has.

What it writes means nothing; every mechanism around it is real: llama.cpp loads it,
tokenizes with it (SentencePiece-style, one token per printable ASCII character, bytes
for the rest), reports its FIM tokens, and generates from it. The output is deterministic
(a fixed seed), so tests rebuild it instead of shipping a binary file.

    python -m edge_testkit.models.make_test_fim_model OUT.gguf [--layers 2] [--width 128] [--seed 0]
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
from gguf import PoolingType

from edge_testkit.models.gguf_test_weights import add_llama_weights, llama_writer, write_out

# Token types of llama.cpp's vocabulary (llama_token_type).
_NORMAL, _UNKNOWN, _CONTROL, _BYTE = 1, 2, 3, 6
FIM_TOKENS = {
    "fim_pre": "<|fim_prefix|>",
    "fim_suf": "<|fim_suffix|>",
    "fim_mid": "<|fim_middle|>",
    "fim_pad": "<|fim_pad|>",
    "fim_rep": "<|repo_name|>",
    "fim_sep": "<|file_sep|>",
}
HEADS = 4
CONTEXT = 8192


def vocabulary() -> tuple[list[str], list[int]]:
    """<unk> <s> </s>, the 256 byte tokens, the FIM tokens, then printable ASCII."""
    tokens = ["<unk>", "<s>", "</s>"]
    types = [_UNKNOWN, _CONTROL, _CONTROL]
    tokens += [f"<0x{b:02X}>" for b in range(256)]
    types += [_BYTE] * 256
    tokens += list(FIM_TOKENS.values())
    types += [_CONTROL] * len(FIM_TOKENS)
    tokens += ["▁"] + [chr(c) for c in range(33, 127)]  # "▁": SentencePiece's space
    types += [_NORMAL] * 95
    return tokens, types


def write_model(out: Path, *, layers: int = 2, width: int = 128, seed: int = 0,
                rank_pooling: bool = False, rerank_template: str | None = None) -> Path:
    """`rank_pooling`, `rerank_template`: declare it a causal reranker (as Qwen3-Reranker
    is), with or without llama-server's rerank prompt."""
    rng = np.random.default_rng(seed)
    tokens, types = vocabulary()
    n_vocab, n_ff = len(tokens), 2 * width
    writer = llama_writer(out, "edge-server-test-fim", context=CONTEXT, width=width,
                          layers=layers, n_ff=n_ff, heads=HEADS)
    writer.add_tokenizer_model("llama")
    writer.add_token_list(tokens)
    writer.add_token_scores([0.0] * n_vocab)
    writer.add_token_types(types)
    writer.add_unk_token_id(0)
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_add_bos_token(True)
    writer.add_add_eos_token(False)
    writer.add_bool("tokenizer.ggml.add_space_prefix", False)
    if rank_pooling:
        writer.add_pooling_type(PoolingType.RANK)
    if rerank_template is not None:
        writer.add_string("tokenizer.chat_template.rerank", rerank_template)
    for name, text in FIM_TOKENS.items():
        writer.add_uint32(f"tokenizer.ggml.{name}_token_id", tokens.index(text))

    add_llama_weights(writer, rng, n_vocab=n_vocab, width=width, layers=layers, n_ff=n_ff,
                      tied=False)
    return write_out(writer, out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--width", type=int, default=128)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    print(write_model(args.out, layers=args.layers, width=args.width, seed=args.seed))


if __name__ == "__main__":
    main()
