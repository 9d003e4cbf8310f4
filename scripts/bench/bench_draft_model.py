"""Speculative decoding with a draft model against none, on one machine, in one run: a
target with Qwen2.5-1.5B's shapes (`--target`) and its 0.5B sibling's as the draft
(`--draft`; random weights of
edge_testkit.models.make_bench_model, Qwen2's real vocabulary: both decode as fast as the
real files), three edge_servers up at once, requests sent to each in turn, rounds in
alternating order, medians:

- `off`: no drafting (`--draft-max 0`);
- `shipped`: `--model-draft`, drafting where the cost model expects it to pay;
- `forced`: `--model-draft --draft-min 3`, drafting every step.

Two texts: `sampled` (a chat at temperature 0.8: random weights agree on nothing, so the
draft is right by chance only, and `shipped` must stay level with `off`) and `forced`
(`logit_bias` +100 on one token, which both models then predict: every draft is right,
the decode gain speculation can make on this machine). Prints decode tokens/s (after the
first token), the ratios to `off`, and the share of the draft model's tokens kept.

    .venv/bin/python scripts/bench/bench_draft_model.py --rounds 3 [--tokens 64]
        [--target qwen2.5-3b --draft qwen2.5-0.5b]

Traffic goes to 127.0.0.1 only. The models are written into --work (default: a cache
directory) once: about 1.3 GB and a few minutes.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path
from typing import Any

import httpx

from edge_testkit.bench.servers import EdgeServer
from edge_testkit.models.make_bench_model import make

FORCED_TOKEN = 1000  # any ordinary token: +100 makes both models pick it every time


def models(work: Path, shapes: tuple[str, str]) -> tuple[Path, Path]:
    work.mkdir(parents=True, exist_ok=True)
    paths = []
    for shape in shapes:
        path = work / f"{shape}-q4_k_m.gguf"
        if not path.is_file():
            print(f"writing {path.name} ...", flush=True)
            make(shape, path, "Q4_K_M")
        paths.append(path)
    return paths[0], paths[1]


def timed(url: str, text: str, tokens: int) -> tuple[float, dict[str, Any]]:
    """Decode tokens/s after the first token, and the model's counts after it."""
    body: dict[str, Any] = {
        "model": "bench", "messages": [{"role": "user", "content": "Tell me a story."}],
        "max_tokens": tokens, "ignore_eos": True, "stream": True, "seed": 7,
        "temperature": 0.8 if text == "sampled" else 0}
    if text == "forced":
        body["logit_bias"] = {str(FORCED_TOKEN): 100}
    first, count = None, 0
    with httpx.stream("POST", f"{url}/v1/chat/completions", json=body, timeout=1800) as r:
        if r.status_code != 200:
            raise SystemExit(f"{r.status_code}: {r.read().decode()}")
        for line in r.iter_lines():
            if line.startswith("data: {") and json.loads(line[6:]).get("choices"):
                count += 1
                first = first or time.perf_counter()
    rate = max(count - 2, 0) / max(time.perf_counter() - (first or 0), 1e-9)
    health = httpx.get(f"{url}/health", timeout=30).json()["models"]
    return rate, next(iter(health.values()))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--target", default="qwen2.5-1.5b", help="a make_bench_model shape")
    parser.add_argument("--draft", default="qwen2.5-0.5b", help="one of the same vocabulary")
    parser.add_argument("--work", type=Path,
                        default=Path.home() / ".cache" / "edge-server" / "bench-models")
    args = parser.parse_args()
    target, draft = models(args.work, (args.target, args.draft))
    setups = {"off": ["--draft-max", "0"], "shipped": ["--model-draft", str(draft)],
              "forced": ["--model-draft", str(draft), "--draft-min", "3"]}
    servers = {name: EdgeServer(target, args.threads, ["--parallel", "1", *extra])
               for name, extra in setups.items()}
    try:
        for text in ("sampled", "forced"):
            rates: dict[str, list[float]] = {name: [] for name in setups}
            kept: dict[str, list[float]] = {name: [] for name in setups}
            for r in range(args.rounds):
                order = list(setups) if r % 2 == 0 else list(reversed(setups))
                for name in order:
                    before = timed(servers[name].url, text, 1)[1]
                    rate, after = timed(servers[name].url, text, args.tokens)
                    rates[name].append(rate)
                    drafted = after.get("draft_model_tokens", 0) - before.get(
                        "draft_model_tokens", 0)
                    accepted = after.get("draft_model_tokens_accepted", 0) - before.get(
                        "draft_model_tokens_accepted", 0)
                    kept[name].append(accepted / drafted if drafted else float("nan"))
            off = statistics.median(rates["off"])
            for name in setups:
                median = statistics.median(rates[name])
                share = [k for k in kept[name] if k == k]
                print(f"{text:8} {name:8} {median:7.2f} tok/s  {median / off:5.2f}x off  "
                      f"draft tokens kept: "
                      f"{f'{statistics.median(share):.0%}' if share else '-'}  (rounds: "
                      f"{', '.join(f'{x:.2f}' for x in rates[name])})", flush=True)
    finally:
        for server in servers.values():
            server.close()


if __name__ == "__main__":
    main()
