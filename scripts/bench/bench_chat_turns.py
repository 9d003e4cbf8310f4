"""Time to first token of a chat's second turn against its first, on each kind of model
memory: prints, per model, the turns' prompt tokens, the second turn's cached tokens and
both times (streamed, the first content chunk), medians of --rounds conversations.

Models: tiny random-weight GGUFs of each architecture of make_test_arch_model.py (the
default; they answer nonsense, and their small width makes the figures mostly the
server's own work), or `--model PATH` for a real one. A figure, not a test."""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx

from edge_testkit.bench.common import start_edge_server

# Run as a script: its folder is on the path, with the scripts it uses.
from edge_testkit.models import llama_sources, make_test_arch_model

_WORDS = ("river", "stone", "lamp", "quiet", "orange", "market", "window", "seven", "travel",
          "garden", "letter", "north", "silver", "paper", "engine", "basket", "winter")


def words(n: int, rng: random.Random) -> str:
    return " ".join(rng.choice(_WORDS) for _ in range(n))


def streamed_turn(base: str, messages: list[dict[str, str]], max_tokens: int
                  ) -> tuple[float, str, dict[str, int]]:
    """(seconds to the first content chunk, the answer, usage)."""
    start, first, text, usage = time.perf_counter(), 0.0, [], {}
    with httpx.stream("POST", f"{base}/v1/chat/completions", timeout=600, json={
            "messages": messages, "max_tokens": max_tokens, "temperature": 0,
            "stream": True, "stream_options": {"include_usage": True}}) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if not line.startswith("data: {"):
                continue
            event = json.loads(line[6:])
            if event.get("usage"):
                usage = event["usage"]
            for choice in event.get("choices", []):
                piece = choice.get("delta", {}).get("content")
                if piece:
                    first = first or time.perf_counter() - start
                    text.append(piece)
    return first, "".join(text), usage


def conversation(base: str, rng: random.Random, first_words: int,
                 max_tokens: int) -> tuple[float, float, int, int, int]:
    # The long text in the first user message: some templates (Phi-3's) drop a system one.
    messages = [{"role": "user", "content": words(first_words, rng)}]
    ttft1, answer, usage1 = streamed_turn(base, messages, max_tokens)
    messages += [{"role": "assistant", "content": answer},
                 {"role": "user", "content": words(20, rng)}]
    ttft2, _, usage2 = streamed_turn(base, messages, max_tokens)
    cached = usage2.get("prompt_tokens_details", {}).get("cached_tokens", 0)
    return ttft1, ttft2, usage1["prompt_tokens"], usage2["prompt_tokens"], cached


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--arch", nargs="*", default=sorted(make_test_arch_model.ARCHS))
    parser.add_argument("--model", type=Path, help="a GGUF to time instead of the tiny ones")
    parser.add_argument("--vocab", default="phi-3", help="models/ggml-vocab-<vocab>.gguf")
    parser.add_argument("--first-words", type=int, default=1500)
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp_dir:
        tmp = Path(tmp_dir)
        if args.model is not None:
            models = {args.model.stem: args.model}
        else:
            vocab = llama_sources.vendor_dir() / "models" / f"ggml-vocab-{args.vocab}.gguf"
            # Not named as the architecture alone: `gemma3` is a registry name.
            models = {arch: make_test_arch_model.write_model(arch, vocab,
                                                             tmp / f"tiny-{arch}.gguf")
                      for arch in args.arch}
        print("model | kind | turn 1 / turn 2 prompt tokens | cached | "
              "TTFT turn 1 ms | turn 2 ms | turn 2 / turn 1")
        for name, path in models.items():
            env = {**os.environ, "XDG_DATA_HOME": str(tmp / f"data-{name}")}
            log = tmp / f"{name}.log"
            try:
                proc, base = start_edge_server(["--model", str(path)], env=env, log=log)
            except RuntimeError:
                print(log.read_text()[-3000:], file=sys.stderr)
                raise
            try:
                kind = httpx.get(f"{base}/props", timeout=30).json()["memory"]["kind"]
                runs = [conversation(base, random.Random(r), args.first_words,
                                     args.max_tokens) for r in range(args.rounds)]
            finally:
                proc.terminate()
                proc.wait(60)
            t1 = statistics.median(r[0] for r in runs) * 1e3
            t2 = statistics.median(r[1] for r in runs) * 1e3
            _, _, p1, p2, cached = runs[-1]
            print(f"{name} | {kind} | {p1} / {p2} | {cached} | {t1:.0f} | {t2:.0f} | "
                  f"{t2 / t1:.2f}", flush=True)


if __name__ == "__main__":
    main()
