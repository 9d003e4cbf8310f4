"""Predicted outputs (`prediction` on chat) against none, on one edge_server: the code-edit
workload of bench_code_edit.py asked as a chat (a ~300-token block of code, one rename,
temperature 0, every answer the same length with `ignore_eos`), each round sending the
same request once with the original code as the prediction and once without, in
alternating order. Prints decode tokens/s (after the first token) of both, their ratio,
and the prediction tokens accepted.

    .venv/bin/python scripts/bench/bench_prediction.py --rounds 5 [--model gemma3]

Traffic goes to 127.0.0.1 only.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import tempfile
import time
from pathlib import Path

import httpx
from bench_code_edit import CHANGES, CODE
from bench_compare import fresh_tag

from edge_testkit.bench.servers import EdgeServer, resolve_model


def edit_messages(tag: str, old: str, new: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": (
        f"# file {tag}\n```python\n{CODE}```\n\nRewrite this file with `{old}` renamed to "
        f"`{new}` everywhere, otherwise unchanged. Answer with the code only.")}]


def timed_chat(url: str, messages: list[dict[str, str]], max_tokens: int,
               prediction: str | None) -> tuple[float, int, int]:
    """Decode tokens/s after the first token, tokens, and prediction tokens accepted."""
    body: dict = {"model": "bench", "messages": messages, "max_tokens": max_tokens,
                  "temperature": 0, "ignore_eos": True, "stream": True,
                  "stream_options": {"include_usage": True}}
    if prediction is not None:
        body["prediction"] = {"type": "content", "content": prediction}
    first, tokens, accepted = None, 0, 0
    with httpx.stream("POST", f"{url}/v1/chat/completions", json=body, timeout=900) as r:
        if r.status_code != 200:
            raise SystemExit(f"{r.status_code}: {r.read().decode()}")
        for line in r.iter_lines():
            if not line.startswith("data: {"):
                continue
            chunk = json.loads(line[6:])
            details = (chunk.get("usage") or {}).get("completion_tokens_details") or {}
            accepted = details.get("accepted_prediction_tokens", accepted)
            for choice in chunk.get("choices") or []:
                if (choice.get("delta") or {}).get("content"):
                    tokens += 1
                    if first is None:
                        first = time.perf_counter()
    end = time.perf_counter()
    return max(tokens - 1, 0) / max(end - (first or end), 1e-9), tokens, accepted


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2",
                        help="smollm2 (default), gemma3, or a GGUF file")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--edit-tokens", type=int, default=330)
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--edge-args", default="", help="more edge_server options")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        model = resolve_model(args.model, Path(tmp))
        server = EdgeServer(model, args.threads, args.edge_args.split())
        try:
            rates: dict[str, list[float]] = {"prediction": [], "none": []}
            accepted: list[int] = []
            for r in range(args.rounds):
                old, new = random.Random(5 + r).choice(CHANGES)
                messages = edit_messages(fresh_tag(), old, new)
                # Warm the prompt's prefix so that both requests decode after a cache hit.
                timed_chat(server.url, messages, 1, None)
                order = ["prediction", "none"] if r % 2 == 0 else ["none", "prediction"]
                for kind in order:
                    rate, _, kept = timed_chat(server.url, messages, args.edit_tokens,
                                               CODE if kind == "prediction" else None)
                    rates[kind].append(rate)
                    if kind == "prediction":
                        accepted.append(kept)
            for kind, figures in rates.items():
                print(f"{kind:12} {statistics.median(figures):8.2f} tok/s  (rounds: "
                      f"{', '.join(f'{x:.2f}' for x in figures)})")
            ratio = statistics.median(rates["prediction"]) / statistics.median(rates["none"])
            print(f"prediction / none: {ratio:.2f}x; prediction tokens accepted per answer: "
                  f"{statistics.median(accepted):.0f}")
        finally:
            server.close()


if __name__ == "__main__":
    main()
