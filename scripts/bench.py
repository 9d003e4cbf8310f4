#!/usr/bin/env python3
"""Benchmarks that print figures (not timed tests): compare ratios measured side by side.

  python scripts/bench.py single   # single-stream decode: served over HTTP vs raw llama.cpp
  python scripts/bench.py json     # JSON-schema-constrained decode vs unconstrained, same prompt

Raw decode runs in this process on llama.cpp's low-level API (same model file, same
thread count) while the server sits idle, then the server decodes the same number of
tokens for one streaming client. Rounds alternate so machine noise hits both sides.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

PROMPT = "Write a long list of people, with their name, age and city, as JSON."


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Server:
    def __init__(self, model: Path | None, threads: int, extra: list[str]) -> None:
        self.port = free_port()
        cmd = [
            sys.executable,
            "-m",
            "edge_server",
            "serve",
            "--port",
            str(self.port),
            "--threads",
            str(threads),
            "--log-level",
            "warning",
            *extra,
        ]
        if model is not None:
            cmd += ["--model", str(model)]
        self.proc = subprocess.Popen(cmd, cwd=ROOT)
        self.url = f"http://127.0.0.1:{self.port}"
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"{self.url}/health", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                time.sleep(0.3)
        raise RuntimeError("server did not become healthy")

    def close(self) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=30)


def stream_decode_rate(url: str, model: str, n_tokens: int, extra: dict | None = None) -> float:
    """Tokens/s between the first and the last streamed token of one request."""
    body = {
        "model": model,
        "prompt": PROMPT,
        "max_tokens": n_tokens,
        "temperature": 0,
        "ignore_eos": True,
        "stream": True,
        **(extra or {}),
    }
    stamps: list[float] = []
    with httpx.stream("POST", f"{url}/v1/completions", json=body, timeout=300) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if line.startswith("data: {") and json.loads(line[6:])["choices"][0]["text"]:
                stamps.append(time.perf_counter())
    if len(stamps) < 2:
        raise RuntimeError("too few streamed tokens to time")
    return (len(stamps) - 1) / (stamps[-1] - stamps[0])


def raw_decode_rate(model_path: Path, threads: int, n_tokens: int) -> float:
    """llama.cpp's own decode speed: one sequence, greedy, sampling in C, no server."""
    import llama_cpp as lc

    from edge_server.engine.batch import DecodeBatch
    from edge_server.engine.llama_model import ContextSettings, LlamaModel

    model = LlamaModel(model_path, ContextSettings(n_ctx=2048, n_threads=threads, n_seq_max=1))
    try:
        tokens = model.vocab.tokenize(PROMPT, add_special=True, parse_special=True)
        batch = DecodeBatch(model.n_batch)
        chain = lc.llama_sampler_chain_init(lc.llama_sampler_chain_default_params())
        bias = (lc.llama_logit_bias * len(model.vocab.eog_tokens))()
        for i, t in enumerate(model.vocab.eog_tokens):
            bias[i].token, bias[i].bias = t, float("-inf")
        lc.llama_sampler_chain_add(
            chain, lc.llama_sampler_init_logit_bias(model.vocab.n_tokens, len(bias), bias)
        )
        lc.llama_sampler_chain_add(chain, lc.llama_sampler_init_greedy())
        row = batch.add_span(tokens, 0, 0, logits_last=True)
        assert batch.decode(model.ctx) == 0
        token = lc.llama_sampler_sample(chain, model.ctx, row)
        pos = len(tokens)
        start = time.perf_counter()
        for _ in range(n_tokens - 1):
            batch.clear()
            row = batch.add(token, pos, 0, logits=True)
            assert batch.decode(model.ctx) == 0
            token = lc.llama_sampler_sample(chain, model.ctx, row)
            pos += 1
        elapsed = time.perf_counter() - start
        lc.llama_sampler_free(chain)
        return (n_tokens - 1) / elapsed
    finally:
        model.close()


def resolve_model(arg: str | None) -> tuple[Path, str]:
    from edge_server.default_model import DEFAULT_MODEL_ID, default_model_path

    if arg is None:
        return default_model_path(), DEFAULT_MODEL_ID
    path = Path(arg)
    return path, path.name.removesuffix(".gguf")


def bench_single(args: argparse.Namespace) -> None:
    path, model_id = resolve_model(args.model)
    server = Server(None if args.model is None else path, args.threads, ["--parallel", "1"])
    try:
        stream_decode_rate(server.url, model_id, 16)  # warm-up
        raw, served = [], []
        for _ in range(args.rounds):
            raw.append(raw_decode_rate(path, args.threads, args.tokens))
            served.append(stream_decode_rate(server.url, model_id, args.tokens))
    finally:
        server.close()
    r, s = statistics.median(raw), statistics.median(served)
    print(
        f"model: {path.name}  threads: {args.threads}  tokens: {args.tokens}  rounds: {args.rounds}"
    )
    print(
        f"raw llama.cpp decode     : {r:7.1f} tokens/s  (rounds: "
        + ", ".join(f"{x:.1f}" for x in raw)
        + ")"
    )
    print(
        f"edge_server HTTP stream  : {s:7.1f} tokens/s  (rounds: "
        + ", ".join(f"{x:.1f}" for x in served)
        + ")"
    )
    print(f"ratio served / raw       : {s / r:7.3f}")


PEOPLE_SCHEMA = {
    "type": "array",
    "minItems": 40,
    "maxItems": 60,
    "items": {
        "type": "object",
        "properties": {
            "name": {"type": "string", "maxLength": 24},
            "age": {"type": "integer", "minimum": 0, "maximum": 120},
            "city": {"type": "string", "maxLength": 24},
            "member": {"type": "boolean"},
        },
        "required": ["name", "age", "city", "member"],
    },
}


def bench_json(args: argparse.Namespace) -> None:
    path, model_id = resolve_model(args.model)
    server = Server(None if args.model is None else path, args.threads, ["--parallel", "1"])
    schema_format = {"response_format": {"type": "json_schema",
                                         "json_schema": {"name": "people",
                                                         "schema": PEOPLE_SCHEMA}}}
    try:
        stream_decode_rate(server.url, model_id, 16)  # warm-up
        free, constrained = [], []
        for _ in range(args.rounds):
            free.append(stream_decode_rate(server.url, model_id, args.tokens))
            constrained.append(
                stream_decode_rate(server.url, model_id, args.tokens, schema_format))
    finally:
        server.close()
    f, c = statistics.median(free), statistics.median(constrained)
    print(f"model: {path.name}  threads: {args.threads}  tokens: {args.tokens}  "
          f"rounds: {args.rounds}")
    print(f"unconstrained decode     : {f:7.1f} tokens/s  (rounds: "
          + ", ".join(f"{x:.1f}" for x in free) + ")")
    print(f"JSON-schema constrained  : {c:7.1f} tokens/s  (rounds: "
          + ", ".join(f"{x:.1f}" for x in constrained) + ")")
    print(f"ratio constrained / free : {c / f:7.3f}")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("mode", choices=["single", "json"], nargs="?", default="single")
    parser.add_argument("--model", default=None, help="GGUF file (default: embedded model)")
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--tokens", type=int, default=256)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    {"single": bench_single, "json": bench_json}[args.mode](args)


if __name__ == "__main__":
    main()
