#!/usr/bin/env python3
"""KV cache types side by side (prints figures; not a timed test): for each of f16, q8_0
and q4_0 (keys and values alike) on one model,

- KV MB per 1,000 tokens: the size llama.cpp gives for the state of one sequence holding
  1,000 tokens (llama_state_seq_get_size), in this process;
- tokens/s of 1 and of 8 concurrent streams (64 tokens each, ignore_eos), relative to f16,
  through a server started with that type;
- the mean log-probability of a fixed 2,000-token text (the vendored DOMPurify license,
  scored with echo logprobs), and its change against f16.

    python scripts/bench/bench_kv_types.py [--model smollm2|gemma3|PATH] [--threads N]

A quantized V cache runs with flash attention (llama.cpp needs it); f16 runs as the
server's default (--flash-attn auto), so the f16 row is what a user gets without flags.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import tempfile
import time
from pathlib import Path

import httpx

from edge_testkit.bench.servers import ROOT, EdgeServer, resolve_model

TYPES = ("f16", "q8_0", "q4_0")
TEXT_TOKENS = 2000


def kv_mb_per_1000(model_path: Path, cache_type: str) -> float:
    """The serialized KV state of one sequence holding 1,000 tokens, in MB."""
    from edge_server.engine.backend.batch import DecodeBatch
    from edge_server.engine.backend.llama_model import ContextSettings, LlamaModel

    model = LlamaModel(model_path, ContextSettings(
        n_ctx=2048, n_seq_max=1, cache_type_k=cache_type, cache_type_v=cache_type))
    try:
        tokens = [t % model.vocab.n_tokens for t in range(1000, 2000)]
        batch = DecodeBatch(model.n_batch)
        for start in range(0, len(tokens), model.n_batch):
            batch.clear()
            batch.add_span(tokens[start:start + model.n_batch], start, 0, logits_last=True)
            if batch.decode(model.ctx) != 0:
                raise RuntimeError("llama_decode failed")
        return len(model.seq_state(0)) / 1e6
    finally:
        model.close()


# A pinned file that no commit of this project edits (the vendored DOMPurify's Apache
# license): the same text in every run and on every checkout.
FIXED_TEXT = ROOT / "edge_server/api/webui/static/vendor/dompurify.LICENSE"


def fixed_text(url: str) -> list[int]:
    """The first TEXT_TOKENS tokens of FIXED_TEXT, as token ids."""
    text = FIXED_TEXT.read_text(encoding="utf-8")  # about 2,200 tokens: within a request
    r = httpx.post(f"{url}/tokenize", json={"model": "bench", "content": text,
                                            "add_special": True}, timeout=60)
    r.raise_for_status()
    tokens: list[int] = r.json()["tokens"]
    if len(tokens) < TEXT_TOKENS:
        raise SystemExit(f"the fixed text is only {len(tokens)} tokens")
    return tokens[:TEXT_TOKENS]


def mean_logprob(url: str, tokens: list[int]) -> float:
    r = httpx.post(f"{url}/v1/completions", timeout=1800, json={
        "model": "bench", "prompt": tokens, "max_tokens": 1, "echo": True, "logprobs": 0,
        "temperature": 0})
    r.raise_for_status()
    scores = r.json()["choices"][0]["logprobs"]["token_logprobs"][1:len(tokens)]
    return sum(scores) / len(scores)


async def tokens_per_second(url: str, clients: int, n_tokens: int = 64) -> float:
    async def one(client: httpx.AsyncClient, k: int) -> int:
        r = await client.post(f"{url}/v1/completions", json={
            "model": "bench", "prompt": f"Story {k}: Once upon a time", "max_tokens": n_tokens,
            "ignore_eos": True, "temperature": 0})
        return int(r.json()["usage"]["completion_tokens"])

    async with httpx.AsyncClient(timeout=1800) as client:
        await one(client, -1)  # warm up
        start = time.perf_counter()
        counts = await asyncio.gather(*(one(client, k) for k in range(clients)))
        return sum(counts) / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--types", default=",".join(TYPES),
                        help="comma-separated KV types; the table is relative to the first")
    args = parser.parse_args()
    types = [t.strip() for t in args.types.split(",") if t.strip()]
    with tempfile.TemporaryDirectory() as tmp:
        model = resolve_model(args.model, Path(tmp))
        rows = {}
        for cache_type in types:
            mb = kv_mb_per_1000(model, cache_type)
            server = EdgeServer(model, args.threads, [
                "--cache-type-k", cache_type, "--cache-type-v", cache_type, "--parallel", "8",
                "--ctx-size", str(8 * 2304), "--prompt-cache-mb", "0", "--draft-max", "0"],
                env={"XDG_DATA_HOME": tmp})
            try:
                tokens = fixed_text(server.url)
                rows[cache_type] = {
                    "kv_mb_per_1000": mb, "logprob": mean_logprob(server.url, tokens),
                    "tps1": asyncio.run(tokens_per_second(server.url, 1)),
                    "tps8": asyncio.run(tokens_per_second(server.url, 8)),
                    "text_tokens": len(tokens)}
            finally:
                server.close()
            print(cache_type, json.dumps(rows[cache_type]), flush=True)
    base = rows[types[0]]
    print(f"\nmodel {model.name}, {args.threads} threads; text: {base['text_tokens']} tokens")
    print(f"| type | KV MB / 1,000 tokens | tok/s 1 client (vs {types[0]}) | tok/s 8 clients "
          f"(vs {types[0]}) "
          f"| mean logprob (change vs {types[0]}) |")
    print("|---|---|---|---|---|")
    for name, row in rows.items():
        print(f"| {name} | {row['kv_mb_per_1000']:.2f} | {row['tps1']:.1f} "
              f"({row['tps1'] / base['tps1']:.2f}x) | {row['tps8']:.1f} "
              f"({row['tps8'] / base['tps8']:.2f}x) | {row['logprob']:.4f} "
              f"({row['logprob'] - base['logprob']:+.4f}) |")


if __name__ == "__main__":
    main()
