"""Running as a service: API keys, metrics, several models with keep_alive, sd_notify
readiness, draining on SIGTERM, configuration layering, the CLI's model commands."""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest
from conftest import (
    DEFAULT_MODEL,
    ROOT,
    RunningServer,
    free_port,
    start_server,
    stop_server,
    verify_unit,
)
from prometheus_client.parser import text_string_to_metric_families

from edge_server.catalogue.default_model import default_model_path
from edge_server.config import ServeOptions, add_serve_arguments, resolve_options

MSG = [{"role": "user", "content": "Hi"}]


# --- API keys ---------------------------------------------------------------------------

@pytest.fixture(scope="module")
def keyed_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    tmp = tmp_path_factory.mktemp("keys")
    key_file = tmp / "keys.txt"
    key_file.write_text("# one key per line\nsecond-key\n")
    server = start_server(tmp, "--api-key", "first-key", "--api-key-file", str(key_file),
                          "--parallel", "2", "--ctx-size", "2048", name="keys")
    yield server
    stop_server(server)


@pytest.mark.parametrize(("headers", "status"), [
    ({}, 401),
    ({"Authorization": "Bearer wrong-key"}, 401),
    ({"Authorization": "Basic Zmlyc3Qta2V5"}, 401),
    ({"Authorization": "Bearer first-key"}, 200),
    ({"Authorization": "Bearer second-key"}, 200),
])
def test_api_keys(keyed_server: RunningServer, headers: dict, status: int) -> None:
    r = httpx.post(f"{keyed_server.v1}/chat/completions", headers=headers, timeout=60,
                   json={"model": DEFAULT_MODEL, "messages": MSG, "max_tokens": 2})
    assert r.status_code == status, r.text
    if status == 401:
        error = r.json()["error"]
        assert error["code"] == "invalid_api_key"
        assert set(error) == {"message", "type", "param", "code"}


def test_health_is_open_and_models_are_not(keyed_server: RunningServer) -> None:
    assert httpx.get(f"{keyed_server.base_url}/health").status_code == 200
    assert httpx.get(f"{keyed_server.v1}/models").status_code == 401


def test_openai_client_with_key(keyed_server: RunningServer) -> None:
    good = openai.OpenAI(base_url=keyed_server.v1, api_key="second-key", max_retries=0)
    assert good.completions.create(model=DEFAULT_MODEL, prompt="a", max_tokens=1).choices
    bad = openai.OpenAI(base_url=keyed_server.v1, api_key="nope", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        bad.completions.create(model=DEFAULT_MODEL, prompt="a", max_tokens=1)


# --- metrics ------------------------------------------------------------------------------

def scrape(base_url: str) -> dict[tuple[str, tuple], float]:
    text = httpx.get(f"{base_url}/metrics").text
    values = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            values[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return values


def test_metrics_parse_and_move(server: RunningServer) -> None:
    before = scrape(server.base_url)
    r = httpx.post(f"{server.v1}/completions", json={
        "model": DEFAULT_MODEL, "prompt": "Count:", "max_tokens": 5, "ignore_eos": True},
        timeout=60)
    assert r.status_code == 200
    httpx.post(f"{server.v1}/completions", json={"model": "nope", "prompt": "x"})
    after = scrape(server.base_url)

    def delta(name: str, **labels: str) -> float:
        key = (name, tuple(sorted(labels.items())))
        return after.get(key, 0.0) - before.get(key, 0.0)

    assert delta("edge_server_requests_total", endpoint="/v1/completions", status="200") == 1
    assert delta("edge_server_requests_total", endpoint="/v1/completions", status="404") == 1
    model = {"model": DEFAULT_MODEL}
    assert delta("edge_server_completion_tokens_total", **model) == 5
    assert delta("edge_server_prompt_tokens_total", **model) == r.json()["usage"]["prompt_tokens"]
    assert delta("edge_server_time_to_first_token_seconds_count", **model) == 1
    assert delta("edge_server_time_per_output_token_seconds_count", **model) == 1
    assert after[("edge_server_model_loaded", (("model", DEFAULT_MODEL),))] == 1
    # --ctx-size 16384 of the session server: all slots together
    assert after[("edge_server_kv_cache_capacity_tokens", (("model", DEFAULT_MODEL),))] == 16384
    for gauge in ("edge_server_queue_depth", "edge_server_busy_sequences",
                  "edge_server_kv_cache_tokens", "edge_server_model_load_seconds"):
        assert (gauge, (("model", DEFAULT_MODEL),)) in after


# --- several models, keep_alive --------------------------------------------------------------

def test_two_models_and_idle_unload(tmp_path: Path) -> None:
    gguf = default_model_path()
    registry = tmp_path / "registry.toml"
    registry.write_text(
        f'[[models]]\nid = "alpha"\npath = "{gguf}"\nctx_size = 1024\n\n'
        f'[[models]]\nid = "beta"\naliases = ["b"]\npath = "{gguf}"\nctx_size = 1024\n'
        "keep_alive = 1.5\n"
    )
    server = start_server(tmp_path, "--registry", str(registry), "--parallel", "2",
                          "--ctx-size", "2048", name="two")
    try:
        def status() -> dict[str, str]:
            data = httpx.get(f"{server.v1}/models").json()["data"]
            return {m["id"]: m["status"] for m in data}

        def ask(model: str) -> str:
            r = httpx.post(f"{server.v1}/completions", timeout=60, json={
                "model": model, "prompt": "Hello", "max_tokens": 3, "temperature": 0})
            assert r.status_code == 200, r.text
            return r.json()["choices"][0]["text"]

        assert status() == {DEFAULT_MODEL: "loaded", "alpha": "available", "beta": "available"}
        a, b = ask("alpha"), ask("b")
        assert a == b  # the same weights under two ids
        assert status()["beta"] == "loaded" and status()["alpha"] == "loaded"
        deadline = time.monotonic() + 15
        while status()["beta"] == "loaded" and time.monotonic() < deadline:
            time.sleep(0.2)
        assert status()["beta"] == "available"  # unloaded after its 1.5 s keep_alive
        assert status()["alpha"] == "loaded"  # the server default keep_alive is 300 s
        assert ask("beta") == b  # loaded again on demand
        assert status()["beta"] == "loaded"
        metrics = httpx.get(f"{server.base_url}/metrics").text
        assert 'edge_server_model_loaded{model="beta"} 1.0' in metrics
    finally:
        stop_server(server)
    assert "Traceback" not in server.log_text()


def test_unknown_and_missing_models(tmp_path: Path) -> None:
    registry = tmp_path / "registry.toml"
    registry.write_text('[[models]]\nid = "far-away"\nrepo = "org/repo"\nfile = "x.gguf"\n')
    server = start_server(tmp_path, "--registry", str(registry), "--models-dir",
                          str(tmp_path / "models"), "--ctx-size", "1024", name="missing")
    try:
        r = httpx.post(f"{server.v1}/completions", json={"model": "far-away", "prompt": "x"})
        assert r.status_code == 503
        assert "edge-server pull far-away" in r.json()["error"]["message"]
        assert str(tmp_path) not in r.text
        models = {m["id"]: m["status"] for m in httpx.get(f"{server.v1}/models").json()["data"]}
        assert models["far-away"] == "not_downloaded"
    finally:
        stop_server(server)


# --- systemd: readiness and draining ------------------------------------------------------------

def test_ready_notification_after_health(tmp_path: Path) -> None:
    path = tmp_path / "notify.sock"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.bind(str(path))
        sock.settimeout(120)
        server = start_server(tmp_path, "--ctx-size", "1024", name="notify", wait=False,
                              env={"NOTIFY_SOCKET": str(path)})
        try:
            message = sock.recv(4096).decode()
            health = httpx.get(f"{server.base_url}/health", timeout=5)
            assert "READY=1" in message.split("\n")
            assert health.status_code == 200
        finally:
            server.process.send_signal(signal.SIGTERM)
            assert server.process.wait(timeout=30) == 0
            sock.settimeout(5)
            assert "STOPPING=1" in sock.recv(4096).decode()


def test_sigterm_drains_streams_and_exits_zero(tmp_path: Path) -> None:
    server = start_server(tmp_path, "--ctx-size", "1024", name="drain")
    received: list[str] = []
    with httpx.stream("POST", f"{server.v1}/completions", timeout=60, json={
        "model": DEFAULT_MODEL, "prompt": "Once upon a time", "max_tokens": 120,
        "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True}}) as r:
        for line in r.iter_lines():
            if not line.startswith("data: "):
                continue
            received.append(line[6:])
            if len(received) == 3:
                server.process.send_signal(signal.SIGTERM)
            if len(received) == 6:
                # Draining: a load balancer's check fails, new work is refused (to be
                # retried elsewhere), and the stream goes on.
                health = httpx.get(f"{server.base_url}/health", timeout=5)
                assert (health.status_code, health.json()["status"]) == (503, "draining")
                refused = httpx.post(f"{server.v1}/completions", timeout=5, json={
                    "model": DEFAULT_MODEL, "prompt": "a", "max_tokens": 1})
                assert refused.status_code == 503 and refused.headers["retry-after"]
                assert refused.json()["error"]["code"] == "draining"
                port = server.base_url.rsplit(":", 1)[1]
                assert refused.headers["x-edge-replica"].endswith(f":{port}")  # hostname:port
    assert received[-1] == "[DONE]"
    chunks = [json.loads(x) for x in received[:-1]]
    assert chunks[-2]["choices"][0]["finish_reason"] == "length"
    assert chunks[-1]["usage"]["completion_tokens"] == 120
    assert server.process.wait(timeout=30) == 0
    with pytest.raises(httpx.ConnectError):
        httpx.get(f"{server.base_url}/health", timeout=2)


@pytest.mark.skipif(shutil.which("systemd-analyze") is None,
                    reason="systemd-analyze is not installed (.ci/run installs it)")
def test_systemd_unit_verifies(tmp_path: Path) -> None:
    verify_unit(tmp_path, "edge-server.service", "/opt/edge-server/.venv/bin/edge-server")


# --- configuration ----------------------------------------------------------------------------

def test_config_precedence(tmp_path: Path) -> None:
    config = tmp_path / "edge.toml"
    config.write_text('port = 9001\nhost = "0.0.0.0"\nparallel = 3\nkeep-alive = 10\n')
    parser = argparse.ArgumentParser()
    add_serve_arguments(parser)
    flags = parser.parse_args(["--config", str(config), "--parallel", "5"])
    env = {"EDGE_SERVER_PORT": "9002", "EDGE_SERVER_API_KEY": "a,b"}
    opts = resolve_options(flags, env)
    assert opts.host == "0.0.0.0"  # file
    assert opts.port == 9002  # environment beats file
    assert opts.parallel == 5  # flag beats file
    assert opts.keep_alive == 10.0
    assert opts.api_keys() == ["a", "b"]
    assert resolve_options(parser.parse_args([]), {}).port == 8080  # default
    bad = tmp_path / "bad.toml"
    bad.write_text("portt = 1\n")
    with pytest.raises(ValueError, match="portt"):
        resolve_options(parser.parse_args(["--config", str(bad)]), {})


def test_serve_help_documents_every_option() -> None:
    out = subprocess.run([sys.executable, "-m", "edge_server", "serve", "--help"],
                         capture_output=True, text=True, cwd=ROOT).stdout
    for f in dataclasses.fields(ServeOptions):
        assert "--" + f.name.replace("_", "-") in out
        assert "EDGE_SERVER_" + f.name.upper() in out


def test_models_and_info_commands(tmp_path: Path) -> None:
    env = {**os.environ, "EDGE_SERVER_MODELS_DIR": str(tmp_path)}
    models = subprocess.run([sys.executable, "-m", "edge_server", "models"], env=env,
                            capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert models.returncode == 0, models.stderr
    line = next(x for x in models.stdout.splitlines() if x.startswith(DEFAULT_MODEL))
    assert "present" in line and "Q8_0" in line  # the conversion served (default_conversion.py)
    info = subprocess.run([sys.executable, "-m", "edge_server", "info"], env=env,
                          capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert info.returncode == 0, info.stderr
    assert "CPU features:" in info.stdout and "backends: CPU" in info.stdout


def test_port_in_use_is_a_clear_failure(tmp_path: Path) -> None:
    port = free_port()
    with socket.socket() as blocker:
        blocker.bind(("127.0.0.1", port))
        blocker.listen()
        proc = subprocess.run(
            [sys.executable, "-m", "edge_server", "serve", "--port", str(port),
             "--ctx-size", "512"], capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert proc.returncode != 0


def test_bad_replica_name_is_a_clear_failure(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "edge_server", "serve", "--port", str(free_port()),
         "--replica-name", "two words"], capture_output=True, text=True, cwd=ROOT,
        timeout=60, env={**os.environ, "XDG_DATA_HOME": str(tmp_path)})
    assert proc.returncode == 2
    assert "replica name" in proc.stderr
