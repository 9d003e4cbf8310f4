"""Scaling figures of an RPC split: the default model served local-only, then with its
layers on two rpc-servers on this machine (127.0.0.1), one client at a time.

Prints decode tok/s and time to first token (a 64-token greedy completion, median of
--runs), and the memory each device holds (llama.cpp's buffer sizes, and each process's
resident memory). Needs scripts/build/build-rpc.sh first; both servers use its libraries.

    .venv/bin/python scripts/bench/bench_rpc.py [--runs 5] [--tokens 64] [--rpc-threads 1]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

import httpx

from edge_server.engine.backend.rpc.rpc_devices import rpc_build_dir
from edge_testkit.bench.common import free_port, rss_mib, start_edge_server

PROMPT = "The history of the bicycle begins"


def start(args: list[str], log: Path, env: dict[str, str]) -> tuple[subprocess.Popen[bytes], str]:
    try:
        return start_edge_server(args, env=env, log=log)
    except RuntimeError as exc:
        raise SystemExit(f"{exc}:\n{log.read_text()}") from exc


def one_run(base: str, tokens: int) -> tuple[float, float]:
    """(time to first token, decode tok/s after it) of one streamed greedy completion."""
    body = {"model": "default", "prompt": PROMPT, "max_tokens": tokens, "temperature": 0,
            "ignore_eos": True, "stream": True}
    started = time.perf_counter()
    first = last = 0.0
    count = 0
    with httpx.stream("POST", f"{base}/v1/completions", json=body, timeout=300) as r:
        for line in r.iter_lines():
            if line.startswith("data: {") and json.loads(line[6:])["choices"][0]["text"]:
                count += 1
                last = time.perf_counter()
                first = first or last
    return first - started, (count - 1) / (last - first)


def measure(name: str, args: list[str], env: dict[str, str], work: Path, runs: int,
            tokens: int, rpc_pids: list[int]) -> dict[str, object]:
    before = [rss_mib(p) for p in rpc_pids]
    log = work / f"{name}.log"
    process, base = start(args, log, env)
    try:
        one_run(base, 8)  # warm-up
        results = [one_run(base, tokens) for _ in range(runs)]
        server_rss = rss_mib(process.pid)
        rpc_rss = [rss_mib(p) - b for p, b in zip(rpc_pids, before, strict=True)]
    finally:
        process.terminate()
        process.wait(timeout=60)
    buffers = [re.sub(r"^.*llama\.cpp: ", "", line) for line in log.read_text().splitlines()
               if "buffer size" in line]
    return {"name": name, "ttft_s": statistics.median(r[0] for r in results),
            "tok_s": statistics.median(r[1] for r in results), "server_rss_mib": server_rss,
            "rpc_rss_mib": rpc_rss, "buffers": buffers}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--threads", type=int, default=0, help="edge-server threads")
    parser.add_argument("--rpc-threads", type=int, default=1, help="threads per rpc-server")
    opts = parser.parse_args()
    build = rpc_build_dir()
    if not (build / ".complete").is_file():
        raise SystemExit(f"no RPC build at {build}: run scripts/build/build-rpc.sh")
    work = Path(tempfile.mkdtemp(prefix="bench-rpc-"))
    env = {**os.environ, "LLAMA_CPP_LIB_PATH": str(build / "lib"),
           "MTMD_CPP_LIB": str(build / "lib"), "XDG_DATA_HOME": str(work / "data")}
    common = ["--parallel", "1", "--ctx-size", "2048", "--prompt-cache-mb", "0"]
    if opts.threads:
        common += ["--threads", str(opts.threads)]
    ports = [free_port(), free_port()]
    rpcs = [subprocess.Popen([str(build / "bin/rpc-server"), "-H", "127.0.0.1", "-p", str(p),
                              "-t", str(opts.rpc_threads)], stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL) for p in ports]
    try:
        time.sleep(1.0)
        rows = [measure("local", common, env, work, opts.runs, opts.tokens, []),
                measure("rpc x2", [*common, "--rpc", ",".join(f"127.0.0.1:{p}" for p in ports)],
                        env, work, opts.runs, opts.tokens, [r.pid for r in rpcs])]
    finally:
        for r in rpcs:
            r.kill()
            r.wait()
    print(f"{opts.tokens} tokens, 1 client, median of {opts.runs}; rpc-servers on 127.0.0.1 "
          f"with {opts.rpc_threads} thread(s) each; {os.cpu_count()} cores\n")
    print("| setup | decode tok/s | first token (s) | edge-server RSS (MiB) | "
          "rpc-server RSS growth (MiB) |")
    print("|---|---|---|---|---|")
    for row in rows:
        rpc_rss = " / ".join(f"{m:.0f}" for m in row["rpc_rss_mib"]) or "-"  # type: ignore[attr-defined]
        print(f"| {row['name']} | {row['tok_s']:.1f} | {row['ttft_s']:.3f} | "
              f"{row['server_rss_mib']:.0f} | {rpc_rss} |")
    for row in rows:
        print(f"\n{row['name']} buffers:")
        for line in row["buffers"]:  # type: ignore[attr-defined]
            print(f"  {line}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
