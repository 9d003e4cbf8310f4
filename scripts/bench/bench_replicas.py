"""Figures for the scaling note in docs/deployment.md: one replica's throughput and memory, then N
replicas behind HAProxy (systemd/haproxy/edge-server.cfg) on this machine.

    .venv/bin/python scripts/bench/bench_replicas.py [--replicas 3] [--clients 4] [--tokens 64]

Each client streams completions of --tokens tokens (ignore_eos), one after another, with
its own prompt_cache_key; throughput is completion tokens over wall time, the median of
--rounds rounds that alternate between the setups. Memory is each server's resident set
(VmRSS) once loaded, and its peak under the load; the KV cache's share comes from RSS at
two --ctx-size values. Replicas on one machine share its cores: the figure shows what
the extra processes and HAProxy cost, not what N machines give.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from edge_testkit.bench.common import ROOT, free_port, rss_mib, wait_ready


class Replica:
    def __init__(self, name: str, workdir: Path, args: list[str]) -> None:
        self.name = name
        self.loaded = 0.0
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "edge_server", "serve", "--port", str(self.port),
             "--replica-name", name, *args],
            cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            env={**os.environ, "XDG_DATA_HOME": str(workdir / "data")})
        self.peak = 0.0

    def wait_ready(self) -> None:
        wait_ready(self.proc, f"{self.url}/health", what=f"replica {self.name}")

    def sample(self) -> float:
        value = rss_mib(self.proc.pid)
        self.peak = max(self.peak, value)
        return value

    def stop(self) -> None:
        self.proc.send_signal(signal.SIGTERM)
        self.proc.wait(timeout=60)


def run_load(url: str, clients: int, requests: int, tokens: int) -> tuple[float, int, set[str]]:
    """(seconds, completion tokens, replicas seen) for `clients` streaming clients."""
    totals = [0] * clients
    seen: set[str] = set()

    def client(i: int) -> None:
        with httpx.Client(timeout=300) as http:
            for j in range(requests):
                body = {"model": "default", "prompt": f"Chapter {j} of story {i}:",
                        "max_tokens": tokens, "ignore_eos": True, "stream": True,
                        "prompt_cache_key": f"client-{i}",
                        "stream_options": {"include_usage": True}}
                with http.stream("POST", f"{url}/v1/completions", json=body) as r:
                    r.raise_for_status()
                    seen.add(r.headers.get("x-edge-replica", "?"))
                    for line in r.iter_lines():
                        if line.startswith("data: {") and '"usage":{' in line:
                            totals[i] += json.loads(line[6:])["usage"]["completion_tokens"]

    threads = [threading.Thread(target=client, args=(i,)) for i in range(clients)]
    start = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return time.monotonic() - start, sum(totals), seen


@dataclass
class Setup:
    """One configuration under load: where clients send, and the servers behind it."""

    label: str
    url: str
    replicas: list[Replica]
    rates: list[float] = field(default_factory=list)
    seen: set[str] = field(default_factory=set)

    def round(self, args: argparse.Namespace) -> None:
        stop = threading.Event()

        def sampler() -> None:
            while not stop.wait(0.2):
                for r in self.replicas:
                    r.sample()

        watcher = threading.Thread(target=sampler, daemon=True)
        watcher.start()
        seconds, tokens, seen = run_load(self.url, args.clients, args.requests, args.tokens)
        stop.set()
        watcher.join()
        self.rates.append(tokens / seconds)
        self.seen |= seen

    def report(self) -> None:
        rounds = ", ".join(f"{r:.1f}" for r in self.rates)
        print(f"{self.label}: median {statistics.median(self.rates):.1f} tok/s "
              f"(rounds: {rounds}; replicas used: {len(self.seen)})")
        for r in self.replicas:
            print(f"    {r.name}: RSS {r.loaded:.0f} MiB loaded, {r.peak:.0f} MiB peak")


def loaded_rss(workdir: Path, args: list[str]) -> float:
    replica = Replica("memory", workdir, args)
    try:
        replica.wait_ready()
        time.sleep(1)
        return replica.sample()
    finally:
        replica.stop()


def memory_slope(workdir: Path, parallel: int) -> None:
    """The KV cache's share of a replica's memory: RSS at two --ctx-size values."""
    small, large = 1024, 16384
    low, high = (loaded_rss(workdir, ["--parallel", str(parallel), "--ctx-size", str(n)])
                 for n in (small, large))
    per_k = (high - low) / ((large - small) / 1000)
    print(f"memory: RSS {low:.0f} MiB at --ctx-size {small}, {high:.0f} MiB at {large}: "
          f"{per_k:.1f} MiB per 1,000 KV tokens; {low - per_k * small / 1000:.0f} MiB "
          f"without KV (weights {model_mb():.0f} MiB of it)")


def model_mb() -> float:
    from edge_server.catalogue.default_model import default_model_path

    return default_model_path().stat().st_size / 2**20


def behind_haproxy(workdir: Path, count: int, serve_args: list[str], label: str
                   ) -> tuple[Setup, subprocess.Popen[bytes]]:
    group = [Replica(f"{label[:1]}r{i}", workdir, serve_args) for i in range(1, count + 1)]
    port = free_port()
    config = workdir / f"haproxy-{port}.cfg"
    config.write_text(subprocess.run(
        [sys.executable, "scripts/deploy/haproxy_config.py", "--listen", f"127.0.0.1:{port}",
         "--foreground", *[a for r in group for a in ("--replica", r.url[7:])]],
        cwd=ROOT, capture_output=True, text=True, check=True).stdout)
    proxy = subprocess.Popen(["haproxy", "-db", "-f", str(config)],
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return Setup(label, f"http://127.0.0.1:{port}", group), proxy


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--replicas", type=int, default=3)
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--requests", type=int, default=3, help="per client")
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--parallel", type=int, default=4)
    parser.add_argument("--ctx-size", type=int, default=4096)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    cores = os.cpu_count() or 1
    print(f"machine: {cores} cores; model: the default (SmolLM2-135M-Instruct Q4_1); "
          f"--parallel {args.parallel} --ctx-size {args.ctx_size}")
    print(f"load average before: {os.getloadavg()[0]:.1f} (other work on the machine "
          "lowers every figure)")
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        memory_slope(workdir, args.parallel)
        base = ["--parallel", str(args.parallel), "--ctx-size", str(args.ctx_size)]
        setups = [Setup(f"1 replica, {t} thread(s), direct", "", [Replica(
            f"single-{t}", workdir, [*base, "--threads", str(t)])])
            for t in sorted({cores, 1}, reverse=True)]
        for setup in setups:
            setup.url = setup.replicas[0].url
        proxies: list[subprocess.Popen[bytes]] = []
        if shutil.which("haproxy") is None:
            print("haproxy not installed: no figures through it")
        else:
            threads = max(1, cores // args.replicas)
            for count, t in ((1, cores), (args.replicas, threads)):
                setup, proxy = behind_haproxy(
                    workdir, count, [*base, "--threads", str(t)],
                    f"{count} replica(s) x {t} thread(s) behind HAProxy, one machine")
                setups.append(setup)
                proxies.append(proxy)
        try:
            for setup in setups:
                for r in setup.replicas:
                    r.wait_ready()
                    r.loaded = r.sample()
            time.sleep(3)  # HAProxy's checks (rise 2, 1 s apart) see the replicas up
            for setup in setups:  # warm-up: prompts and threads settle
                run_load(setup.url, args.clients, 1, 8)
            # Rounds alternate between the setups, so that other work on the machine
            # falls on all of them alike.
            for _ in range(args.rounds):
                for setup in setups:
                    setup.round(args)
            for setup in setups:
                setup.report()
        finally:
            for proxy in proxies:
                proxy.terminate()
                proxy.wait(timeout=10)
            for setup in setups:
                for r in setup.replicas:
                    r.stop()
    print(f"load average after: {os.getloadavg()[0]:.1f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
