"""The disconnect soak: clients that give up at every stage of a request (queued,
prefilling, decoding, non-stream timeouts) must leave the server with nothing running,
nothing queued and no lease held; the model must then unload after its keep_alive, and
SIGTERM must stop the idle server at once. tests/process/test_disconnects.py runs it
briefly, scripts/soak/soak_disconnects.py for longer."""


from __future__ import annotations

import collections
import random
import signal
import subprocess
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from edge_testkit.servers.process import DEFAULT_MODEL, RunningServer, start_server

SHORT_PROMPT = "Write a long story about a lighthouse keeper."
LONG_PROMPT = "lorem ipsum dolor sit amet " * 200  # ~1,000 tokens: a noticeable prefill
MAX_TOKENS = 256  # far more than any client here waits for


@dataclass
class Report:
    outcomes: collections.Counter[str] = field(default_factory=collections.Counter)
    problems: list[str] = field(default_factory=list)
    figures: dict[str, Any] = field(default_factory=dict)

    def print(self) -> None:
        for mode_outcome, n in sorted(self.outcomes.items()):
            print(f"  {mode_outcome}: {n}")
        for key, value in self.figures.items():
            print(f"{key}: {value}")
        print("problems: " + ("none" if not self.problems else ""))
        for problem in self.problems:
            print(f"  - {problem}")


def body(prompt: str, stream: bool) -> dict[str, Any]:
    return {"model": DEFAULT_MODEL, "prompt": prompt, "max_tokens": MAX_TOKENS,
            "ignore_eos": True, "stream": stream}


def plain_gives_up(base_url: str, rng: random.Random) -> str:
    """A non-stream request whose client times out while the server still works on it."""
    prompt = LONG_PROMPT if rng.random() < 0.3 else SHORT_PROMPT
    timeout = httpx.Timeout(rng.uniform(0.05, 0.5), connect=10)
    try:
        r = httpx.post(f"{base_url}/v1/completions", json=body(prompt, False), timeout=timeout)
    except httpx.TimeoutException:
        return "client timed out"
    return f"answered {r.status_code}"


def stream_dropped(base_url: str, rng: random.Random, stage: str) -> str:
    """A stream dropped while queued or prefilling (before the first event: headers go
    out only once the engine answered) or while decoding (after some events)."""
    prompt = LONG_PROMPT if stage == "prefill" or rng.random() < 0.3 else SHORT_PROMPT
    wait = {"queued": rng.uniform(0.01, 0.3), "prefill": rng.uniform(0.05, 0.5)}.get(stage, 60)
    events = rng.randint(1, 20)
    try:
        with httpx.Client(timeout=httpx.Timeout(wait, connect=10)) as client, client.stream(
                "POST", f"{base_url}/v1/completions", json=body(prompt, True)) as r:
            if r.status_code != 200:
                return f"answered {r.status_code}"
            seen = 0
            for line in r.iter_lines():
                seen += line.startswith("data: ")
                if seen >= events:
                    return "dropped while decoding"
            return "stream ended before the drop"
    except httpx.TimeoutException:
        return "dropped before the first event"


def run_traffic(base_url: str, plain: int, streams: int, concurrency: int,
                seed: int, report: Report) -> None:
    rng = random.Random(seed)
    modes = ["plain"] * plain + [
        "stream-" + rng.choice(["queued", "prefill", "decode"]) for _ in range(streams)]
    rng.shuffle(modes)
    seeds = [rng.randrange(2**32) for _ in modes]

    def one(mode: str, job_seed: int) -> tuple[str, str]:
        job_rng = random.Random(job_seed)
        try:
            if mode == "plain":
                return mode, plain_gives_up(base_url, job_rng)
            return mode, stream_dropped(base_url, job_rng, mode.removeprefix("stream-"))
        except httpx.HTTPError as exc:  # the server dropped us, or refused to connect
            return mode, f"transport error {type(exc).__name__}"

    started = time.monotonic()
    with ThreadPoolExecutor(concurrency) as pool:
        results = list(pool.map(one, modes, seeds))
    report.figures["traffic seconds"] = round(time.monotonic() - started, 1)
    for mode, outcome in results:
        report.outcomes[f"{mode} -> {outcome}"] += 1
        if outcome.startswith("transport error") or outcome.startswith("answered 5"):
            report.problems.append(f"{mode}: {outcome}")


def model_stats(base_url: str) -> dict[str, Any] | None:
    """The default model's /health figures; None when it is not loaded."""
    health = httpx.get(f"{base_url}/health", timeout=10).json()
    stats = health.get("models", {}).get(DEFAULT_MODEL)
    return stats if isinstance(stats, dict) else None


def check_idle(base_url: str, timeout: float, report: Report) -> None:
    """Nothing may still run, wait or hold a lease once every client has left."""
    deadline = time.monotonic() + timeout
    started = time.monotonic()
    while True:
        stats = model_stats(base_url)
        if stats is None:  # unloaded already: only an idle model without leases unloads
            report.figures["idle after"] = "the model unloaded first (idle, no lease)"
            return
        if "leases" not in stats:
            report.figures["leases"] = "absent from /health"
        busy = (stats["busy_sequences"], stats["waiting"], stats.get("leases", 0))
        if busy == (0, 0, 0):
            report.figures["idle after"] = f"{time.monotonic() - started:.1f}s: {stats}"
            return
        if time.monotonic() > deadline:
            report.problems.append(f"still busy {timeout:.0f}s after the last client left "
                                   f"(busy_sequences, waiting, leases = {busy}): {stats}")
            return
        time.sleep(0.1)


def check_serves_then_unloads(base_url: str, keep_alive: float, report: Report) -> None:
    r = httpx.post(f"{base_url}/v1/completions", timeout=60, json={
        "model": DEFAULT_MODEL, "prompt": "Hello", "max_tokens": 2})
    if r.status_code != 200:
        report.problems.append(f"a plain request after the soak got {r.status_code}")
    finished = time.monotonic()

    def status() -> str:
        models = httpx.get(f"{base_url}/v1/models", timeout=10).json()["data"]
        return str(next(m["status"] for m in models if m["id"] == DEFAULT_MODEL))

    seen = [status()]
    deadline = finished + keep_alive + 5  # the reaper looks about once a second
    while seen[-1] == "loaded" and time.monotonic() < deadline:
        time.sleep(0.2)
        seen.append(status())
    report.figures["model status"] = f"{seen[0]} -> {seen[-1]} after " \
                                     f"{time.monotonic() - finished:.1f}s"
    if seen[0] != "loaded" or seen[-1] != "available":
        report.problems.append(f"the model did not go from loaded to available within "
                               f"keep_alive + 5s: {seen[0]} -> {seen[-1]}")


def check_sigterm(server: RunningServer, report: Report) -> None:
    started = time.monotonic()
    server.process.send_signal(signal.SIGTERM)
    try:
        code = server.process.wait(timeout=2)
    except subprocess.TimeoutExpired:
        report.problems.append("SIGTERM did not stop the idle server within 2s")
        server.process.kill()
        server.process.wait()
        return
    report.figures["SIGTERM"] = f"exit {code} after {time.monotonic() - started:.2f}s"
    if code != 0:
        report.problems.append(f"SIGTERM: exit status {code}")
    if "Traceback" in server.log_text():
        report.problems.append(f"the server logged a traceback (see {server.log_path})")


def soak(base_url: str, server: RunningServer | None, *, plain: int, streams: int,
         concurrency: int, keep_alive: float, seed: int = 0) -> Report:
    report = Report()
    run_traffic(base_url, plain, streams, concurrency, seed, report)
    check_idle(base_url, 15.0, report)
    check_serves_then_unloads(base_url, keep_alive, report)
    if server is not None:
        check_sigterm(server, report)
    return report


def start(keep_alive: float, threads: int, parallel: int = 2) -> RunningServer:
    # Few slots, so that concurrent clients queue; one thread keeps timing steady.
    return start_server(Path(tempfile.mkdtemp(prefix="soak-")), "--keep-alive",
                        str(keep_alive), "--parallel", str(parallel), "--ctx-size", "4096",
                        "--threads", str(threads), name="soak")
