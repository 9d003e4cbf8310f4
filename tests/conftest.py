"""Starts the real server (uvicorn on 127.0.0.1) on the real default model, once per run."""

from __future__ import annotations

import hashlib
import json
import math
import os
import resource
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_MODEL = "smollm2-135m-instruct"
# A chat that asks for JSON: the structured-output and tool-call tests send it.
JSON_MESSAGES = [
    {"role": "system", "content": "Answer with compact JSON only."},
    {"role": "user", "content": "Give an example record."},
]
# The suite must hold for any thread count (llama.cpp's numerics depend on it): set
# EDGE_TEST_THREADS=1 to run every test server single-threaded.
THREADS_ENV = "EDGE_TEST_THREADS"


def assert_independent_draws(texts: list[str], logprob_sums: list[float]) -> None:
    """Choices drawn independently at temperature 1.0 (no other sampler) are all equal only
    by chance: given the first, with probability p**(k-1), p being its probability under
    the model (the sum of its token logprobs). Fail only where that chance was below one
    in a million, whatever words the model prefers."""
    if len(set(texts)) > 1:
        return
    chance = (len(texts) - 1) * logprob_sums[0]
    assert chance > math.log(1e-6), f"{len(texts)} identical draws, chance e^{chance:.1f}"


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
    process = subprocess.Popen(
        cmd,
        cwd=ROOT,
        stdout=log_path.open("wb"),
        stderr=subprocess.STDOUT,
        # Pulled models and saved prompt caches stay inside the test's directory.
        env={**os.environ, "XDG_DATA_HOME": str(tmp / "data"), **(env or {})},
        preexec_fn=None if memory_limit_mb is None else lambda: _limit_memory(memory_limit_mb),
    )
    server = RunningServer(f"http://127.0.0.1:{port}", process, log_path)
    if wait:
        wait_healthy(server)
    return server


def _limit_memory(megabytes: int) -> None:
    limit = megabytes * 1024 * 1024
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


@pytest.fixture(scope="session")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    running = start_server(
        # 4 slots sharing 4,096 KV cells: one request may use a 4,096-token context.
        tmp_path_factory.mktemp("server"), "--parallel", "4", "--ctx-size", "4096"
    )
    yield running
    stop_server(running)
    assert "Traceback" not in running.log_text(), running.log_text()


@pytest.fixture()
def http(server: RunningServer) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=server.base_url, timeout=60) as client:
        yield client


@pytest.fixture()
def client(server: RunningServer):  # type: ignore[no-untyped-def]
    import openai

    with openai.OpenAI(base_url=server.v1, api_key="unused", max_retries=0) as c:
        yield c


@pytest.fixture()
def async_client(server: RunningServer):  # type: ignore[no-untyped-def]
    import openai

    return openai.AsyncOpenAI(base_url=server.v1, api_key="unused", max_retries=0)


def loopback_url(url: str) -> str:
    """A campaign's --base-url: only a server on this machine may be sent its traffic."""
    from urllib.parse import urlsplit

    if urlsplit(url).hostname != "127.0.0.1":
        raise SystemExit("--base-url must point at 127.0.0.1")
    return url.rstrip("/")


def verify_unit(tmp: Path, unit: str, executable: str, env_files: tuple[str, ...] = ()) -> None:
    """`systemd-analyze verify` of systemd/<unit> in a scratch root laid out as the install
    (its ExecStart `executable` and EnvironmentFiles from systemd/ under /etc/edge-server,
    the system's own units for the dependencies); asserts it finds no problem."""
    import shutil

    root = tmp / "root"
    exe = root / executable.lstrip("/")
    exe.parent.mkdir(parents=True)
    exe.write_text("#!/bin/sh\n")
    exe.chmod(0o755)
    shutil.copytree("/usr/lib/systemd/system", root / "usr/lib/systemd/system", symlinks=True)
    (root / "etc/edge-server").mkdir(parents=True)
    for name in env_files:
        shutil.copy(ROOT / "systemd" / name, root / "etc/edge-server")
    unit_dir = root / "etc/systemd/system"
    unit_dir.mkdir(parents=True)
    shutil.copy(ROOT / "systemd" / unit, unit_dir)
    result = subprocess.run(["systemd-analyze", "verify", f"--root={root}", str(unit_dir / unit)],
                            capture_output=True, text=True, timeout=60)
    problems = [line for line in (result.stdout + result.stderr).splitlines() if unit in line]
    assert result.returncode == 0 and not problems, result.stdout + result.stderr


def load_script(name: str) -> Any:
    """One of scripts/make_test_*.py as a module: the test models are written by the same
    code a person runs by hand."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(name, ROOT / "scripts" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    return script


def llama_sources() -> Path:
    """`vendor/llama.cpp` of the installed llama-cpp-python's sdist (real chat templates,
    test-chat.cpp, real tokenizers), downloaded once into a cache by
    scripts/llama_sources.py."""
    return load_script("llama_sources").vendor_dir()  # type: ignore[no-any-return]


def vocab_model(vocab: str, *, add_control: tuple[str, ...] = (),
                add_user: tuple[str, ...] = (), template: str | None = None,
                template_fix: tuple[str, str] | None = None) -> Path:
    """A tiny random model with the real tokenizer `models/ggml-vocab-<vocab>.gguf` of
    llama.cpp's sources (scripts/make_test_vocab_model.py), its markers added as control
    (or user-defined) tokens and `template` (a name under models/templates) as its chat
    template, with `template_fix` (old, new) replaced in it. Built once into a cache
    outside the checkout, keyed by everything that goes into it (the script's code
    included)."""
    sources = llama_sources()
    script = ROOT / "scripts" / "make_test_vocab_model.py"
    template_text = (sources / "models" / "templates" / template).read_text() \
        if template is not None else None
    if template_text is not None and template_fix is not None:
        assert template_fix[0] in template_text, template_fix
        template_text = template_text.replace(*template_fix)
    key = hashlib.sha256(json.dumps(
        [vocab, add_control, add_user, template_text, script.read_text()]).encode()
    ).hexdigest()[:16]
    out = sources.parent / "test-models" / f"{vocab}-{key}.gguf"
    if not out.exists():
        out.parent.mkdir(parents=True, exist_ok=True)
        partial = out.with_suffix(f".{os.getpid()}.part")  # test processes may race
        load_script("make_test_vocab_model").write_model(
            sources / "models" / f"ggml-vocab-{vocab}.gguf", partial,
            add_control=add_control, add_user=add_user, chat_template=template_text)
        partial.replace(out)
    return out


def arch_model(arch: str, vocab: str = "phi-3") -> Path:
    """A tiny random model of llama.cpp architecture `arch` (qwen35, lfm2, nemotron_h,
    granitehybrid, mamba2, qwen3moe, gemma3: scripts/make_test_arch_model.py) with the
    real tokenizer and chat template of `models/ggml-vocab-<vocab>.gguf`, built once
    into the same cache as vocab_model's, keyed by the scripts' code."""
    sources = llama_sources()
    scripts = [ROOT / "scripts" / name for name in (
        "make_test_arch_model.py", "make_test_vocab_model.py", "gguf_test_weights.py")]
    key = hashlib.sha256(json.dumps(
        [arch, vocab, *(path.read_text() for path in scripts)]).encode()).hexdigest()[:16]
    out = sources.parent / "test-models" / f"{arch}-{vocab}-{key}.gguf"
    if not out.exists():
        out.parent.mkdir(parents=True, exist_ok=True)
        partial = out.with_suffix(f".{os.getpid()}.part")  # test processes may race
        load_script("make_test_arch_model").write_model(
            arch, sources / "models" / f"ggml-vocab-{vocab}.gguf", partial)
        partial.replace(out)
    return out


def write_test_projector(path: Path, **kwargs: object) -> Path:
    """The tiny random multimodal projector of scripts/make_test_projector.py (test-only;
    its keyword arguments write broken files on purpose)."""
    return load_script("make_test_projector").write_projector(path, **kwargs)  # type: ignore[no-any-return]


def write_test_reranker(path: Path, **kwargs: object) -> Path:
    """The tiny random BERT reranker of scripts/make_test_reranker.py (test-only)."""
    return load_script("make_test_reranker").write_reranker(path, **kwargs)  # type: ignore[no-any-return]


def agree_up_to_near_ties(a: dict, b: dict) -> None:
    """Greedy tokens match until a split that the first run saw as a near tie (llama.cpp's
    numerics depend on how a sequence's KV was computed: batch shapes, copies)."""
    la, lb = a["choices"][0]["logprobs"], b["choices"][0]["logprobs"]
    for k, (ta, tb) in enumerate(zip(la["tokens"], lb["tokens"], strict=False)):
        if ta != tb:
            top = sorted(la["top_logprobs"][k].values(), reverse=True)
            assert len(top) > 1 and top[0] - top[1] < 0.5, (k, ta, tb, top)
            return
        assert abs(la["token_logprobs"][k] - lb["token_logprobs"][k]) < 0.5
