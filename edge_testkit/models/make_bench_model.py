"""Writes random-weight GGUFs with the exact shapes of models people run, for BENCHMARKS.

Decoding speed depends on a model's architecture, shapes, vocabulary size and weight
types, not on what its weights say: a random-weight file with Qwen2.5-1.5B's shapes and
Q4_K_M decodes exactly as fast as Qwen2.5-1.5B-Instruct-Q4_K_M.gguf. The real weights
cannot be downloaded everywhere; these can be made anywhere, in a few minutes.

Each model gets its real tokenizer (copied from llama.cpp's `models/ggml-vocab-*.gguf`,
same vocabulary size as the model's embedding) and its real chat template. Weights are
written as F16, then quantized by the installed llama.cpp (`llama_model_quantize`), the
same code path as `llama-quantize`, so the file's kernels are the real ones.

What differs from the real file: the weights are noise, so answers are gibberish and
often loop (use `ignore_eos` and fixed lengths when timing; prompt-lookup drafting
accepts far more on loops than on real text). Llama 3.2's `rope_freqs` scaling tensor is
left out (its cost is nil; llama.cpp then ropes without the long-context scaling).

    python -m edge_testkit.models.make_bench_model qwen2.5-1.5b OUT.gguf [--type Q4_K_M]
    python -m edge_testkit.models.make_bench_model --list
"""

from __future__ import annotations

import argparse
import ctypes
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from gguf import GGUFReader, GGUFValueType, GGUFWriter

from edge_testkit.models.llama_sources import vendor_dir


@dataclass(frozen=True)
class Shape:
    arch: str  # llama.cpp architecture name
    vocab: str  # models/ggml-vocab-<vocab>.gguf
    template: str  # models/templates/<template>.jinja
    n_vocab: int
    width: int
    layers: int
    heads: int
    kv_heads: int
    ffn: int
    context: int
    rope_base: float
    norm_eps: float
    qkv_bias: bool = False


SHAPES = {
    # Qwen/Qwen2.5-1.5B-Instruct: config.json of the release.
    "qwen2.5-1.5b": Shape("qwen2", "qwen2", "Qwen-Qwen2.5-7B-Instruct", 151936, 1536, 28,
                          12, 2, 8960, 32768, 1e6, 1e-6, qkv_bias=True),
    # Qwen/Qwen2.5-3B-Instruct.
    "qwen2.5-3b": Shape("qwen2", "qwen2", "Qwen-Qwen2.5-7B-Instruct", 151936, 2048, 36,
                        16, 2, 11008, 32768, 1e6, 1e-6, qkv_bias=True),
    # Qwen/Qwen2.5-0.5B-Instruct.
    "qwen2.5-0.5b": Shape("qwen2", "qwen2", "Qwen-Qwen2.5-7B-Instruct", 151936, 896, 24,
                          14, 2, 4864, 32768, 1e6, 1e-6, qkv_bias=True),
    # meta-llama/Llama-3.2-1B-Instruct.
    "llama3.2-1b": Shape("llama", "llama-bpe", "meta-llama-Llama-3.2-3B-Instruct", 128256,
                         2048, 16, 32, 8, 8192, 131072, 500000.0, 1e-5),
    # meta-llama/Llama-3.2-3B-Instruct.
    "llama3.2-3b": Shape("llama", "llama-bpe", "meta-llama-Llama-3.2-3B-Instruct", 128256,
                         3072, 28, 24, 8, 8192, 131072, 500000.0, 1e-5),
}

# llama.cpp's llama_ftype values for the types worth benchmarking.
FILE_TYPES = {"F16": 1, "Q4_0": 2, "Q4_1": 3, "Q8_0": 7, "Q4_K_M": 15, "Q5_K_M": 17,
              "Q6_K": 18, "IQ4_NL": 25}


def _copy_tokenizer(writer: GGUFWriter, vocab_file: Path, n_vocab: int) -> None:
    """Every `tokenizer.*` key of llama.cpp's vocabulary file, as it is there."""
    reader = GGUFReader(vocab_file)
    for key, field in reader.fields.items():
        if not key.startswith("tokenizer.") or key == "tokenizer.chat_template":
            continue
        kind = field.types[0]
        value = field.contents()
        if kind == GGUFValueType.ARRAY:
            if key == "tokenizer.ggml.tokens" and len(value) != n_vocab:
                raise SystemExit(f"{vocab_file.name} has {len(value)} tokens, not {n_vocab}")
            writer.add_array(key, value)
        elif kind == GGUFValueType.STRING:
            writer.add_string(key, value)
        elif kind == GGUFValueType.BOOL:
            writer.add_bool(key, value)
        else:
            writer.add_uint32(key, int(value))


def write_f16(shape: Shape, out: Path, *, seed: int = 0) -> Path:
    sources = vendor_dir()
    rng = np.random.default_rng(seed)
    head_dim = shape.width // shape.heads
    kv_width = shape.kv_heads * head_dim
    writer = GGUFWriter(str(out), shape.arch)
    writer.add_name(f"edge-server-bench-{shape.arch}-{shape.width}x{shape.layers}")
    writer.add_context_length(shape.context)
    writer.add_embedding_length(shape.width)
    writer.add_block_count(shape.layers)
    writer.add_feed_forward_length(shape.ffn)
    writer.add_head_count(shape.heads)
    writer.add_head_count_kv(shape.kv_heads)
    writer.add_rope_dimension_count(head_dim)
    writer.add_rope_freq_base(shape.rope_base)
    writer.add_layer_norm_rms_eps(shape.norm_eps)
    writer.add_file_type(1)
    _copy_tokenizer(writer, sources / "models" / f"ggml-vocab-{shape.vocab}.gguf",
                    shape.n_vocab)
    template = sources / "models" / "templates" / f"{shape.template}.jinja"
    writer.add_chat_template(template.read_text())

    # (name, rows, cols): cols 0 for a vector. Both families tie the output projection
    # to the embedding (no output.weight).
    tensors: list[tuple[str, int, int]] = [("token_embd.weight", shape.n_vocab, shape.width),
                                           ("output_norm.weight", shape.width, 0)]
    for i in range(shape.layers):
        block = f"blk.{i}"
        tensors += [(f"{block}.attn_norm.weight", shape.width, 0),
                    (f"{block}.attn_q.weight", shape.width, shape.width),
                    (f"{block}.attn_k.weight", kv_width, shape.width),
                    (f"{block}.attn_v.weight", kv_width, shape.width)]
        if shape.qkv_bias:
            tensors += [(f"{block}.attn_q.bias", shape.width, 0),
                        (f"{block}.attn_k.bias", kv_width, 0),
                        (f"{block}.attn_v.bias", kv_width, 0)]
        tensors += [(f"{block}.attn_output.weight", shape.width, shape.width),
                    (f"{block}.ffn_norm.weight", shape.width, 0),
                    (f"{block}.ffn_gate.weight", shape.ffn, shape.width),
                    (f"{block}.ffn_up.weight", shape.ffn, shape.width),
                    (f"{block}.ffn_down.weight", shape.width, shape.ffn)]

    def values(name: str, rows: int, cols: int) -> np.ndarray:
        if cols:  # a weight matrix: F16, scaled as trained weights are
            data = rng.standard_normal((rows, cols), dtype=np.float32)
            data *= 1.0 / np.sqrt(cols)
            return data.astype(np.float16)
        if name.endswith(".bias"):
            return rng.standard_normal(rows, dtype=np.float32) * np.float32(0.02)
        return np.ones(rows, dtype=np.float32)  # a norm

    # Described first, then written one at a time: a 3B model's weights never sit in
    # memory together.
    for name, rows, cols in tensors:
        dtype = np.dtype(np.float16 if cols else np.float32)
        dims = (rows, cols) if cols else (rows,)
        writer.add_tensor_info(name, dims, dtype, rows * max(cols, 1) * dtype.itemsize)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    for name, rows, cols in tensors:
        writer.write_tensor_data(values(name, rows, cols))
    writer.close()
    return out


def quantize(source: Path, out: Path, file_type: str, *, threads: int = 0) -> Path:
    """llama.cpp's own quantizer (what `llama-quantize` runs)."""
    import llama_cpp

    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = FILE_TYPES[file_type]
    params.nthread = threads
    status = llama_cpp.llama_model_quantize(str(source).encode(), str(out).encode(),
                                            ctypes.byref(params))
    if status != 0:
        raise SystemExit(f"quantizing to {file_type} failed ({status})")
    return out


def make(name: str, out: Path, file_type: str = "Q4_K_M", *, seed: int = 0) -> Path:
    shape = SHAPES[name]
    if file_type == "F16":
        return write_f16(shape, out, seed=seed)
    with tempfile.TemporaryDirectory(dir=out.parent) as work:
        f16 = write_f16(shape, Path(work) / "f16.gguf", seed=seed)
        return quantize(f16, out, file_type)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", nargs="?", choices=sorted(SHAPES))
    parser.add_argument("out", nargs="?", type=Path)
    parser.add_argument("--type", default="Q4_K_M", choices=sorted(FILE_TYPES))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--list", action="store_true", help="print the shapes and exit")
    args = parser.parse_args()
    if args.list or args.model is None or args.out is None:
        for name, shape in SHAPES.items():
            print(f"{name}: {shape}")
        return
    print(make(args.model, args.out, args.type, seed=args.seed))


if __name__ == "__main__":
    main()
