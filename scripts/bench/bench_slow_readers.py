"""Slow readers against the send buffer bound: the server's peak RSS while many clients
read long streams with top_logprobs slowly, and how a normal client fares meanwhile.

    .venv/bin/python scripts/bench/bench_slow_readers.py                # --send-buffer-mb 256
    .venv/bin/python scripts/bench/bench_slow_readers.py --send-buffer-mb 16
    .venv/bin/python scripts/bench/bench_slow_readers.py --send-buffer-mb 1048576  # no bound

Starts its own server (the default model, the given --send-buffer-mb, --send-timeout
and any --server-arg), then opens --clients raw connections on 127.0.0.1, each
streaming a chat completion of --max-tokens with logprobs and top_logprobs 20, and
reads each at --rate bytes a second for --seconds (small receive buffers; the
server's side of a loopback socket still grows its kernel buffer to a few MB, so with
short answers they wait there, not in the server). Meanwhile it samples the server's
VmRSS from /proc and times a short completion every few seconds. Prints the RSS before
and at its peak (and which parts of /health's memory account grew), the probes' times,
how the readers ended, and the server's counters.
A benchmark: it prints figures; with --check it also exits 1 unless the bound held
(send buffer bytes at most --send-buffer-mb when sampled, some readers closed over
it, RSS grown by less than --check-rss-mb, every probe answered 200). Too long for the
test suite on a small machine (the answers must outgrow the kernel's buffers first):

    .venv/bin/python scripts/bench/bench_slow_readers.py --check --send-buffer-mb 1 \
        --clients 8 --max-tokens 1500 --rate 1024 --seconds 240 --send-timeout 600 \
        --server-arg=--parallel --server-arg=4 --server-arg=--ctx-size --server-arg=2048
"""

from __future__ import annotations

import argparse
import json
import socket
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from urllib.parse import urlsplit

import httpx

from edge_testkit.bench.common import memory_parts, rss_mib
from edge_testkit.servers.process import DEFAULT_MODEL, start_server, stop_server


class SlowReader:
    """One connection reading its answer at a fixed rate."""

    def __init__(self, base_url: str, max_tokens: int) -> None:
        url = urlsplit(base_url)
        self.sock = socket.socket()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_MAXSEG, 536)
        self.sock.connect((url.hostname, url.port))
        body = json.dumps({
            "model": DEFAULT_MODEL, "max_tokens": max_tokens, "ignore_eos": True,
            "stream": True, "logprobs": True, "top_logprobs": 20,
            "messages": [{"role": "user", "content": "Tell me a long story."}]}).encode()
        head = (f"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n")
        self.sock.sendall(head.encode() + body)
        self.sock.setblocking(False)
        self.received = 0
        self.head = b""
        self.ended = ""  # "", "eof" (the answer ended or was closed), "reset"

    def read(self, budget: int) -> None:
        while budget > 0 and not self.ended:
            try:
                data = self.sock.recv(min(budget, 4096))
            except BlockingIOError:
                return
            except ConnectionError:
                self.ended = "reset"
                return
            if not data:
                self.ended = "eof"
                return
            if len(self.head) < 64:
                self.head += data[:64]
            self.received += len(data)
            budget -= len(data)

    @property
    def status(self) -> str:
        return self.head.split(b" ", 2)[1].decode() if self.head.count(b" ") >= 2 else "-"


def probe(base_url: str, stop: threading.Event, times: list[float], codes: list[int]) -> None:
    while not stop.is_set():
        start = time.monotonic()
        try:
            r = httpx.post(f"{base_url}/v1/completions", timeout=120, json={
                "model": DEFAULT_MODEL, "prompt": "Hello", "max_tokens": 4})
            codes.append(r.status_code)
        except httpx.HTTPError:
            codes.append(0)
        times.append(time.monotonic() - start)
        stop.wait(3)


def counters(base_url: str) -> dict[str, float]:
    text = httpx.get(f"{base_url}/metrics", timeout=10).text
    return {line.split()[0]: float(line.split()[-1]) for line in text.splitlines()
            if line.startswith(("edge_server_send_", "edge_server_requests_in_flight"))}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=64)
    parser.add_argument("--rate", type=int, default=1024, help="bytes a second per reader")
    parser.add_argument("--seconds", type=float, default=60)
    parser.add_argument("--max-tokens", type=int, default=300)
    parser.add_argument("--send-buffer-mb", type=float, default=256)
    parser.add_argument("--send-timeout", type=float, default=120)
    parser.add_argument("--server-arg", action="append", default=[])
    parser.add_argument("--check", action="store_true", help="exit 1 unless the bound held")
    parser.add_argument("--check-rss-mb", type=float, default=64)
    args = parser.parse_args()

    tmp = Path(tempfile.mkdtemp(prefix="bench-slow-readers-"))
    server = start_server(tmp, "--send-buffer-mb", str(args.send_buffer_mb),
                          "--send-timeout", str(args.send_timeout), *args.server_arg,
                          name="slow-readers")
    pid = server.process.pid
    readers: list[SlowReader] = []
    stop = threading.Event()
    probe_times: list[float] = []
    probe_codes: list[int] = []
    try:
        httpx.post(f"{server.base_url}/v1/completions", timeout=120, json={
            "model": DEFAULT_MODEL, "prompt": "Hi", "max_tokens": 2})  # warm
        rss_before = rss_mib(pid)
        parts_before = memory_parts(server.base_url)
        parts_peak = parts_before
        readers = [SlowReader(server.base_url, args.max_tokens) for _ in range(args.clients)]
        prober = threading.Thread(target=probe, args=(server.base_url, stop, probe_times,
                                                      probe_codes), daemon=True)
        prober.start()
        peak, held_peak = rss_before, 0.0
        start = time.monotonic()
        tick, ticks = 0.1, 0
        while time.monotonic() - start < args.seconds:
            for reader in readers:
                reader.read(int(args.rate * tick))
            rss = rss_mib(pid)
            ticks += 1
            if rss > peak and ticks % 5 == 0:
                parts_peak = memory_parts(server.base_url)
            peak = max(peak, rss)
            if ticks % 10 == 0:
                held_peak = max(held_peak, counters(server.base_url).get(
                    "edge_server_send_buffer_bytes", 0.0))
            time.sleep(tick)
        stop.set()
        prober.join(timeout=130)
        final = counters(server.base_url)
    finally:
        for reader in readers:
            reader.sock.close()
        stop_server(server)

    ended = {k: sum(1 for r in readers if r.ended == k) for k in ("", "eof", "reset")}
    statuses = sorted({r.status for r in readers})
    print(f"clients {args.clients}, {args.rate} B/s each, {args.seconds:g} s, max_tokens "
          f"{args.max_tokens}, top_logprobs 20, --send-buffer-mb {args.send_buffer_mb:g}, "
          f"--send-timeout {args.send_timeout:g}")
    print(f"server RSS: {rss_before:.0f} MiB before, {peak:.0f} MiB at peak "
          f"(+{peak - rss_before:.0f} MiB)")
    grown = {part: (parts_peak.get(part, 0) - size) / 2**20
             for part, size in parts_before.items() if part != "weights"}
    print("memory account, grown to the peak (MiB): " + ", ".join(
        f"{part} {mib:+.0f}" for part, mib in grown.items() if abs(mib) >= 1))
    print(f"send buffer bytes at peak (sampled each second): {held_peak / 2**20:.1f} MiB")
    print(f"readers: still reading {ended['']}, ended or closed {ended['eof']}, "
          f"reset {ended['reset']}; statuses {statuses}; received "
          f"{sum(r.received for r in readers) / 2**20:.1f} MiB in all")
    if probe_times:
        print(f"probe completions: {len(probe_times)}, codes {sorted(set(probe_codes))}, "
              f"median {statistics.median(probe_times):.2f} s, max {max(probe_times):.2f} s")
    print("counters at the end: " + ", ".join(f"{k} {v:g}" for k, v in final.items()))
    if args.check:
        failed = [what for what, ok in [
            ("send buffer over the bound", held_peak <= args.send_buffer_mb * 2**20),
            ("no reader closed over the bound",
             final.get("edge_server_send_buffer_closed_over_limit_total", 0) >= 1),
            ("RSS grew too much", peak - rss_before < args.check_rss_mb),
            ("a probe was not answered 200", set(probe_codes) <= {200})] if not ok]
        print("check: " + ("; ".join(failed) if failed else "the bound held"))
        return 1 if failed else 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
