"""Three replicas behind HAProxy (systemd/haproxy/edge-server.cfg) on 127.0.0.1: a key
keeps a conversation on one replica, keys spread, SIGKILL costs only what was in flight,
SIGTERM drains without losing a stream and takes no new request."""

from __future__ import annotations

import csv
import io
import json
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest
from conftest import ROOT, RunningServer, free_port, start_server, wait_healthy

pytestmark = pytest.mark.skipif(
    shutil.which("haproxy") is None,
    reason="haproxy is not installed (.ci/run installs it: apt-get install haproxy)")

REPLICAS = ("r1", "r2", "r3")
# A shared system prompt long enough that a cached prefix shows in usage.
SYSTEM = ("You are a careful assistant for a small bookshop. Answer briefly and politely, "
          "recommend only books that are in stock, and never invent prices.")
# Small replicas: two slots each, one thread each (three share this machine's cores);
# a drain that a busy machine slows down still ends well inside its timeout.
REPLICA_ARGS = ("--parallel", "2", "--ctx-size", "4096", "--threads", "1",
                "--drain-timeout", "60")


@dataclass
class Cluster:
    tmp: Path
    url: str
    stats_url: str
    replicas: dict[str, RunningServer] = field(default_factory=dict)

    def restart(self, name: str) -> None:
        """Brings a stopped replica back on its port, and waits until HAProxy uses it."""
        port = int(self.replicas[name].base_url.rsplit(":", 1)[1])
        self.replicas[name] = _start_replica(self.tmp, name, port)
        wait_healthy(self.replicas[name])
        wait_for_state(self, name, "UP")

    def states(self) -> dict[str, str]:
        """HAProxy's view of each replica: UP, DOWN, ... (from the stats page's CSV)."""
        text = httpx.get(f"{self.stats_url}/;csv", timeout=5).text.lstrip("# ")
        return {row["svname"]: row["status"] for row in csv.DictReader(io.StringIO(text))
                if row["pxname"] == "replicas" and row["svname"].startswith("replica")}


def _start_replica(tmp: Path, name: str, port: int | None = None) -> RunningServer:
    log_name = name if port is None else f"{name}-again"  # keeps the first run's log
    return start_server(tmp, *REPLICA_ARGS, "--replica-name", name, name=log_name,
                        wait=False, port=port)


def wait_for_state(cluster: Cluster, name: str, state: str, timeout: float = 30) -> None:
    server = f"replica{REPLICAS.index(name) + 1}"
    deadline = time.monotonic() + timeout
    while cluster.states().get(server) != state:
        assert time.monotonic() < deadline, f"{name} not {state}: {cluster.states()}"
        time.sleep(0.2)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    tmp = tmp_path_factory.mktemp("replicas")
    servers = {name: _start_replica(tmp, name) for name in REPLICAS}
    for server in servers.values():
        wait_healthy(server)
    port, stats_port = free_port(), free_port()
    config = tmp / "haproxy.cfg"
    replica_args = [a for s in servers.values()
                    for a in ("--replica", s.base_url.removeprefix("http://"))]
    # The repository's configuration, with this test's addresses.
    config.write_text(subprocess.run(
        [sys.executable, "scripts/deploy/haproxy_config.py", "--listen", f"127.0.0.1:{port}",
         "--stats", f"127.0.0.1:{stats_port}", "--foreground", *replica_args],
        cwd=ROOT, capture_output=True, text=True, check=True).stdout)
    log = tmp / "haproxy.log"
    proxy = subprocess.Popen(["haproxy", "-db", "-f", str(config)], stdout=log.open("wb"),
                             stderr=subprocess.STDOUT)
    running = Cluster(tmp, f"http://127.0.0.1:{port}", f"http://127.0.0.1:{stats_port}",
                      servers)
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                if set(running.states().values()) == {"UP"}:
                    break
            except httpx.HTTPError:
                pass
            assert proxy.poll() is None, log.read_text()
            assert time.monotonic() < deadline, "HAProxy never saw the replicas up"
            time.sleep(0.2)
        yield running
    finally:
        proxy.terminate()
        proxy.wait(timeout=10)
        for server in running.replicas.values():
            if server.process.poll() is None:
                server.process.terminate()
                server.process.wait(timeout=30)


def chat(cluster: Cluster, content: str, max_tokens: int = 2, headers: dict | None = None,
         **fields: object) -> httpx.Response:
    body = {"model": "default", "max_tokens": max_tokens, **fields,
            "messages": [{"role": "system", "content": SYSTEM},
                         {"role": "user", "content": content}]}
    return httpx.post(f"{cluster.url}/v1/chat/completions", json=body, headers=headers,
                      timeout=60)


def replica_of(r: httpx.Response) -> str:
    assert r.status_code == 200, r.text
    return r.headers["x-edge-replica"]


@pytest.mark.parametrize("carrier", ["prompt_cache_key", "user", "X-Session-Id"])
def test_same_key_same_replica_with_cached_prefix(cluster: Cluster, carrier: str) -> None:
    key = f"conversation-{carrier}"
    kwargs: dict = ({"headers": {"X-Session-Id": key}} if carrier == "X-Session-Id"
                    else {carrier: key})
    first = chat(cluster, f"Which novels by Jane Austen do you have? ({carrier})", **kwargs)
    second = chat(cluster, f"Which novels by Jane Austen do you have? ({carrier})", **kwargs)
    assert replica_of(first) == replica_of(second)
    usage = second.json()["usage"]
    assert usage["prompt_tokens_details"]["cached_tokens"] >= usage["prompt_tokens"] // 2


def test_prompt_cache_key_wins_over_user_and_header(cluster: Cluster) -> None:
    alone = replica_of(chat(cluster, "a", prompt_cache_key="k-42"))
    for i in range(4):
        mixed = chat(cluster, "a", prompt_cache_key="k-42", user=f"u-{i}",
                     headers={"X-Session-Id": f"s-{i}"})
        assert replica_of(mixed) == alone


def test_different_keys_use_several_replicas(cluster: Cluster) -> None:
    used = {replica_of(chat(cluster, "Hello", prompt_cache_key=f"key-{i}")) for i in range(10)}
    assert len(used) >= 2, used


def test_prompt_cache_key_is_bounded(cluster: Cluster) -> None:
    r = chat(cluster, "Hello", prompt_cache_key="k" * 1025)
    assert r.status_code == 400
    assert r.json()["error"]["param"] == "prompt_cache_key"
    assert r.headers["x-edge-replica"] in REPLICAS  # errors name their replica too


@dataclass
class Stream:
    """One streamed completion read on a thread: its replica, chunks, and how it ended."""

    cluster: Cluster
    key: str
    max_tokens: int
    replica: str | None = None
    chunks: list[str] = field(default_factory=list)
    error: str | None = None
    first_chunk: threading.Event = field(default_factory=threading.Event)

    def run(self) -> None:
        body = {"model": "default", "prompt": f"A story about {self.key}:", "stream": True,
                "max_tokens": self.max_tokens, "ignore_eos": True,
                "stream_options": {"include_usage": True}}
        try:
            with httpx.stream("POST", f"{self.cluster.url}/v1/completions", json=body,
                              headers={"X-Session-Id": self.key}, timeout=60) as r:
                self.replica = r.headers.get("x-edge-replica")
                for line in r.iter_lines():
                    if line.startswith("data: "):
                        self.chunks.append(line[6:])
                        self.first_chunk.set()
        except httpx.HTTPError as exc:
            self.error = repr(exc)
        self.first_chunk.set()

    @property
    def complete(self) -> bool:
        if self.error or not self.chunks or self.chunks[-1] != "[DONE]":
            return False
        usage = json.loads(self.chunks[-2])["usage"]
        return usage["completion_tokens"] == self.max_tokens


def start_streams(cluster: Cluster, key: str, count: int, max_tokens: int
                  ) -> tuple[list[Stream], list[threading.Thread]]:
    streams = [Stream(cluster, key, max_tokens) for _ in range(count)]
    threads = [threading.Thread(target=s.run, daemon=True) for s in streams]
    for t in threads:
        t.start()
    return streams, threads


def in_flight(server: RunningServer) -> float:
    text = httpx.get(f"{server.base_url}/metrics", timeout=5).text
    line = next(x for x in text.splitlines()
                if x.startswith("edge_server_requests_in_flight "))
    return float(line.split()[1])


def key_for(cluster: Cluster, name: str) -> str:
    """An X-Session-Id that HAProxy sends to replica `name`."""
    for i in range(200):
        r = chat(cluster, "Hi", max_tokens=1, headers={"X-Session-Id": f"s-{i}"})
        if replica_of(r) == name:
            return f"s-{i}"
    raise AssertionError(f"no key lands on {name}")


def test_sigkill_costs_only_requests_in_flight(cluster: Cluster) -> None:
    victim = "r1"
    key = key_for(cluster, victim)
    streams, threads = start_streams(cluster, key, 2, max_tokens=400)
    for s in streams:
        assert s.first_chunk.wait(30)
    cluster.replicas[victim].process.send_signal(signal.SIGKILL)
    try:
        # At once, before HAProxy's checks notice: the dead replica's own key included.
        for i in range(6):
            headers = {"X-Session-Id": key if i % 2 == 0 else f"other-{i}"}
            assert replica_of(chat(cluster, "Hi", headers=headers)) != victim
        for t in threads:
            t.join(30)
        assert all(s.replica == victim and not s.complete for s in streams)
        wait_for_state(cluster, victim, "DOWN")
        assert replica_of(chat(cluster, "Hi", headers={"X-Session-Id": key})) != victim
    finally:
        cluster.replicas[victim].process.wait(timeout=10)
        cluster.restart(victim)


def test_sigterm_drains_streams_and_takes_no_new_requests(cluster: Cluster) -> None:
    target = "r2"
    server = cluster.replicas[target]
    key = key_for(cluster, target)
    streams, threads = start_streams(cluster, key, 8, max_tokens=48)
    deadline = time.monotonic() + 30
    while in_flight(server) < 8:  # all eight reached the replica (two decode, six queue)
        assert time.monotonic() < deadline, "the streams never reached the replica"
        time.sleep(0.05)
    server.process.send_signal(signal.SIGTERM)
    try:
        # New requests, with the draining replica's own key too, go elsewhere at once.
        served: list[str] = []
        while server.process.poll() is None:
            served.append(replica_of(chat(cluster, "Hi", headers={"X-Session-Id": key})))
            served.append(replica_of(chat(cluster, "Hi", prompt_cache_key=f"n-{len(served)}")))
            time.sleep(0.2)  # leaves the shared cores to the streams being drained
        assert served and target not in served, served
        for t in threads:
            t.join(60)
        assert all(s.replica == target for s in streams)
        assert all(s.complete for s in streams), [s.error or s.chunks[-3:] for s in streams]
        assert server.process.wait(timeout=60) == 0
        assert "Traceback" not in server.log_text()
        wait_for_state(cluster, target, "DOWN")
    finally:
        cluster.restart(target)


def test_repository_configuration_is_valid() -> None:
    check = subprocess.run(["haproxy", "-c", "-f", "systemd/haproxy/edge-server.cfg"],
                           cwd=ROOT, capture_output=True, text=True, timeout=30)
    assert check.returncode == 0, check.stdout + check.stderr
