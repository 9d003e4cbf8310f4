#!/usr/bin/env python3
"""Prompt and decode speed of one model on llama.cpp's CPU kernel paths, side by side:
`--repack off` (plain kernels) against `--repack auto` (what the probe finds safe here:
amx+repack, repack without AMX, or plain; see docs/performance.md). Raw llama.cpp
through the engine's model wrapper, no server; rounds alternate between the two loads.

    python scripts/bench/bench_kernels.py [--model smollm2|gemma3|PATH] [--rounds 5] [--threads 2]

Prints, for each path: prompt tokens/s (a fresh 512-token prompt in one batch) and
decode tokens/s of 1 and of 8 sequences (64 steps of one row each), medians of rounds.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path

from edge_server.engine.backend.batch import DecodeBatch
from edge_server.engine.backend.llama_model import ContextSettings, LlamaModel
from edge_testkit.bench.servers import resolve_model

PROMPT = 512
STEPS = 64


def measure(model: LlamaModel) -> dict[str, float]:
    batch = DecodeBatch(PROMPT)
    for seq in range(8):
        model.seq_remove(seq)
    batch.add_span([100 + (i * 7) % 1000 for i in range(PROMPT)], 0, 0, logits_last=True)
    started = time.perf_counter()
    assert batch.decode(model.ctx) == 0
    out = {"prompt tok/s": PROMPT / (time.perf_counter() - started)}
    for n in (1, 8):
        for seq in range(n):
            model.seq_remove(seq)
            batch.clear()
            batch.add_span([100 + seq] * 32, 0, seq, logits_last=True)
            assert batch.decode(model.ctx) == 0
        started = time.perf_counter()
        for step in range(STEPS):
            batch.clear()
            for seq in range(n):
                batch.add(200 + step, 32 + step, seq, logits=True)
            assert batch.decode(model.ctx) == 0
        out[f"decode x{n} tok/s"] = n * STEPS / (time.perf_counter() - started)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        path = resolve_model(args.model, Path(tmp))
        settings = {"n_ctx": 1024, "n_seq_max": 8, "n_threads": args.threads,
                    "n_batch": PROMPT}
        models = {mode: LlamaModel(path, ContextSettings(repack=mode, **settings))
                  for mode in ("off", "auto")}
        try:
            names = {mode: m.cpu_kernels for mode, m in models.items()}
            figures: dict[str, list[dict[str, float]]] = {mode: [] for mode in models}
            for r in range(args.rounds):
                for mode in (("off", "auto") if r % 2 == 0 else ("auto", "off")):
                    figures[mode].append(measure(models[mode]))
        finally:
            for m in models.values():
                m.close()
    print(f"model: {path.name}  threads: {args.threads}  rounds: {args.rounds}")
    for mode in models:
        repacked = models[mode].repacked_bytes / 2**20
        medians = {k: statistics.median(f[k] for f in figures[mode]) for k in figures[mode][0]}
        shown = "  ".join(f"{k} {v:8.1f}" for k, v in medians.items())
        print(f"  --repack {mode:4} ({names[mode]}, {repacked:.1f} MiB repacked): {shown}")


if __name__ == "__main__":
    main()
