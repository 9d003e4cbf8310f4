"""Compares edge_server's /v1/embeddings with llama.cpp's own `llama-embedding` tool on a
few texts, and prints the cosine similarity of each pair of vectors.

llama-embedding is built from the llama.cpp vendored in the same llama-cpp-python sdist
(CMake target `llama-embedding`); pass its path with --llama-embedding. Both sides pool
the same way: as the GGUF file declares, else mean pooling, and both L2-normalize.
Our vectors come from one request holding every text (batched together) and from one
request per text.

    .venv/bin/python scripts/bench/check_embeddings.py --llama-embedding PATH/llama-embedding

Exit status 1 when a cosine is below --min-cosine.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import tempfile
from pathlib import Path

import httpx
import numpy as np

from edge_testkit.bench.servers import EdgeServer, repack_flag, resolve_model

TEXTS = [
    "The quick brown fox jumps over the lazy dog.",
    "Paris is the capital and most populous city of France.",
    "def add(a, b):\n    return a + b",
    "Les embeddings représentent un texte comme un vecteur de nombres réels. "
    "Deux textes proches ont des vecteurs proches.",
    "Edge servers run small language models close to their users, on CPUs and "
    "small GPUs, where latency and privacy matter more than raw throughput. " * 4,
]
_SEPARATOR = "<#edge-sep#>"


def declared_pooling(model: Path) -> str | None:
    """The pooling the GGUF file declares (mean, cls, last), or None, read from its
    metadata without loading the weights."""
    import llama_cpp as lc

    from edge_server.engine.backend.runtime import init_backend
    from edge_server.engine.embeddings.embedder import POOLING_NAMES

    init_backend()  # llama.cpp's load narration goes to our log (warnings only)
    params = lc.llama_model_default_params()
    params.vocab_only = True
    handle = lc.llama_model_load_from_file(str(model).encode(), params)
    if not handle:
        raise SystemExit(f"llama.cpp could not read {model}")
    try:
        buf = bytes(256)

        def meta(key: str) -> str | None:
            n = lc.llama_model_meta_val_str(handle, key.encode(), buf, len(buf))
            return buf[:n].decode() if n >= 0 else None

        value = meta(f"{meta('general.architecture')}.pooling_type")
    finally:
        lc.llama_model_free(handle)
    try:
        return POOLING_NAMES.get(int(value)) if value is not None else None
    except ValueError:
        return None


def llama_embedding(binary: Path, model: Path, texts: list[str], threads: int,
                    flash_attn: str) -> np.ndarray:
    pooling = declared_pooling(model)
    # A model that declares no pooling (a causal chat model): edge_server mean-pools it.
    pooling_args = [] if pooling else ["--pooling", "mean"]
    with tempfile.NamedTemporaryFile("w", suffix=".txt", encoding="utf-8") as prompts:
        prompts.write(_SEPARATOR.join(texts))
        prompts.flush()
        cmd = [str(binary), "-m", str(model), "-f", prompts.name, "--embd-separator",
               _SEPARATOR, *pooling_args, "--embd-normalize", "2",
               "--embd-output-format", "array", "-t", str(threads),
               "-c", "2048", "-b", "2048", "-ub", "2048", "--flash-attn", flash_attn,
               *repack_flag()]
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=600, check=False)
    if done.returncode != 0:
        raise SystemExit(f"llama-embedding failed ({done.returncode}):\n{done.stderr[-2000:]}")
    start = done.stdout.index("[[")
    vectors, _ = json.JSONDecoder().raw_decode(done.stdout[start:])
    return np.array(vectors, dtype=np.float64)


def ours(base_url: str, texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
    """The texts in one request (batched together), and each in a request of its own."""
    def embed(inputs: list[str]) -> np.ndarray:
        r = httpx.post(f"{base_url}/v1/embeddings", timeout=600,
                       json={"model": "default", "input": inputs})
        r.raise_for_status()
        return np.array([d["embedding"] for d in r.json()["data"]], dtype=np.float64)

    return embed(texts), np.vstack([embed([t]) for t in texts])


def cosine(a: np.ndarray, b: np.ndarray) -> float:
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--llama-embedding", type=Path, required=True,
                        help="path of llama.cpp's llama-embedding binary")
    parser.add_argument("--model", default="smollm2",
                        help="smollm2 (the embedded default), gemma3 or a GGUF path")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--min-cosine", type=float, default=0.999)
    parser.add_argument("--flash-attn", choices=["on", "off", "auto"], default="off",
                        help="llama-embedding's flash attention (edge_server's embedding "
                             "context runs without it)")
    args = parser.parse_args()
    if not args.llama_embedding.is_file():
        raise SystemExit(f"no llama-embedding at {args.llama_embedding}")
    with tempfile.TemporaryDirectory() as workdir:
        model = resolve_model(args.model, Path(workdir))
        reference = llama_embedding(args.llama_embedding, model, TEXTS, args.threads,
                                    args.flash_attn)
        server = EdgeServer(model, args.threads, ["--parallel", "1"],
                            env={"XDG_DATA_HOME": workdir})
        try:
            batched, single = ours(server.url, TEXTS)
        finally:
            server.close()
    worst = 1.0
    print(f"{'text':<48} {'batched':>9} {'single':>9}  (cosine with llama-embedding)")
    for text, ref, b, s in zip(TEXTS, reference, batched, single, strict=True):
        cb, cs = cosine(ref, b), cosine(ref, s)
        worst = min(worst, cb, cs)
        shown = text.replace("\n", " ")
        shown = shown if len(shown) <= 46 else shown[:45] + "…"
        print(f"{shown:<48} {cb:9.6f} {cs:9.6f}")
    print(f"lowest cosine {worst:.6f} (threshold {args.min_cosine})")
    return 0 if worst >= args.min_cosine else 1


if __name__ == "__main__":
    raise SystemExit(main())
