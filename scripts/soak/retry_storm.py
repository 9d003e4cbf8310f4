"""Retry storm: 150 streaming clients that retry at once on a 429, against 8 clients
alone, in the same run; then the 150 again, honouring Retry-After. Rounds of the three
phases alternate their order, and each storm's share of the round's 8-client goodput is
reported with the median over rounds: the machine's speed drifts over minutes.

    .venv/bin/python scripts/soak/retry_storm.py                      # starts its own server
    .venv/bin/python scripts/soak/retry_storm.py --seconds 30 --base-url http://127.0.0.1:8080

Each phase runs --seconds; a client sends a streaming completion of --max-tokens tokens
(ignore_eos), and on a 429 sends it again at once (or after Retry-After). Goodput: tokens
of streams completed within the phase, per second; a phase's share is its goodput over
the 8-client phase's. Checks: no 5xx, no stream dropped (every 200 ends with a finish
reason and [DONE]); the storm keeps >= 80% of the goodput, the polite storm >= 95%.
By default the clients run at the lowest CPU priority, standing in for clients on other
machines: the server's cores are what is measured. But on two cores they then send only
about a hundred retries a minute; `--client-nice 0` puts them level with the server, the
worst case of a storm from the same machine (every retry's client work counts against
the server too), and the rejection rate each phase reached is printed. Connections that
get no answer at all are counted apart and retried. Traffic goes to 127.0.0.1 only; at
most --clients connections, for 3 x --rounds x --seconds. Exits 1 when a check fails.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import json
import os
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from edge_testkit.measure import round_order
from edge_testkit.servers.process import DEFAULT_MODEL, loopback_url, start_server, stop_server

PROMPT = "Write a short story about a lighthouse keeper and a storm."


@dataclass
class Phase:
    name: str
    clients: int
    polite: bool
    seconds: float
    statuses: collections.Counter[str] = field(default_factory=collections.Counter)
    tokens: int = 0
    completed: int = 0
    dropped: int = 0
    cut_at_end: int = 0
    latencies: list[float] = field(default_factory=list)

    @property
    def goodput(self) -> float:
        return self.tokens / self.seconds

    def line(self, baseline: Phase | None) -> str:
        share = f", {self.goodput / baseline.goodput:.0%} of 8 clients" if baseline else ""
        p50 = statistics.median(self.latencies) if self.latencies else float("nan")
        rejections = 60 * self.statuses.get("429", 0) / self.seconds
        return (f"{self.name}: {self.completed} streams completed, {self.goodput:.1f} tok/s"
                f"{share}; {rejections:.0f} rejections a minute; p50 latency {p50:.1f} s; "
                f"answers {dict(self.statuses)}; dropped "
                f"{self.dropped}; cut at the phase's end {self.cut_at_end}")


async def one_stream(client: httpx.AsyncClient, url: str, max_tokens: int,
                     phase: Phase) -> tuple[int, float]:
    """Sends one streaming completion; (status, Retry-After) or (200, 0) once complete."""
    body = {"model": DEFAULT_MODEL, "prompt": PROMPT, "max_tokens": max_tokens,
            "ignore_eos": True, "stream": True, "temperature": 0.8}
    async with client.stream("POST", f"{url}/v1/completions", json=body) as r:
        phase.statuses[str(r.status_code)] += 1
        if r.status_code != 200:
            await r.aread()
            return r.status_code, float(r.headers.get("retry-after", "0") or 0)
        tokens, finished, done = 0, False, False
        try:
            async for line in r.aiter_lines():
                if line == "data: [DONE]":
                    done = True
                elif line.startswith("data: "):
                    choice = json.loads(line[6:])["choices"][0]
                    tokens += 1 if choice["text"] else 0
                    finished = finished or choice["finish_reason"] is not None
        except httpx.HTTPError:
            pass  # an accepted stream cut: dropped
        if not (finished and done):
            phase.dropped += 1
            return -1, 0
        phase.tokens += tokens
        return 200, 0


async def client_loop(url: str, phase: Phase, deadline: float, max_tokens: int,
                      client: httpx.AsyncClient) -> None:
    while time.monotonic() < deadline:
        first_try = time.monotonic()
        while time.monotonic() < deadline:
            try:
                status, retry_after = await one_stream(client, url, max_tokens, phase)
            except httpx.HTTPError as exc:
                # No answer at all (a connection refused or reset before the status
                # line): counted apart from drops, and retried as a 429 would be.
                phase.statuses[f"no answer ({type(exc).__name__})"] += 1
                await asyncio.sleep(0.1)
                continue
            if status == 200:
                phase.completed += 1
                phase.latencies.append(time.monotonic() - first_try)
                break
            if status != 429:
                break
            if phase.polite:
                await asyncio.sleep(max(retry_after, 0.1))


async def run_phase(url: str, phase: Phase, max_tokens: int) -> Phase:
    """Each client has its own connection pool, as separate users do: with one pool for
    all 150, httpx scanned every idle connection on each request, and with clients
    sleeping out Retry-After (many idle connections) that took a third of a core."""
    deadline = time.monotonic() + phase.seconds
    timeout = httpx.Timeout(phase.seconds + 30, connect=10)
    async with contextlib.AsyncExitStack() as stack:
        clients = [await stack.enter_async_context(httpx.AsyncClient(timeout=timeout))
                   for _ in range(phase.clients)]
        tasks = [asyncio.create_task(client_loop(url, phase, deadline, max_tokens, client))
                 for client in clients]
        _, pending = await asyncio.wait(tasks, timeout=phase.seconds)
        phase.cut_at_end = len(pending)  # in flight at the end: neither good nor dropped
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
    return phase


def idle(url: str, timeout: float = 60) -> bool:
    """Nothing busy or queued once the clients are gone."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        stats = httpx.get(f"{url}/health", timeout=10).json()["models"][DEFAULT_MODEL]
        if stats["busy_slots"] == 0 and stats["waiting"] == 0 and stats["leases"] == 0:
            return True
        time.sleep(0.5)
    return False


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--base-url", type=loopback_url, help="a running server on 127.0.0.1")
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--rounds", type=int, default=3, choices=range(1, 10), metavar="1..9")
    parser.add_argument("--clients", type=int, default=150, choices=range(8, 151),
                        metavar="8..150")
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--server-args", default="", help="options of the server started")
    parser.add_argument("--client-nice", type=int, default=19, choices=range(0, 20),
                        metavar="0..19", help="CPU niceness of the clients (19: lowest)")
    args = parser.parse_args()
    server = None
    url = args.base_url
    if url is None:
        server = start_server(Path(tempfile.mkdtemp(prefix="retry-storm-")),
                              *args.server_args.split(), name="storm")
        url = server.base_url
    os.nice(args.client_nice)  # 19: the clients stand for other machines
    try:
        problems: list[str] = []
        shares: dict[str, list[float]] = collections.defaultdict(list)
        targets = {"at once": 0.80, "honouring Retry-After": 0.95}
        for r in range(args.rounds):
            base = Phase("8 clients", 8, False, args.seconds)
            phases = [base,
                      Phase(f"{args.clients} clients retrying at once", args.clients, False,
                            args.seconds),
                      Phase(f"{args.clients} clients honouring Retry-After", args.clients,
                            True, args.seconds)]
            print(f"round {r + 1}:", flush=True)
            for phase in round_order(r, phases):
                asyncio.run(run_phase(url, phase, args.max_tokens))
                if not idle(url):
                    problems.append(f"{phase.name}: the server stayed busy after the clients left")
                fives = sum(n for s, n in phase.statuses.items() if s.startswith("5"))
                if fives or phase.dropped:
                    problems.append(f"{phase.name}: {fives} 5xx answers, {phase.dropped} dropped")
            for phase in phases:
                print("  " + phase.line(base if phase is not base else None), flush=True)
            for kind, phase in zip(targets, phases[1:], strict=True):
                shares[kind].append(phase.goodput / base.goodput if base.goodput else 0.0)
        for kind, target in targets.items():
            median = statistics.median(shares[kind])
            rounds = ", ".join(f"{x:.0%}" for x in shares[kind])
            print(f"{args.clients} clients {kind}: median {median:.0%} of 8 clients' goodput "
                  f"(rounds: {rounds}); target {target:.0%}")
            if not median >= target:
                problems.append(f"{kind}: median goodput {median:.0%} < {target:.0%}")
        print("problems: " + ("none" if not problems else "; ".join(problems)))
        return 1 if problems else 0
    finally:
        if server is not None:
            stop_server(server)


if __name__ == "__main__":
    sys.exit(main())
