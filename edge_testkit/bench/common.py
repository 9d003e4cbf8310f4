"""What the benchmark scripts share: ports, a server's memory, starting edge_server and
waiting until it answers."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import httpx

from edge_testkit import ROOT

# Shared with the soak scripts; the bench scripts import them from here.
from edge_testkit.measure import round_order as round_order
from edge_testkit.measure import rss_mib as rss_mib
from edge_testkit.servers.process import free_port as free_port


def memory_parts(base_url: str) -> dict[str, int]:
    """An edge_server's /health memory account (keyless server): each part in bytes."""
    memory = httpx.get(f"{base_url}/health", timeout=30).json().get("memory", {})
    return {part: size for part, size in memory.items() if isinstance(size, int)}


def wait_ready(proc: subprocess.Popen[bytes], url: str, *, timeout: float = 120.0,
               what: str = "the server") -> None:
    """Until `url` answers 200; RuntimeError if the process exits or time runs out."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited at start")
        try:
            if httpx.get(url, timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise RuntimeError(f"{what} was not ready in {timeout:.0f} s")


def start_edge_server(args: list[str], *, env: dict[str, str], log: Path | None = None
                      ) -> tuple[subprocess.Popen[bytes], str]:
    """`edge-server serve ARGS` on a free port, healthy: (process, base URL)."""
    port = free_port()
    out = log.open("wb") if log is not None else subprocess.DEVNULL
    proc = subprocess.Popen(
        [sys.executable, "-m", "edge_server", "serve", "--port", str(port), *args],
        cwd=ROOT, stdout=out, stderr=subprocess.STDOUT, env=env)
    base = f"http://127.0.0.1:{port}"
    wait_ready(proc, f"{base}/health", what="edge_server")
    return proc, base
