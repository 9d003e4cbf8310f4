"""The machine's memory read bandwidth, and the decode-speed limit it sets for a model.

One decode step of a dense model reads every weight once (with tied embeddings the
output projection reads the whole embedding matrix too), so one stream cannot decode
faster than `read bandwidth / bytes of weights`. This measures read bandwidth the way a
decode step reads (each of `--threads` workers streams through its own buffer, far larger
than the caches, summing it) and prints that limit for the given GGUF files.

    python scripts/bench/bench_bandwidth.py [--threads 2] [--mb 1024] [MODEL.gguf ...]
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import statistics
import time
from pathlib import Path

import numpy as np


def _reader(size_mb: int, passes: int, start: mp.Barrier, out: mp.Queue) -> None:  # type: ignore[type-arg]
    data = np.ones(size_mb * 2**20 // 8, dtype=np.float64)
    data.sum()  # fault every page in before timing
    start.wait()
    began = time.perf_counter()
    for _ in range(passes):
        data.sum()
    out.put(passes * data.nbytes / (time.perf_counter() - began))


def read_bandwidth(threads: int, size_mb: int, passes: int = 5) -> float:
    """Bytes/s all workers read together (one process each: no GIL between them)."""
    start = mp.Barrier(threads)
    out: mp.Queue = mp.Queue()  # type: ignore[type-arg]
    workers = [mp.Process(target=_reader, args=(size_mb, passes, start, out))
               for _ in range(threads)]
    for worker in workers:
        worker.start()
    rates = [out.get() for _ in workers]
    for worker in workers:
        worker.join()
    return sum(rates)


def weight_bytes(model: Path) -> int:
    """Bytes of tensor data one decode step reads: all of it, for a dense model."""
    from gguf import GGUFReader

    return sum(int(t.n_bytes) for t in GGUFReader(model).tensors)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("models", nargs="*", type=Path)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--mb", type=int, default=1024, help="buffer per worker")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    rates = [read_bandwidth(args.threads, args.mb) for _ in range(args.rounds)]
    rate = statistics.median(rates)
    print(f"read bandwidth, {args.threads} workers: median {rate / 1e9:.1f} GB/s "
          f"(rounds: {', '.join(f'{r / 1e9:.1f}' for r in rates)})")
    for model in args.models:
        size = weight_bytes(model)
        print(f"{model.name}: {size / 2**20:.0f} MiB of weights, decode limit "
              f"{rate / size:.1f} tokens/s for one stream")


if __name__ == "__main__":
    main()
