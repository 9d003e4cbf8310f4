"""Starts the real server (uvicorn on 127.0.0.1) on the real default model, once per run."""

from __future__ import annotations

import math
import subprocess
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

# Tests import these from here (`from conftest import ...`); they live in edge_testkit,
# which the scripts share.
from edge_testkit import ROOT as ROOT
from edge_testkit.models.cache import arch_model as arch_model
from edge_testkit.models.cache import llama_sources as llama_sources
from edge_testkit.models.cache import vocab_model as vocab_model
from edge_testkit.models.cache import write_test_audio_projector as write_test_audio_projector
from edge_testkit.models.cache import write_test_projector as write_test_projector
from edge_testkit.models.cache import write_test_reranker as write_test_reranker
from edge_testkit.servers.process import DEFAULT_MODEL as DEFAULT_MODEL
from edge_testkit.servers.process import THREADS_ENV as THREADS_ENV
from edge_testkit.servers.process import RunningServer as RunningServer
from edge_testkit.servers.process import free_port as free_port
from edge_testkit.servers.process import loopback_url as loopback_url
from edge_testkit.servers.process import start_server as start_server
from edge_testkit.servers.process import stop_server as stop_server
from edge_testkit.servers.process import until as until
from edge_testkit.servers.process import wait_healthy as wait_healthy

JSON_MESSAGES = [
    {"role": "system", "content": "Answer with compact JSON only."},
    {"role": "user", "content": "Give an example record."},
]


def assert_independent_draws(texts: list[str], logprob_sums: list[float]) -> None:
    """Choices drawn independently at temperature 1.0 (no other sampler) are all equal only
    by chance: given the first, with probability p**(k-1), p being its probability under
    the model (the sum of its token logprobs). Fail only where that chance was below one
    in a million, whatever words the model prefers."""
    if len(set(texts)) > 1:
        return
    chance = (len(texts) - 1) * logprob_sums[0]
    assert chance > math.log(1e-6), f"{len(texts)} identical draws, chance e^{chance:.1f}"


@pytest.fixture(scope="session")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    running = start_server(
        # 4 slots sharing 4,096 KV cells: one request may use a 4,096-token context.
        tmp_path_factory.mktemp("server"), "--parallel", "4", "--ctx-size", "4096"
    )
    yield running
    stop_server(running)
    assert "Traceback" not in running.log_text(), running.log_text()


@pytest.fixture(scope="session")
def drafting(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    """A server that drafts wherever a lookup has a guess (`--draft-min 1`), whatever the
    step cost measured at its start says: on a busy machine that cost may say drafts
    never pay, and the tests of what drafting keeps need drafts to happen."""
    running = start_server(tmp_path_factory.mktemp("drafting"), "--parallel", "4",
                           "--ctx-size", "4096", "--draft-min", "1", name="drafting")
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
