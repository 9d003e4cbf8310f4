"""edge_server against llama.cpp's llama-server, both up at once, rounds alternating
between them, medians reported with every round's figure and the ratio.

  long-prompt    time to first token of fresh ~2,000- and ~8,000-token prompts
  load           1/4/8 clients streaming 128 tokens each (--bursts a round, one after
                 another): tokens/s and TTFT p50, twice:
                 with each server's defaults (`temperature` alone: edge_server samples
                 the whole vocabulary, llama-server its top 40) and with one explicit
                 sampler for both (top_k 40, top_p 0.95, min_p 0.05)
  shared-prefix  8 cold requests with one new 1,000-token system prompt and distinct
                 questions, against one such request alone: wall times
  repeat         4 distinct ~560-token prompts, then the same 4 again: TTFT of the repeats
  restart        TTFT of a known 1,000-token system prompt after a restart, against cold

Every round uses prompts neither server has seen (a fresh random tag leads each one).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from edge_testkit.bench.common import memory_parts, round_order, rss_mib
from edge_testkit.bench.servers import ROOT, EdgeServer, LlamaServer, ServerProcess

WORDS = [
    "river", "stone", "garden", "window", "letter", "market", "winter", "silver", "forest",
    "harbor", "candle", "mountain", "engine", "pocket", "thunder", "meadow", "lantern",
    "bridge", "orchard", "velvet",
]
# The same sampling on both sides (llama-server's own defaults, spelled out).
SAMPLING = {"temperature": 0.8, "top_k": 40, "top_p": 0.95, "min_p": 0.05}
# What an OpenAI client sends: each server fills the rest with its own defaults.
DEFAULTS = {"temperature": 0.7}
LOAD_KINDS = {"defaults": ("each server's defaults, temperature 0.7 only", DEFAULTS),
              "shared": ("one sampler for both: top_k 40, top_p 0.95, min_p 0.05", SAMPLING)}


def text_of(n_words: int, rng: random.Random) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(n_words))


def fresh_tag() -> str:
    return uuid.uuid4().hex[:12]


def memory_account(server: ServerProcess) -> dict[str, float]:
    """An edge_server's /health memory account in MiB, by part (empty for other servers)."""
    if not isinstance(server, EdgeServer):
        return {}
    return {part: size / 2**20 for part, size in memory_parts(server.url).items()}


@dataclass
class Result:
    ttft: float
    tokens: int
    wall: float
    cached: int | None = None
    prompt_tokens: int | None = None


async def stream_once(client: httpx.AsyncClient, url: str, prompt: str, max_tokens: int,
                      seed: int, sampling: dict, ignore_eos: bool = True) -> Result:
    body = {"model": "bench", "prompt": prompt, "max_tokens": max_tokens, "stream": True,
            "ignore_eos": ignore_eos, "seed": seed, "stream_options": {"include_usage": True},
            **sampling}
    start = time.perf_counter()
    first, chunks, counted, cached, prompt_tokens = None, 0, None, None, None
    async with client.stream("POST", f"{url}/v1/completions", json=body) as r:
        r.raise_for_status()
        async for line in r.aiter_lines():
            if not line.startswith("data: {"):
                continue
            chunk = json.loads(line[6:])
            usage = chunk.get("usage") or {}
            if usage.get("completion_tokens") is not None:
                counted = usage["completion_tokens"]
            if usage.get("prompt_tokens_details"):
                cached = usage["prompt_tokens_details"].get("cached_tokens")
                prompt_tokens = usage.get("prompt_tokens")
            for choice in chunk.get("choices") or []:
                if choice.get("text"):
                    chunks += 1
                    if first is None:
                        first = time.perf_counter() - start
    wall = time.perf_counter() - start
    # Tokens from the usage both servers send: a chunk may carry several tokens (this
    # server sends what a step made at most every stream_interval_ms) or none.
    tokens = counted if counted is not None else chunks
    return Result(first if first is not None else wall, tokens, wall, cached, prompt_tokens)


def burst(url: str, prompts: list[str], max_tokens: int, sampling: dict | None = None,
          ignore_eos: bool = True) -> tuple[float, list[Result]]:
    async def main() -> tuple[float, list[Result]]:
        limits = httpx.Limits(max_connections=len(prompts) + 4)
        async with httpx.AsyncClient(timeout=900, limits=limits) as client:
            start = time.perf_counter()
            results = await asyncio.gather(*(
                stream_once(client, url, p, max_tokens, i, sampling or SAMPLING, ignore_eos)
                for i, p in enumerate(prompts)))
            return time.perf_counter() - start, list(results)
    return asyncio.run(main())


@dataclass
class Series:
    """One figure per round for each server."""

    rounds: dict[str, list[float]] = field(default_factory=dict)

    def add(self, name: str, value: float) -> None:
        self.rounds.setdefault(name, []).append(value)

    def median(self, name: str) -> float:
        return statistics.median(self.rounds[name])

    def line(self, label: str, unit: str, ours: str = "edge_server",
             theirs: str | None = None, higher_is_better: bool = True) -> str:
        theirs = theirs or next(name for name in self.rounds if name != ours)
        out = [f"{label}:"]
        for name in (ours, theirs):
            figures = ", ".join(f"{x:.2f}" for x in self.rounds[name])
            out.append(f"  {name:26} {self.median(name):8.2f} {unit}  (rounds: {figures})")
        ratio = self.median(ours) / self.median(theirs)
        if not higher_is_better:
            ratio = 1 / ratio if ratio else float("inf")
        out.append(f"  edge_server advantage: {ratio:.2f}x")
        return "\n".join(out)


def alternate(rounds: int, servers: list[ServerProcess],
              measure: Callable[[ServerProcess, int], None]) -> None:
    """measure(server, r) for every round r, the servers' order alternating."""
    for r in range(rounds):
        for server in round_order(r, servers):
            measure(server, r)


def mode_load(args: argparse.Namespace, servers: list[ServerProcess]) -> None:
    levels = [int(x) for x in args.clients.split(",")]
    kinds = list(LOAD_KINDS) if args.sampling == "both" else [args.sampling]
    speed = {(k, n): Series() for k in kinds for n in levels}
    ttft = {(k, n): Series() for k in kinds for n in levels}

    def measure(server: ServerProcess, r: int) -> None:
        # Round r gives both servers the same words (what a model writes after them, and
        # so how often lookup drafts are kept, varies with them) behind distinct tags.
        for k, kind in enumerate(kinds):
            for n in levels:
                rng = random.Random(1000 * r + 100 * k + n)
                # Several bursts a round: one 128-token request alone is too short to
                # time, and what a model writes (so how many drafts it keeps) varies.
                walls, results = 0.0, []
                for _ in range(args.bursts):
                    prompts = [f"[{fresh_tag()}] {text_of(40, rng)}" for _ in range(n)]
                    wall, done = burst(server.url, prompts, args.tokens, LOAD_KINDS[kind][1])
                    walls, results = walls + wall, results + done
                speed[kind, n].add(server.name, sum(x.tokens for x in results) / walls)
                ttft[kind, n].add(server.name, statistics.median(x.ttft for x in results))

    idle = {server.name: rss_mib(server.proc.pid) for server in servers}
    idle_parts = {server.name: memory_account(server) for server in servers}
    alternate(args.rounds, servers, measure)
    print("--- memory (VmRSS, MiB): idle before the load / after it ---")
    for server in servers:
        print(f"  {server.name:26} {idle[server.name]:8.0f} / {rss_mib(server.proc.pid):.0f}")
    for server in servers:
        before, after = idle_parts[server.name], memory_account(server)
        if before and after:
            print(f"  {server.name} memory account, idle / after (MiB): " + ", ".join(
                f"{part} {before.get(part, 0):.0f} / {value:.0f}"
                for part, value in after.items()))
    for kind in kinds:
        print(f"--- {LOAD_KINDS[kind][0]} ---")
        for n in levels:
            print(speed[kind, n].line(f"{n} client(s), tokens/s", "tok/s"))
            print(ttft[kind, n].line(f"{n} client(s), TTFT p50", "s", higher_is_better=False))
        print(summary_row(kind, levels, speed, ttft))
    stats = httpx.get(f"{servers[0].url}/health").json()["models"]["bench"]
    print(f"  edge_server lookup drafts: {stats['draft_tokens_accepted']} kept of "
          f"{stats['draft_tokens']} drafted")


def summary_row(kind: str, levels: list[int], speed: dict[tuple[str, int], Series],
                ttft: dict[tuple[str, int], Series]) -> str:
    """One table row: edge_server's advantage at each client count."""
    def ratios(table: dict[tuple[str, int], Series], higher: bool) -> str:
        out = []
        for n in levels:
            series = table[kind, n]
            other = next(name for name in series.rounds if name != "edge_server")
            ours, theirs = series.median("edge_server"), series.median(other)
            out.append(f"{(ours / theirs if higher else theirs / ours):.2f}")
        return " / ".join(out)
    clients = " / ".join(str(n) for n in levels)
    return (f"| {kind}: tokens/s, {clients} clients | {ratios(speed, True)} |\n"
            f"| {kind}: TTFT, {clients} clients | {ratios(ttft, False)} |")


def mode_shared_prefix(args: argparse.Namespace, servers: list[ServerProcess]) -> None:
    walls, alone = Series(), Series()
    rng = random.Random(2)

    def measure(server: ServerProcess, _round: int) -> None:
        system = f"[{fresh_tag()}] System: {text_of(args.system_words, rng)}\n\n"
        questions = [f"User: question {i}: {text_of(12, rng)}?\nAssistant:" for i in range(8)]
        wall, _ = burst(server.url, [system + q for q in questions], args.answer_tokens)
        walls.add(server.name, wall)
        solo_system = f"[{fresh_tag()}] System: {text_of(args.system_words, rng)}\n\n"
        solo, _ = burst(server.url, [solo_system + questions[0]], args.answer_tokens)
        alone.add(server.name, solo)

    alternate(args.rounds, servers, measure)
    print(walls.line("8 cold requests sharing a new system prompt, wall", "s",
                     higher_is_better=False))
    print(alone.line("one such request alone, wall", "s", higher_is_better=False))
    for name in walls.rounds:
        print(f"  {name}: burst / alone = {walls.median(name) / alone.median(name):.2f}")


def mode_repeat(args: argparse.Namespace, servers: list[ServerProcess]) -> None:
    ttft, share = Series(), Series()
    rng = random.Random(3)

    def measure(server: ServerProcess, _round: int) -> None:
        header = "You are a helpful assistant. Answer the question below.\n\n"
        prompts = [f"{header}[{fresh_tag()}] {text_of(args.repeat_words, rng)}" for _ in range(4)]
        for p in prompts:
            burst(server.url, [p], 4)
        again = [burst(server.url, [p], 4)[1][0] for p in prompts]
        ttft.add(server.name, statistics.median(r.ttft for r in again))
        if server.name == "edge_server":
            share.add(server.name, min((r.cached or 0) / (r.prompt_tokens or 1) for r in again))

    alternate(args.rounds, servers, measure)
    print(ttft.line("repeated prompts, TTFT p50", "s", higher_is_better=False))
    if share.rounds:
        figures = ", ".join(f"{x:.3f}" for x in share.rounds["edge_server"])
        print(f"  edge_server: smallest cached share of a repeated prompt: {figures}")


def mode_restart(args: argparse.Namespace, servers: list[ServerProcess]) -> None:
    cold, warm = Series(), Series()
    rng = random.Random(4)
    ours = next(s for s in servers if s.name == "edge_server")
    theirs = [s for s in servers if s is not ours]

    def measure(server: ServerProcess, _round: int) -> None:
        system = f"[{fresh_tag()}] System: {text_of(args.system_words, rng)}\n\n"
        first = burst(server.url, [system + "User: hello?\nAssistant:"], 4)[1][0]
        cold.add(server.name, first.ttft)
        server.restart()
        again = burst(server.url, [system + "User: and again?\nAssistant:"], 4)[1][0]
        warm.add(server.name, again.ttft)

    alternate(args.rounds, [ours, *theirs], measure)
    print(cold.line("known system prompt, cold TTFT", "s", higher_is_better=False))
    print(warm.line("same system prompt after a restart, TTFT", "s", higher_is_better=False))
    for name in cold.rounds:
        print(f"  {name}: after restart / cold = {warm.median(name) / cold.median(name):.3f}")


def mode_long_prompt(args: argparse.Namespace, servers: list[ServerProcess]) -> None:
    """Time to first token of fresh prompts of about 2,000 and 8,000 tokens (one token
    answered), one request at a time: prompt evaluation speed, as a user waits for it."""
    sample = text_of(400, random.Random(7))
    counted = httpx.post(f"{servers[0].url}/tokenize", json={"content": sample}).json()
    per_word = len(counted["tokens"]) / 400
    sizes = [int(x) for x in args.long_tokens.split(",")]
    ttft = {n: Series() for n in sizes}

    def measure(server: ServerProcess, r: int) -> None:
        for n in sizes:
            prompt = f"[{fresh_tag()}] {text_of(int(n / per_word), random.Random(r * 7 + n))}"
            _, done = burst(server.url, [prompt], 1, DEFAULTS)
            ttft[n].add(server.name, done[0].ttft)

    alternate(args.rounds, servers, measure)
    for n in sizes:
        print(ttft[n].line(f"~{n}-token prompt, TTFT", "s", higher_is_better=False))


MODES = {"load": mode_load, "shared-prefix": mode_shared_prefix, "repeat": mode_repeat,
         "restart": mode_restart, "long-prompt": mode_long_prompt}


def compare(args: argparse.Namespace, model_path: Path, edge_extra: list[str],
            peer_extra: list[str], peer_edge: list[str] | None = None,
            peer_env: dict[str, str] | None = None,
            mode: Callable[[argparse.Namespace, list[ServerProcess]], None] | None = None,
            edge_model: Path | None = None) -> None:
    """`peer_edge`: the peer is a second edge_server with these options on top of
    `edge_extra` (edge_server against itself, e.g. with drafting off), not llama-server;
    `peer_env` adds environment variables to that second edge_server; `mode`: the
    workload (default: MODES[args.mode]); `edge_model`: edge_server's file where it is
    not the peer's (each server's default file)."""
    edge_model = edge_model or model_path
    ours = EdgeServer(edge_model, args.threads, edge_extra,
                      env={"XDG_DATA_HOME": str(args.workdir / "edge-data")})
    try:
        if peer_edge is None:
            theirs: ServerProcess = LlamaServer(args.llama_server, model_path, args.threads,
                                                peer_extra)
        else:
            theirs = EdgeServer(edge_model, args.threads, [*edge_extra, *peer_edge],
                                env={"XDG_DATA_HOME": str(args.workdir / "peer-data"),
                                     **(peer_env or {})},
                                root=args.peer_root or ROOT)
            changed = [*peer_edge, *(f"{k}={v}" for k, v in (peer_env or {}).items())]
            if args.peer_root:
                changed.append(f"({args.peer_root.name})")
            theirs.name = f"edge_server {' '.join(changed)}"
    except BaseException:
        ours.close()
        raise
    try:
        files = (model_path.name if edge_model == model_path
                 else f"{edge_model.name} (edge_server), {model_path.name} (peer)")
        print(f"model: {files}  threads: {args.threads}  rounds: {args.rounds}  "
              f"mode: {args.mode}")
        (mode or MODES[args.mode])(args, [ours, theirs])
    finally:
        ours.close()
        theirs.close()
