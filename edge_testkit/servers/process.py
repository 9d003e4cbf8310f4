"""A real edge_server process (uvicorn on 127.0.0.1) started from the checkout, as the test
suite and the soak and fuzz scripts run it; waited on until healthy, stopped at the end."""

from __future__ import annotations

import os
import resource
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

import httpx

from edge_testkit import ROOT

DEFAULT_MODEL = "smollm2-135m-instruct"
# The suite must hold for any thread count (llama.cpp's numerics depend on it): set
# EDGE_TEST_THREADS=1 to run every test server single-threaded.
THREADS_ENV = "EDGE_TEST_THREADS"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class RunningServer:
    base_url: str
    process: subprocess.Popen[bytes]
    log_path: Path

    @property
    def v1(self) -> str:
        return f"{self.base_url}/v1"

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace")


def start_server(
    tmp: Path,
    *args: str,
    name: str = "server",
    env: dict[str, str] | None = None,
    wait: bool = True,
    memory_limit_mb: int | None = None,
    port: int | None = None,
) -> RunningServer:
    """`memory_limit_mb` caps the server's address space, so that a request which makes it
    allocate without bound fails that server instead of the machine's other processes.
    `port`: a given one (a replica restarted where its load balancer expects it)."""
    port = port or free_port()
    log_path = tmp / f"{name}-{port}.log"
    threads = os.environ.get(THREADS_ENV)
    if threads and "--threads" not in args:
        args = (*args, "--threads", threads)
    cmd = [sys.executable, "-m", "edge_server", "serve", "--port", str(port), *args]
    limit = None if memory_limit_mb is None else memory_limit_mb * 1024 * 1024
    process = subprocess.Popen(
        cmd,
        cwd=ROOT,
        stdout=log_path.open("wb"),
        stderr=subprocess.STDOUT,
        # Pulled models and saved prompt caches stay inside the test's directory.
        env={**os.environ, "XDG_DATA_HOME": str(tmp / "data"), **(env or {})},
        preexec_fn=None if limit is None else lambda: _limit_memory(limit),
    )
    server = RunningServer(f"http://127.0.0.1:{port}", process, log_path)
    if wait:
        wait_healthy(server)
    return server


def _limit_memory(limit: int) -> None:
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))


def wait_healthy(server: RunningServer, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if server.process.poll() is not None:
            raise RuntimeError(f"server exited early:\n{server.log_text()}")
        try:
            if httpx.get(f"{server.base_url}/health", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise RuntimeError(f"server not healthy in {timeout}s:\n{server.log_text()}")


def until(condition: Callable[[], object], seconds: float = 10.0) -> bool:
    """Whether `condition` came true within `seconds` (polled)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.05)
    return False


def stop_server(server: RunningServer) -> int:
    server.process.terminate()
    try:
        return server.process.wait(timeout=30)
    except subprocess.TimeoutExpired:
        server.process.kill()
        return server.process.wait()


def loopback_url(url: str) -> str:
    """A campaign's --base-url: only a server on this machine may be sent its traffic."""
    if urlsplit(url).hostname != "127.0.0.1":
        raise SystemExit("--base-url must point at 127.0.0.1")
    return url.rstrip("/")
