"""Mixed soak: ten minutes of everything at once (streams, dropped streams, client
timeouts, JSON schemas, forced tools, n with logprobs, embeddings, long system prompts),
watching the server's memory account.

    .venv/bin/python scripts/soak/soak_mixed.py                          # starts its own server
    .venv/bin/python scripts/soak/soak_mixed.py --minutes 3 --env MALLOC_ARENA_MAX=2
    .venv/bin/python scripts/soak/soak_mixed.py --base-url http://127.0.0.1:8080

--clients workers send requests of randomly chosen kinds until --minutes pass; /health's
memory account is sampled every 10 s. Checks: no 5xx; RSS at the end at most 10% above
RSS after the first minute, both less the prompt store (which fills up to
--prompt-cache-mb by design, and is accounted); nothing busy, queued or leased once
the clients stop; RSS at the end within 250 MB of the accounted parts (weights, KV
cache, prompt store, embedding context). Prints the memory account at the end. Traffic
goes to 127.0.0.1 only, from at most --clients connections, for --minutes. Exits 1 when
a check fails.
"""

from __future__ import annotations

import argparse
import collections
import random
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx

from edge_testkit.servers.process import DEFAULT_MODEL, loopback_url, start_server, stop_server

MiB = 2**20
TOPICS = ["lighthouses", "bees", "glaciers", "trains", "volcanoes", "owls", "bridges", "tea"]
SCHEMAS = [{"type": "object", "properties": {"name": {"type": "string", "maxLength": 20},
                                             "age": {"type": "integer", "minimum": 0}},
            "required": ["name", "age"]},
           {"type": "object", "properties": {"tags": {"type": "array", "maxItems": 3,
                                                      "items": {"type": "string"}}}},
           {"type": "object", "properties": {"ok": {"type": "boolean"},
                                             "kind": {"enum": ["a", "b", "c"]}}}]
TOOL = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}


def system_prompt(rng: random.Random) -> str:
    """One of 40 distinct ~1,500-token system prompts: the prompt store fills up."""
    k = rng.randrange(40)
    words = random.Random(k).choices([*TOPICS, "and", "the", "of", "rules"], k=1200)
    return f"You are assistant number {k}. Rules: " + " ".join(words)


def chat(messages: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
    return {"model": DEFAULT_MODEL, "messages": messages, "max_tokens": 16, **extra}


def user(rng: random.Random) -> list[dict[str, Any]]:
    return [{"role": "user", "content": f"Tell me about {rng.choice(TOPICS)}."}]


def kinds(url: str) -> dict[str, Callable[[httpx.Client, random.Random], str]]:
    def post(client: httpx.Client, path: str, body: dict[str, Any], timeout: float = 120
             ) -> str:
        return str(client.post(f"{url}{path}", json=body, timeout=timeout).status_code)

    def stream(client: httpx.Client, rng: random.Random, drop: bool = False) -> str:
        body = chat(user(rng), stream=True, max_tokens=48 if drop else 24)
        with client.stream("POST", f"{url}/v1/chat/completions", json=body, timeout=120) as r:
            for n, line in enumerate(r.iter_lines()):
                if drop and n >= rng.randint(1, 6):
                    return "dropped"
                if line == "data: [DONE]":
                    return str(r.status_code)
            return str(r.status_code) if r.status_code != 200 else "stream cut"

    def times_out(client: httpx.Client, rng: random.Random) -> str:
        try:
            return post(client, "/v1/chat/completions", chat(user(rng), max_tokens=64),
                        timeout=rng.uniform(0.05, 0.5))
        except httpx.TimeoutException:
            return "client timed out"

    return {
        "stream": stream,
        "dropped stream": lambda c, rng: stream(c, rng, drop=True),
        "client timeout": times_out,
        "json schema": lambda c, rng: post(c, "/v1/chat/completions", chat(
            user(rng), response_format={"type": "json_schema", "json_schema": {
                "name": "out", "schema": rng.choice(SCHEMAS)}})),
        "tools": lambda c, rng: post(c, "/v1/chat/completions", chat(
            [{"role": "user", "content": "Weather in Oslo?"}], tools=[TOOL],
            tool_choice="required")),
        "n and logprobs": lambda c, rng: post(c, "/v1/completions", {
            "model": DEFAULT_MODEL, "prompt": f"A poem about {rng.choice(TOPICS)}:", "n": 3,
            "logprobs": 3, "echo": True, "max_tokens": 8}),
        "embeddings": lambda c, rng: post(c, "/v1/embeddings", {
            "model": DEFAULT_MODEL, "input": [f"{t} {rng.random()}" for t in TOPICS[:4]]}),
        "long system prompt": lambda c, rng: post(c, "/v1/chat/completions", chat(
            [{"role": "system", "content": system_prompt(rng)}, *user(rng)], max_tokens=8)),
    }


def health(url: str) -> dict[str, Any]:
    return httpx.get(f"{url}/health", timeout=30).json()  # type: ignore[no-any-return]


Sample = tuple[float, int, int]  # seconds, RSS, prompt store bytes


def soak(url: str, minutes: float, clients: int, seed: int
         ) -> tuple[collections.Counter[str], list[Sample]]:
    outcomes: collections.Counter[str] = collections.Counter()
    samples: list[Sample] = []
    start = time.monotonic()
    deadline = start + minutes * 60
    table = kinds(url)
    lock = threading.Lock()

    def worker(k: int) -> None:
        rng = random.Random(seed * 1000 + k)
        with httpx.Client() as client:
            while time.monotonic() < deadline:
                kind = rng.choice(list(table))
                try:
                    result = table[kind](client, rng)
                except httpx.HTTPError as exc:
                    result = type(exc).__name__
                with lock:
                    outcomes[f"{kind}: {result}"] += 1

    with ThreadPoolExecutor(clients) as pool:
        futures = [pool.submit(worker, k) for k in range(clients)]
        while time.monotonic() < deadline:
            report = health(url)
            if "memory" in report:
                memory = report["memory"]
                samples.append((time.monotonic() - start, memory["rss"],
                                memory["prompt_store"]))
            else:  # not serving (a step stalled past the watchdog): a failed check
                with lock:
                    outcomes[f"health: {report.get('status')}"] += 1
            time.sleep(min(10, max(0.1, deadline - time.monotonic())))
        for future in futures:
            future.result()
    return outcomes, samples


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--base-url", type=loopback_url, help="a running server on 127.0.0.1")
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--clients", type=int, default=6, choices=range(1, 33), metavar="1..32")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--server-args", default="", help="options of the server started")
    parser.add_argument("--env", action="append", default=[],
                        help="NAME=VALUE for the server started here (e.g. MALLOC_ARENA_MAX=2)")
    args = parser.parse_args()
    server, url = None, args.base_url
    if url is None:
        env = dict(item.split("=", 1) for item in args.env)
        server = start_server(Path(tempfile.mkdtemp(prefix="soak-mixed-")),
                              *args.server_args.split(), name="soak", env=env)
        url = server.base_url
    try:
        outcomes, samples = soak(url, args.minutes, args.clients, args.seed)
        time.sleep(2)
        end = health(url)
        problems = [f"{n} x {o}" for o, n in outcomes.items() if o.split(": ")[-1][:1] == "5"]
        problems += [f"{n} x {o}" for o, n in outcomes.items() if o.endswith("stream cut")]
        problems += [f"{n} x {o}" for o, n in outcomes.items() if o.startswith("health: ")]
        for model, stats in end["models"].items():
            if stats["busy_slots"] or stats["waiting"] or stats["leases"]:
                problems.append(f"{model} still busy: {stats}")
        after_first = next((s for s in samples if s[0] >= 60), samples[0])
        memory = end["memory"]
        growth = ((memory["rss"] - memory["prompt_store"]) / (after_first[1] - after_first[2])
                  - 1)
        if growth >= 0.10:
            problems.append(f"RSS less the prompt store grew {growth:.1%} after the first "
                            "minute")
        known = sum(memory[p] for p in ("weights", "kv_cache", "prompt_store",
                                        "embedding_context"))
        if memory["rss"] - known > 250 * MiB:
            problems.append(f"RSS is {(memory['rss'] - known) / MiB:.0f} MiB above weights, "
                            "KV cache, prompt store and embedding context")
        for outcome, n in sorted(outcomes.items()):
            print(f"  {outcome}: {n}")
        print("RSS, prompt store (s: MiB, MiB): " + ", ".join(
            f"{t:.0f}: {rss / MiB:.0f}, {store / MiB:.0f}" for t, rss, store in samples))
        print(f"RSS after the first minute {after_first[1] / MiB:.0f} MiB, at the end "
              f"{memory['rss'] / MiB:.0f} MiB; less the prompt store {growth:+.1%}")
        print("memory account (MiB): " + ", ".join(f"{k} {v / MiB:.1f}"
                                                   for k, v in memory.items()))
        print("problems: " + ("none" if not problems else "; ".join(problems)))
        return 1 if problems else 0
    finally:
        if server is not None:
            stop_server(server)


if __name__ == "__main__":
    sys.exit(main())
