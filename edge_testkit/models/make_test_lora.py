"""Writes LoRA adapter GGUFs for a test model, with known effects, for TESTS ONLY.

llama.cpp's adapter format (src/llama-adapter.cpp): `general.type` "adapter", the base
model's `general.architecture`, `adapter.type` "lora", `adapter.lora.alpha`, and for each
adapted weight W (ne = {n_in, n_out}) a pair `W.lora_a` (ne {n_in, rank}) and `W.lora_b`
(ne {rank, n_out}); a decode adds scale * alpha / rank * B(A x) to W x.

- `zero`: B = 0 on the attention projections of every block and on the output layer:
  the graph grows, the answer must not change at all.
- `scaling`: on the output layer only, A = I and B = FACTOR * W_output (rank n_embd,
  alpha = rank), so at scale s every logit becomes (1 + s * FACTOR) times the base
  model's: the gap between any two tokens' logprobs grows by exactly that factor, while
  the prompt's KV (which the output layer never touches) stays as it was.

    python -m edge_testkit.models.make_test_lora {zero,scaling} BASE.gguf OUT.gguf
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
from gguf import GGUFReader, GGUFWriter

from edge_testkit.models.gguf_test_weights import write_out

FACTOR = 0.5  # the scaling adapter's logit factor per unit of scale
ZERO_RANK = 4


def _tensors(base: Path) -> tuple[str, dict[str, np.ndarray]]:
    reader = GGUFReader(base)
    field = reader.fields["general.architecture"]
    arch = bytes(field.parts[field.data[0]]).decode()
    arrays = {t.name: np.asarray(t.data) for t in reader.tensors}
    return arch, arrays


def _writer(out: Path, arch: str, alpha: float) -> GGUFWriter:
    writer = GGUFWriter(str(out), arch)
    writer.add_string("general.type", "adapter")
    writer.add_string("adapter.type", "lora")
    writer.add_float32("adapter.lora.alpha", alpha)
    return writer


def write_adapter(kind: str, base: Path, out: Path) -> Path:
    arch, tensors = _tensors(base)
    if "output.weight" not in tensors:
        raise ValueError(f"{base.name} ties its output layer to token_embd: no output.weight")
    rng = np.random.default_rng(0)
    if kind == "zero":
        writer = _writer(out, arch, float(ZERO_RANK))
        names = [n for n in tensors
                 if n == "output.weight" or n.endswith((".attn_q.weight", ".attn_v.weight"))]
        for name in sorted(names):
            n_out, n_in = tensors[name].shape  # numpy's order: ne reversed
            a = rng.standard_normal((ZERO_RANK, n_in)).astype(np.float32)
            writer.add_tensor(f"{name}.lora_a", a)
            writer.add_tensor(f"{name}.lora_b", np.zeros((n_out, ZERO_RANK), np.float32))
        return write_out(writer, out)
    if kind == "scaling":
        output = tensors["output.weight"].astype(np.float32)  # (n_vocab, n_embd)
        n_embd = output.shape[1]
        writer = _writer(out, arch, float(n_embd))  # alpha = rank: scale as given
        writer.add_tensor("output.weight.lora_a", np.eye(n_embd, dtype=np.float32))
        writer.add_tensor("output.weight.lora_b", (FACTOR * output).astype(np.float32))
        return write_out(writer, out)
    raise ValueError(f"unknown adapter kind {kind!r}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("kind", choices=["zero", "scaling"])
    parser.add_argument("base", type=Path)
    parser.add_argument("out", type=Path)
    args = parser.parse_args()
    write_adapter(args.kind, args.base, args.out)


if __name__ == "__main__":
    main()
