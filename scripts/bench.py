#!/usr/bin/env python3
"""Benchmarks that print figures (not timed tests): compare ratios measured side by side.

  python scripts/bench.py single   # single-stream decode: served over HTTP vs raw llama.cpp
  python scripts/bench.py json     # JSON-schema-constrained decode vs unconstrained, same prompt
  python scripts/bench.py load     # 1/4/8 concurrent streams: edge_server vs llama_cpp.server,
                                   # and raw batched decode of 8 sequences in-process
  python scripts/bench.py prefix   # the same 1,000-token system prompt twice: both TTFTs

Raw decode runs in this process on llama.cpp's low-level API (same model file, same
thread count) while the server sits idle, then the server decodes the same number of
tokens for one streaming client. Rounds alternate so machine noise hits both sides.
"""

from __future__ import annotations

import argparse
import json
import math
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


class _ServerProcess:
    """A server subprocess on a free loopback port, ready once `ready_path` answers 200."""

    def __init__(self, cmd: list[str], ready_path: str, quiet: bool = False) -> None:
        self.port = free_port()
        out = subprocess.DEVNULL if quiet else None
        self.proc = subprocess.Popen(
            [*cmd, "--port", str(self.port)], cwd=ROOT, stdout=out, stderr=out
        )
        self.url = f"http://127.0.0.1:{self.port}"
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"{self.url}{ready_path}", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                time.sleep(0.3)
        self.close()
        raise RuntimeError(f"{cmd[2]} did not become ready")

    def close(self) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=30)


class Server(_ServerProcess):
    """edge_server itself."""

    def __init__(self, model: Path | None, threads: int, extra: list[str]) -> None:
        cmd = [
            sys.executable,
            "-m",
            "edge_server",
            "serve",
            "--threads",
            str(threads),
            "--log-level",
            "warning",
            *extra,
        ]
        if model is not None:
            cmd += ["--model", str(model)]
        super().__init__(cmd, "/health")


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
    _report_pair(
        path,
        args,
        ("raw llama.cpp decode", raw),
        ("edge_server HTTP stream", served),
        "served / raw",
    )


def _report_pair(
    path: Path,
    args: argparse.Namespace,
    base: tuple[str, list[float]],
    other: tuple[str, list[float]],
    ratio_label: str,
) -> None:
    """Medians of two series measured in alternating rounds, and their ratio."""
    print(
        f"model: {path.name}  threads: {args.threads}  tokens: {args.tokens}  rounds: {args.rounds}"
    )
    for label, series in (base, other):
        rounds = ", ".join(f"{x:.1f}" for x in series)
        print(f"{label:25}: {statistics.median(series):7.1f} tokens/s  (rounds: {rounds})")
    ratio = statistics.median(other[1]) / statistics.median(base[1])
    print(f"{'ratio ' + ratio_label:25}: {ratio:7.3f}")


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
    schema_format = {
        "response_format": {
            "type": "json_schema",
            "json_schema": {"name": "people", "schema": PEOPLE_SCHEMA},
        }
    }
    try:
        stream_decode_rate(server.url, model_id, 16)  # warm-up
        free, constrained = [], []
        for _ in range(args.rounds):
            free.append(stream_decode_rate(server.url, model_id, args.tokens))
            constrained.append(stream_decode_rate(server.url, model_id, args.tokens, schema_format))
    finally:
        server.close()
    _report_pair(
        path,
        args,
        ("unconstrained decode", free),
        ("JSON-schema constrained", constrained),
        "constrained / free",
    )


class LlamaCppServer(_ServerProcess):
    """llama-cpp-python's own server, same model and threads, requests not interrupted."""

    def __init__(self, model: Path, threads: int) -> None:
        super().__init__(
            [
                sys.executable,
                "-m",
                "llama_cpp.server",
                "--model",
                str(model),
                "--n_threads",
                str(threads),
                "--n_threads_batch",
                str(threads),
                "--n_ctx",
                "4096",
                "--interrupt_requests",
                "False",
                "--verbose",
                "False",
            ],
            "/v1/models",
            quiet=True,
        )


async def _one_stream(client, url: str, body: dict) -> tuple[float, int]:  # type: ignore[no-untyped-def]
    """(time to first token, tokens received) of one streaming completion."""
    start = time.perf_counter()
    first = None
    tokens = 0
    async with client.stream("POST", f"{url}/v1/completions", json=body) as r:
        r.raise_for_status()
        async for line in r.aiter_lines():
            if line.startswith("data: {"):
                choices = json.loads(line[6:]).get("choices") or []
                if choices and choices[0].get("text") is not None:
                    tokens += 1
                    if first is None and choices[0]["text"]:
                        first = time.perf_counter() - start
    return (first if first is not None else float("nan")), tokens


def run_load(url: str, model: str, clients: int, n_tokens: int, eog: list[int]) -> dict:
    import asyncio

    body = {
        "model": model,
        "prompt": PROMPT,
        "max_tokens": n_tokens,
        "temperature": 0.8,
        "stream": True,
        "logit_bias": {str(t): -100 for t in eog},
    }

    async def main() -> tuple[float, list[tuple[float, int]]]:
        limits = httpx.Limits(max_connections=clients + 4)
        async with httpx.AsyncClient(timeout=600, limits=limits) as client:
            start = time.perf_counter()
            results = await asyncio.gather(
                *(_one_stream(client, url, {**body, "seed": i}) for i in range(clients))
            )
            return time.perf_counter() - start, results

    wall, results = asyncio.run(main())
    ttfts = sorted(r[0] for r in results)
    tokens = sum(r[1] for r in results)
    return {
        "tokens_per_s": tokens / wall,
        "tokens": tokens,
        "ttft_p50": statistics.median(ttfts),
        "ttft_p95": ttfts[min(len(ttfts) - 1, math.ceil(0.95 * len(ttfts)) - 1)],
    }


def raw_batched_rate(model_path: Path, threads: int, n_seqs: int, n_tokens: int) -> float:
    """llama.cpp decoding n_seqs sequences together in-process: the ceiling for serving."""
    import llama_cpp as lc

    from edge_server.engine.batch import DecodeBatch
    from edge_server.engine.llama_model import ContextSettings, LlamaModel
    from edge_server.engine.sampling import SamplerChain, SamplingParams

    model = LlamaModel(model_path, ContextSettings(n_ctx=4096, n_threads=threads, n_seq_max=n_seqs))
    try:
        prompt = model.vocab.tokenize(PROMPT, add_special=True, parse_special=True)
        batch = DecodeBatch(model.n_batch)
        params = SamplingParams(temperature=0.8, ignore_eos=True)
        chains = [
            SamplerChain(params, model.vocab, n_ctx=model.n_ctx, seed=i) for i in range(n_seqs)
        ]
        rows = [batch.add_span(prompt, 0, s, logits_last=True) for s in range(n_seqs)]
        assert batch.decode(model.ctx) == 0
        tokens = [chains[s].sample(model.ctx, rows[s]) for s in range(n_seqs)]
        pos = len(prompt)
        start = time.perf_counter()
        for _ in range(n_tokens - 1):
            batch.clear()
            rows = [batch.add(tokens[s], pos, s, logits=True) for s in range(n_seqs)]
            assert batch.decode(model.ctx) == 0
            tokens = [chains[s].sample(model.ctx, rows[s]) for s in range(n_seqs)]
            pos += 1
        elapsed = time.perf_counter() - start
        for chain in chains:
            chain.close()
        del lc
        return n_seqs * (n_tokens - 1) / elapsed
    finally:
        model.close()


def bench_load(args: argparse.Namespace) -> None:
    path, model_id = resolve_model(args.model)
    levels = [int(x) for x in args.clients.split(",")]
    eog = _eog_tokens(path)
    table: dict[str, dict[int, dict]] = {"edge_server": {}, "llama_cpp.server": {}}
    server = Server(
        None if args.model is None else path, args.threads, ["--parallel", str(max(levels))]
    )
    try:
        run_load(server.url, model_id, 1, 8, eog)  # warm-up
        for n in levels:
            table["edge_server"][n] = run_load(server.url, model_id, n, args.tokens, eog)
    finally:
        server.close()
    peer = LlamaCppServer(path, args.threads)
    try:
        run_load(peer.url, model_id, 1, 8, eog)
        for n in levels:
            table["llama_cpp.server"][n] = run_load(peer.url, model_id, n, args.tokens, eog)
    finally:
        peer.close()
    raw = raw_batched_rate(path, args.threads, max(levels), args.tokens)

    print(f"model: {path.name}  threads: {args.threads}  tokens per client: {args.tokens}")
    print(
        f"{'server':18} {'clients':>7} {'tokens/s':>9} {'tokens':>7} {'TTFT p50':>9} "
        f"{'TTFT p95':>9}"
    )
    for name, rows in table.items():
        for n, row in rows.items():
            print(
                f"{name:18} {n:7d} {row['tokens_per_s']:9.1f} {row['tokens']:7d} "
                f"{row['ttft_p50']:8.2f}s {row['ttft_p95']:8.2f}s"
            )
    for n in levels:
        ours, theirs = table["edge_server"][n], table["llama_cpp.server"][n]
        print(
            f"ratio edge_server / llama_cpp.server at {n} clients: "
            f"{ours['tokens_per_s'] / theirs['tokens_per_s']:.2f}x"
        )
    top = max(levels)
    served = table["edge_server"][top]["tokens_per_s"]
    print(f"raw batched decode, {top} sequences in-process: {raw:.1f} tokens/s")
    print(f"ratio served / raw batched at {top}: {served / raw:.3f}")


def _eog_tokens(path: Path) -> list[int]:
    from edge_server.engine.llama_model import ContextSettings, LlamaModel

    model = LlamaModel(path, ContextSettings(n_ctx=256, n_seq_max=1))
    try:
        return list(model.vocab.eog_tokens)
    finally:
        model.close()


def bench_prefix(args: argparse.Namespace) -> None:
    path, model_id = resolve_model(args.model)
    server = Server(None if args.model is None else path, args.threads, ["--parallel", "4"])
    rule = (
        "You are a careful assistant for a hardware store. Answer briefly, cite the "
        "aisle number when you can, and never invent prices. "
    )
    try:
        tokens = httpx.post(
            f"{server.url}/tokenize", json={"model": model_id, "content": rule}
        ).json()["tokens"]
        system = rule * max(1, round(1000 / len(tokens)))
        n_system = len(
            httpx.post(
                f"{server.url}/tokenize", json={"model": model_id, "content": system}
            ).json()["tokens"]
        )
        ttfts = []
        cached = []
        for question in ("Where are the hammers?", "Do you sell paint rollers?"):
            body = {
                "model": model_id,
                "max_tokens": 4,
                "stream": True,
                "stream_options": {"include_usage": True},
                "messages": [
                    {"role": "system", "content": system},
                    {"role": "user", "content": question},
                ],
            }
            start = time.perf_counter()
            first = None
            with httpx.stream(
                "POST", f"{server.url}/v1/chat/completions", json=body, timeout=300
            ) as r:
                for line in r.iter_lines():
                    if not line.startswith("data: {"):
                        continue
                    chunk = json.loads(line[6:])
                    if (
                        first is None
                        and chunk["choices"]
                        and chunk["choices"][0]["delta"].get("content")
                    ):
                        first = time.perf_counter() - start
                    if chunk.get("usage"):
                        cached.append(chunk["usage"]["prompt_tokens_details"]["cached_tokens"])
            ttfts.append(first if first is not None else float("nan"))
    finally:
        server.close()
    print(f"model: {path.name}  threads: {args.threads}  system prompt: {n_system} tokens")
    print(f"first request  TTFT: {ttfts[0]:.3f}s  cached prompt tokens: {cached[0]}")
    print(f"second request TTFT: {ttfts[1]:.3f}s  cached prompt tokens: {cached[1]}")
    print(f"ratio second / first: {ttfts[1] / ttfts[0]:.3f}")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "mode", choices=["single", "json", "load", "prefix"], nargs="?", default="single"
    )
    parser.add_argument("--clients", default="1,4,8", help="load mode: concurrency levels")
    parser.add_argument("--model", default=None, help="GGUF file (default: embedded model)")
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--tokens", type=int, default=256)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    modes = {"single": bench_single, "json": bench_json, "load": bench_load, "prefix": bench_prefix}
    if args.mode == "load" and args.tokens == 256:
        args.tokens = 128  # per client, as the load figures are quoted
    modes[args.mode](args)


if __name__ == "__main__":
    main()
