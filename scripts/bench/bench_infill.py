#!/usr/bin/env python3
"""Keystrokes against POST /infill (prints figures; not a timed test): 20 successive
requests on a ~2,000-token file, each one character longer at the cursor, in the shape
llama.vscode sends: the file's text as `input_extra` chunks, the lines around the cursor
as `input_prefix` / `input_suffix`. Prints each request's latency and cached share, then
the p50 latency and the smallest cached share from the second request on.

    python scripts/bench/bench_infill.py [--model PATH] [--layers 4] [--width 256] [--threads N]

Without --model it serves the synthetic FIM model of edge_testkit/models/make_test_fim_model.py
(random weights, at the given size): its latency is that of a model of that size, its
completions mean nothing, and the cached share is the server's, whatever the model.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path

import httpx

from edge_testkit.bench.servers import EdgeServer

FILE_TOKENS = 2000
KEYSTROKES = 20


def source_line(i: int) -> str:
    return f"def step_{i}(state, value):\n    return state.update(key={i}, value=value)\n"


def file_of(url: str, tokens: int) -> list[str]:
    """Lines of a Python file of at least `tokens` tokens in the served vocabulary."""
    lines: list[str] = []
    while True:
        lines.append(source_line(len(lines)))
        r = httpx.post(f"{url}/tokenize", json={"model": "bench", "content": "".join(lines)})
        if len(r.json()["tokens"]) >= tokens:
            return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--width", type=int, default=256)
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--n-predict", type=int, default=16)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        model = args.model
        if model is None:
            from edge_testkit.models.make_test_fim_model import write_model

            model = write_model(Path(tmp) / "fim.gguf", layers=args.layers, width=args.width)
        server = EdgeServer(model, args.threads, ["--parallel", "2", "--ctx-size", "8192",
                                                  "--draft-max", "0"],
                            env={"XDG_DATA_HOME": tmp})
        try:
            lines = file_of(server.url, FILE_TOKENS)
            cursor = len(lines) - 4  # the cursor sits near the end of the file
            # llama.vscode's ring buffer: the file away from the cursor, in chunks.
            chunks = [{"filename": "app.py", "text": "".join(lines[k:min(k + 16, cursor - 8)])}
                      for k in range(0, cursor - 8, 16)]
            prefix = "".join(lines[cursor - 8:cursor])
            suffix = "".join(lines[cursor:])
            typed = "def step_next(state, value):\n    return state.merge(value)"
            results = []
            for k in range(KEYSTROKES):
                body = {"model": "bench", "input_extra": chunks, "input_suffix": suffix,
                        "input_prefix": prefix + typed[: len(typed) - KEYSTROKES + k + 1],
                        "n_predict": args.n_predict, "temperature": 0}
                start = time.perf_counter()
                r = httpx.post(f"{server.url}/infill", json=body, timeout=600)
                elapsed = time.perf_counter() - start
                answer = r.json()
                share = answer["tokens_cached"] / answer["tokens_evaluated"]
                results.append((elapsed, share))
                print(f"keystroke {k + 1:2d}: {elapsed * 1000:7.1f} ms, prompt "
                      f"{answer['tokens_evaluated']} tokens, cached {share:.1%}, "
                      f"generated {answer['tokens_predicted']}", flush=True)
        finally:
            server.close()
    later = results[1:]
    print(f"\nmodel {model.name}, {args.threads} threads, n_predict {args.n_predict}, file "
          f"{FILE_TOKENS}+ tokens (extra {sum(len(c['text']) for c in chunks)} chars)")
    print(f"first request: {results[0][0] * 1000:.0f} ms")
    print(f"requests 2-{KEYSTROKES}: p50 {statistics.median(e for e, _ in later) * 1000:.0f} ms,"
          f" cached share min {min(s for _, s in later):.1%}, "
          f"mean {statistics.mean(s for _, s in later):.1%}")


if __name__ == "__main__":
    main()
