#!/usr/bin/env python3
"""Benchmarks that print figures (not timed tests): compare ratios measured side by side.

  python scripts/bench/bench.py single   # single-stream decode: served over HTTP vs raw llama.cpp
  python scripts/bench/bench.py json     # JSON-schema-constrained decode vs free, same prompt
  python scripts/bench/bench.py load     # 1/4/8 streams: edge_server vs llama_cpp.server,
                                         # and raw batched decode of 8 sequences in-process
  python scripts/bench/bench.py prefix   # the same 1,000-token system prompt twice: both TTFTs
  python scripts/bench/bench.py code-edit  # a ~300-token code block asked back with one change,
                                           # temperature 0 (drafting: --peer-edge "--draft-max 0")

Raw decode runs in this process on llama.cpp's low-level API (same model file, same
thread count) while the server sits idle, then the server decodes the same number of
tokens for one streaming client. Rounds alternate so machine noise hits both sides.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import tempfile
import time
from pathlib import Path

import httpx
from bench_code_edit import mode_code_edit
from bench_compare import MODES, compare

from edge_testkit.bench.servers import LLAMA_SERVER_DEFAULT, EdgeServer, repack_flag, resolve_model

PROMPT = "Write a long list of people, with their name, age and city, as JSON."


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

    from edge_server.engine.backend.batch import DecodeBatch
    from edge_server.engine.backend.llama_model import ContextSettings, LlamaModel

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


def bench_single(args: argparse.Namespace) -> None:
    path, model_id = resolve_model(args.model or "smollm2", args.workdir), "bench"
    server = EdgeServer(path, args.threads, ["--parallel", "1"])
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
    path, model_id = resolve_model(args.model or "smollm2", args.workdir), "bench"
    server = EdgeServer(path, args.threads, ["--parallel", "1"])
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


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    compared = {**MODES, "code-edit": mode_code_edit}
    parser.add_argument("mode", choices=["single", "json", *compared], nargs="?",
                        default="single")
    parser.add_argument("--model", default=None,
                        help="smollm2 (default), gemma3, or a GGUF file")
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--tokens", type=int, default=None,
                        help="tokens per request (default: 256 single/json, 128 load)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--clients", default="1,4,8", help="load: concurrency levels")
    parser.add_argument("--long-tokens", default="2000,8000",
                        help="long-prompt: prompt sizes in tokens")
    parser.add_argument("--bursts", type=int, default=3,
                        help="load: bursts of requests a round, one after another")
    parser.add_argument("--sampling", choices=["both", "defaults", "shared"], default="both",
                        help="load: each server's defaults (temperature only), one shared "
                             "sampler (top_k 40, top_p 0.95, min_p 0.05), or both tables")
    parser.add_argument("--edit-tokens", type=int, default=330,
                        help="code-edit: tokens of each answer (about the code block's)")
    parser.add_argument("--parallel", type=int, default=8, help="slots of both servers")
    parser.add_argument("--ctx-size", type=int, default=16384, help="KV cells of both servers")
    parser.add_argument("--system-words", type=int, default=600,
                        help="shared-prefix/restart: words of the system prompt (~1,000 tokens)")
    parser.add_argument("--repeat-words", type=int, default=330,
                        help="repeat: words of each prompt (~560 tokens)")
    parser.add_argument("--answer-tokens", type=int, default=16)
    parser.add_argument("--llama-server", type=Path, default=LLAMA_SERVER_DEFAULT)
    parser.add_argument("--edge-args", default="",
                        help='more edge_server options, e.g. "--draft-max 0"')
    parser.add_argument("--peer-args", default="",
                        help='more llama-server options, e.g. "--spec-type ngram-simple"')
    parser.add_argument("--peer-edge", default=None, metavar="ARGS",
                        help='compare against a second edge_server with these options, e.g. '
                             '"--draft-max 0", instead of llama-server')
    parser.add_argument("--peer-root", type=Path, default=None, metavar="CHECKOUT",
                        help="the second edge_server runs from this checkout (another "
                             "commit's code; implies --peer-edge)")
    parser.add_argument("--own-defaults", action="store_true",
                        help="no shared --parallel / --ctx-size: each server's defaults (on "
                             "smollm2, each its default file too: edge_server the one "
                             "--default-model-quant auto picks, llama-server the packaged "
                             "Q4_1)")
    parser.add_argument("--peer-env", action="append", default=[], metavar="NAME=VALUE",
                        help="an environment variable of the second edge_server (repeatable; "
                             "without --peer-edge, that server has the same options)")
    args = parser.parse_args()
    if (args.peer_env or args.peer_root) and args.peer_edge is None:
        args.peer_edge = ""
    if any("=" not in item for item in args.peer_env):
        parser.error("--peer-env takes NAME=VALUE")
    peer_env = dict(item.split("=", 1) for item in args.peer_env)
    args.tokens = args.tokens or (128 if args.mode == "load" else 256)
    with tempfile.TemporaryDirectory() as tmp:
        args.workdir = Path(tmp)
        if args.mode in compared:
            model = resolve_model(args.model or "smollm2", args.workdir)
            shared = [] if args.own_defaults else [
                "--parallel", str(args.parallel), "--ctx-size", str(args.ctx_size)]
            peer = [*([] if args.own_defaults else [
                "-np", str(args.parallel), "-c", str(args.ctx_size)]), *repack_flag()]
            edge_model = model
            if args.own_defaults and (args.model or "smollm2") == "smollm2":
                from edge_server.catalogue.default_conversion import served_default_model_path

                edge_model = served_default_model_path()
            compare(args, model, [*shared, *shlex.split(args.edge_args)],
                    [*peer, *shlex.split(args.peer_args)],
                    None if args.peer_edge is None else shlex.split(args.peer_edge), peer_env,
                    compared[args.mode], edge_model=edge_model)
        else:
            {"single": bench_single, "json": bench_json}[args.mode](args)


if __name__ == "__main__":
    main()
