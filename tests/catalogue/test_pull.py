"""Pulling models through huggingface-hub from a local stand-in of the Hub, then serving
them; corrupted downloads and checksum mismatches are refused; offline behaviour."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from conftest import ROOT, start_server, stop_server, write_test_projector

from edge_server.catalogue.default_model import default_model_path
from edge_testkit.servers.local_hub import LocalHub

REPO, FILE = "edge-test/tiny-chat-GGUF", "tiny-chat.Q4_1.gguf"
MMPROJ = "mmproj-tiny.gguf"


@pytest.fixture(scope="module")
def gguf_bytes() -> bytes:
    return default_model_path().read_bytes()


@pytest.fixture(scope="module")
def projector_bytes(tmp_path_factory: pytest.TempPathFactory) -> bytes:
    return write_test_projector(tmp_path_factory.mktemp("mmproj") / "p.gguf").read_bytes()


@pytest.fixture()
def hub(gguf_bytes: bytes, projector_bytes: bytes) -> Iterator[LocalHub]:
    files = {(REPO, FILE): gguf_bytes, ("edge-test/broken", FILE): gguf_bytes,
             (REPO, MMPROJ): projector_bytes}
    with LocalHub(files, corrupt={("edge-test/broken", FILE)}) as running:
        yield running


def hub_env(hub: LocalHub, tmp: Path, **extra: str) -> dict[str, str]:
    return {**os.environ, "HF_ENDPOINT": hub.endpoint, "HF_HOME": str(tmp / "hf"),
            "HF_HUB_DISABLE_XET": "1", "HF_HUB_DISABLE_TELEMETRY": "1",
            "EDGE_SERVER_MODELS_DIR": str(tmp / "models"), **extra}


def pull(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "edge_server", "pull", *args], env=env,
                          cwd=ROOT, capture_output=True, text=True, timeout=300)


def test_pull_verifies_and_serves(hub: LocalHub, gguf_bytes: bytes, tmp_path: Path) -> None:
    env = hub_env(hub, tmp_path)
    done = pull(env, REPO, FILE)
    assert done.returncode == 0, done.stderr
    path = tmp_path / "models" / REPO / FILE
    assert Path(done.stdout.strip()) == path
    assert hashlib.sha256(path.read_bytes()).digest() == hashlib.sha256(gguf_bytes).digest()
    assert any(method == "GET" for method, _, _ in hub.requests)

    registry = tmp_path / "registry.toml"
    registry.write_text(f'[[models]]\nid = "tiny"\nrepo = "{REPO}"\nfile = "{FILE}"\n'
                        f'sha256 = "{hashlib.sha256(gguf_bytes).hexdigest()}"\n')
    # Served fully offline: the hub is not asked again.
    asked = len(hub.requests)
    server = start_server(tmp_path, "--registry", str(registry), "--ctx-size", "1024",
                          name="pulled", env={"HF_HUB_OFFLINE": "1",
                                              "EDGE_SERVER_MODELS_DIR": str(tmp_path / "models")})
    try:
        r = httpx.post(f"{server.v1}/chat/completions", timeout=60, json={
            "model": "tiny", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 3})
        assert r.status_code == 200, r.text
        listing = subprocess.run([sys.executable, "-m", "edge_server", "models", "--registry",
                                  str(registry)], env=env, cwd=ROOT, capture_output=True,
                                 text=True, timeout=60).stdout
        assert any(line.startswith("tiny") and "present" in line for line in listing.splitlines())
    finally:
        stop_server(server)
    assert len(hub.requests) == asked


def test_registry_id_pull_with_checksum(hub: LocalHub, gguf_bytes: bytes,
                                        tmp_path: Path) -> None:
    registry = tmp_path / "registry.toml"
    good = hashlib.sha256(gguf_bytes).hexdigest()
    registry.write_text(
        f'[[models]]\nid = "tiny"\nrepo = "{REPO}"\nfile = "{FILE}"\nsha256 = "{good}"\n\n'
        f'[[models]]\nid = "wrong-sum"\nrepo = "{REPO}"\nfile = "{FILE}"\n'
        f'sha256 = "{"0" * 64}"\n')
    env = hub_env(hub, tmp_path, EDGE_SERVER_REGISTRY=str(registry))
    assert pull(env, "tiny").returncode == 0
    refused = pull(env, "wrong-sum")
    assert refused.returncode == 1
    assert "checksum mismatch" in refused.stderr
    assert not (tmp_path / "models" / REPO / FILE).exists()  # the bad file is deleted


def test_pull_fetches_the_projector_with_its_model(hub: LocalHub, tmp_path: Path) -> None:
    registry = tmp_path / "registry.toml"
    registry.write_text(f'[[models]]\nid = "tiny-vision"\nrepo = "{REPO}"\nfile = "{FILE}"\n'
                        f'mmproj = "{MMPROJ}"\n')
    env = hub_env(hub, tmp_path, EDGE_SERVER_REGISTRY=str(registry))
    done = pull(env, "tiny-vision")
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "models" / REPO / MMPROJ).is_file()
    listing = subprocess.run([sys.executable, "-m", "edge_server", "models"], env=env,
                             cwd=ROOT, capture_output=True, text=True, timeout=60).stdout
    line = next(x for x in listing.splitlines() if x.startswith("tiny-vision"))
    assert "present" in line and "reads text, image" in line


def test_corrupted_download_is_refused(hub: LocalHub, tmp_path: Path) -> None:
    refused = pull(hub_env(hub, tmp_path), "edge-test/broken", FILE)
    assert refused.returncode == 1
    assert "checksum mismatch" in refused.stderr
    assert not (tmp_path / "models" / "edge-test/broken" / FILE).exists()


def test_dropped_download_resumes_from_where_it_stopped(gguf_bytes: bytes,
                                                       tmp_path: Path) -> None:
    """A connection lost mid-download resumes with a Range request, not from zero."""
    with LocalHub({(REPO, FILE): gguf_bytes}, interrupt={(REPO, FILE)}) as hub:
        done = pull(hub_env(hub, tmp_path), REPO, FILE)
    assert done.returncode == 0, done.stderr
    gets = [rng for method, _, rng in hub.requests if method == "GET"]
    assert gets[0] is None and len(gets) == 2
    assert gets[1] is not None and gets[1].startswith("bytes=")
    assert int(gets[1][6:].rstrip("-")) > 0
    assert (tmp_path / "models" / REPO / FILE).read_bytes() == gguf_bytes


def test_offline_missing_model_is_a_clear_message(tmp_path: Path) -> None:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf"),
           "EDGE_SERVER_MODELS_DIR": str(tmp_path / "models")}
    refused = pull(env, REPO, FILE)
    assert refused.returncode == 1
    assert "offline" in refused.stderr
    assert "Traceback" not in refused.stderr
