"""What the benchmark scripts share: ports, a server's memory, starting edge_server and
waiting until it answers."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import TypeVar

import httpx

ROOT = Path(__file__).resolve().parent.parent
T = TypeVar("T")


def round_order(r: int, items: list[T]) -> list[T]:
    """What runs in round r: in order on even rounds, reversed on odd ones, so a drift
    of the machine's speed over a run hits every side alike."""
    return items if r % 2 == 0 else list(reversed(items))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def rss_mib(pid: int) -> float:
    """Resident memory of a process (Linux), in MiB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


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
