"""Writes a tiny BERT reranker GGUF for TESTS ONLY: random weights, rank pooling
(`bert.pooling_type` 4) and a classifier head (`cls`, `cls.output`) that scores a
query-document pair, with a small WordPiece vocabulary of its own.

What it scores means nothing; every mechanism around it is real: llama.cpp loads it,
tokenizes with its WPM tokenizer (a word-start token per printable ASCII character, a
continuation token per letter and digit, a few whole words), and pools each sequence's
[CLS] token through the classifier into one score. The output is deterministic (a fixed
seed), so tests rebuild it instead of shipping a binary file.

    python -m edge_testkit.models.make_test_reranker OUT.gguf [--layers 2] [--width 32] [--seed 0]
        [--rerank-template "..."]
"""

from __future__ import annotations

import argparse
import string
from pathlib import Path

import numpy as np
from gguf import GGUFWriter, PoolingType

from edge_testkit.models.gguf_test_weights import write_out

# Token types of llama.cpp's vocabulary (llama_token_type).
_NORMAL, _CONTROL = 1, 3
SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
WORDS = ["the", "is", "of", "and", "what", "capital", "paris", "france", "city"]
HEADS = 4
CONTEXT = 512


def vocabulary() -> tuple[list[str], list[int]]:
    """The special tokens, "▁c" (a word starting with c) for every printable ASCII
    character, "c" (a word going on with c) for letters and digits, then a few words."""
    tokens = list(SPECIALS)
    printable = [chr(c) for c in range(33, 127)]
    tokens += ["▁" + c for c in printable]
    tokens += list(string.ascii_lowercase + string.digits)
    tokens += ["▁" + w for w in WORDS]
    types = [_CONTROL] * len(SPECIALS) + [_NORMAL] * (len(tokens) - len(SPECIALS))
    return tokens, types


def write_reranker(out: Path, *, layers: int = 2, width: int = 32, seed: int = 0,
                   rerank_template: str | None = None) -> Path:
    """`rerank_template`: a `tokenizer.chat_template.rerank` with {query} and {document}
    (llama-server's prompt for rerankers that need one)."""
    rng = np.random.default_rng(seed)
    tokens, types = vocabulary()
    n_vocab, n_ff = len(tokens), 2 * width
    writer = GGUFWriter(str(out), "bert")
    writer.add_name("edge-server-test-reranker")
    writer.add_context_length(CONTEXT)
    writer.add_embedding_length(width)
    writer.add_block_count(layers)
    writer.add_feed_forward_length(n_ff)
    writer.add_head_count(HEADS)
    writer.add_layer_norm_eps(1e-12)
    writer.add_causal_attention(False)
    writer.add_pooling_type(PoolingType.RANK)
    writer.add_file_type(0)  # all F32
    writer.add_tokenizer_model("bert")
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    writer.add_token_type_count(2)
    writer.add_pad_token_id(SPECIALS.index("[PAD]"))
    writer.add_unk_token_id(SPECIALS.index("[UNK]"))
    writer.add_bos_token_id(SPECIALS.index("[CLS]"))
    writer.add_sep_token_id(SPECIALS.index("[SEP]"))
    writer.add_mask_token_id(SPECIALS.index("[MASK]"))
    if rerank_template is not None:
        writer.add_string("tokenizer.chat_template.rerank", rerank_template)

    def matrix(rows: int, cols: int) -> np.ndarray:
        return (rng.standard_normal((rows, cols)) / np.sqrt(cols)).astype(np.float32)

    def vector(size: int, scale: float = 0.02) -> np.ndarray:
        return (rng.standard_normal(size) * scale).astype(np.float32)

    ones = np.ones(width, dtype=np.float32)
    writer.add_tensor("token_embd.weight", matrix(n_vocab, width))
    writer.add_tensor("token_types.weight", matrix(2, width))
    writer.add_tensor("position_embd.weight", matrix(CONTEXT, width))
    writer.add_tensor("token_embd_norm.weight", ones)
    writer.add_tensor("token_embd_norm.bias", vector(width))
    for i in range(layers):
        block = f"blk.{i}"
        for name in ("attn_q", "attn_k", "attn_v", "attn_output"):
            writer.add_tensor(f"{block}.{name}.weight", matrix(width, width))
            writer.add_tensor(f"{block}.{name}.bias", vector(width))
        writer.add_tensor(f"{block}.attn_output_norm.weight", ones)
        writer.add_tensor(f"{block}.attn_output_norm.bias", vector(width))
        writer.add_tensor(f"{block}.ffn_up.weight", matrix(n_ff, width))
        writer.add_tensor(f"{block}.ffn_up.bias", vector(n_ff))
        writer.add_tensor(f"{block}.ffn_down.weight", matrix(width, n_ff))
        writer.add_tensor(f"{block}.ffn_down.bias", vector(width))
        writer.add_tensor(f"{block}.layer_output_norm.weight", ones)
        writer.add_tensor(f"{block}.layer_output_norm.bias", vector(width))
    # The classifier: a dense layer with tanh on the pooled [CLS] state, then one score.
    writer.add_tensor("cls.weight", matrix(width, width))
    writer.add_tensor("cls.bias", vector(width))
    writer.add_tensor("cls.output.weight", matrix(1, width) * 4)
    writer.add_tensor("cls.output.bias", vector(1))
    return write_out(writer, out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--width", type=int, default=32)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--rerank-template")
    args = parser.parse_args()
    print(write_reranker(args.out, layers=args.layers, width=args.width, seed=args.seed,
                         rerank_template=args.rerank_template))


if __name__ == "__main__":
    main()
