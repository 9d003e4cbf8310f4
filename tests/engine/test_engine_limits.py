"""What the engine guarantees under pressure: a full KV cache never throws text away,
choices get distinct seeds, grammars end generation, a stuck step is reported, and a
model that fails to load is not retried on every request."""

from __future__ import annotations

import socket
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
from conftest import DEFAULT_MODEL, RunningServer, start_server, stop_server

from edge_server.engine.sched.jobs import choice_seed


def test_choice_seeds_are_distinct_and_never_random() -> None:
    for base in (0, 1, 7, 0xFFFFFFFE, 0x9E3779B1, 123456789):
        seeds = [choice_seed(base, i) for i in range(128)]
        assert len(set(seeds)) == 128
        assert seeds[0] == base  # n=1 keeps the request's own seed
        assert all(0 <= s < 0xFFFFFFFF for s in seeds)  # 0xFFFFFFFF means "random"


def test_n_choices_sample_independently(http: httpx.Client) -> None:
    body = {"model": DEFAULT_MODEL, "prompt": "My favourite animal is", "max_tokens": 16,
            "n": 4, "temperature": 1.0, "seed": 11, "ignore_eos": True}
    first = http.post("/v1/completions", json=body).json()
    texts = [c["text"] for c in first["choices"]]
    assert len(set(texts)) == 4, texts  # an open prompt: four seeds, four answers
    again = http.post("/v1/completions", json=body).json()
    assert [c["text"] for c in again["choices"]] == texts  # the same seed repeats


def test_grammar_end_stops_ignore_eos(http: httpx.Client) -> None:
    schema = {"type": "object", "properties": {"a": {"type": "integer", "maximum": 99}},
              "required": ["a"], "additionalProperties": False}
    started = time.monotonic()
    r = http.post("/v1/chat/completions", json={
        "model": DEFAULT_MODEL, "max_tokens": 200, "ignore_eos": True, "temperature": 0,
        "messages": [{"role": "user", "content": "A JSON object please."}],
        "response_format": {"type": "json_schema",
                            "json_schema": {"name": "a", "schema": schema}}})
    assert r.status_code == 200, r.text
    choice = r.json()["choices"][0]
    assert choice["finish_reason"] == "stop"
    assert r.json()["usage"]["completion_tokens"] < 60  # ended with the object, not at 200
    assert time.monotonic() - started < 30


def test_many_choices_wait_for_sequences_instead_of_failing(http: httpx.Client) -> None:
    """Two n=100 requests at once: the second waits for spare sequences, never a 400."""
    def ask(seed: int) -> httpx.Response:
        return http.post("/v1/completions", json={
            "model": DEFAULT_MODEL, "prompt": "Hi", "max_tokens": 2, "n": 100, "seed": seed})

    with ThreadPoolExecutor(2) as pool:
        answers = list(pool.map(ask, [1, 2]))
    for r in answers:
        assert r.status_code == 200, r.text
        assert len(r.json()["choices"]) == 100


def test_max_tokens_must_fit_one_sequence(http: httpx.Client) -> None:
    """Each choice may use --ctx-size tokens (4,096 on the shared server), not more."""
    body = {"model": DEFAULT_MODEL, "prompt": "Hi", "n": 8, "max_tokens": 5000}
    strict = http.post("/v1/completions",
                       json={**body, "context_length_exceeded_behavior": "error"})
    assert strict.status_code == 400
    assert strict.json()["error"]["code"] == "context_length_exceeded"
    r = http.post("/v1/completions", json={**body, "max_tokens": 4})
    assert r.status_code == 200 and len(r.json()["choices"]) == 8


def test_small_kv_cache_keeps_every_answer(tmp_path: Path) -> None:
    """8 requests needing ~1,300 cells with --ctx-size 1024 (one cache all slots share):
    those that do not fit beside the running ones wait for them, so all finish whole,
    none cut short by the others."""
    # Those that do not fit yet wait in the queue: long enough for a slow machine.
    server = start_server(tmp_path, "--ctx-size", "1024", "--parallel", "8",
                          "--queue-timeout", "600", name="kv")
    try:
        def ask(i: int) -> dict:
            r = httpx.post(f"{server.v1}/completions", timeout=900, json={
                "model": DEFAULT_MODEL, "prompt": f"Story {i}: once upon a time",
                "max_tokens": 150, "ignore_eos": True, "temperature": 0.7, "seed": i})
            assert r.status_code == 200, r.text
            return r.json()

        with ThreadPoolExecutor(8) as pool:
            answers = list(pool.map(ask, range(8)))
        for body in answers:
            assert body["usage"]["completion_tokens"] == 150
            assert body["choices"][0]["finish_reason"] == "length"
            assert body["choices"][0]["text"]
        health = httpx.get(f"{server.base_url}/health").json()["models"][DEFAULT_MODEL]
        assert health["busy_sequences"] == 0
    finally:
        stop_server(server)


def test_stuck_step_makes_health_fail(tmp_path: Path) -> None:
    """A step longer than --watchdog-seconds turns /health into a 503 naming the model;
    under systemd's watchdog the server pings WATCHDOG=1 while all is well."""
    path = tmp_path / "notify.sock"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.bind(str(path))
        sock.settimeout(60)
        server = start_server(tmp_path, "--ctx-size", "4096", "--parallel", "1",
                              "--watchdog-seconds", "0.05",
                              name="watchdog", env={"NOTIFY_SOCKET": str(path),
                                                    "WATCHDOG_USEC": "1000000"})
        try:
            messages = ""
            while "WATCHDOG=1" not in messages:
                messages += sock.recv(4096).decode()
            with ThreadPoolExecutor(1) as pool:
                long_prompt = pool.submit(httpx.post, f"{server.v1}/completions", timeout=120,
                                          json={"model": DEFAULT_MODEL, "max_tokens": 1,
                                                "prompt": "word " * 3000})
                seen = set()
                while not long_prompt.done():
                    r = httpx.get(f"{server.base_url}/health", timeout=10)
                    seen.add(r.status_code)
                    time.sleep(0.02)
                    if r.status_code == 503:
                        assert r.json()["status"] == "stalled"
                        assert r.json()["stalled_models"] == [DEFAULT_MODEL]
                assert long_prompt.result().status_code == 200
            assert 503 in seen
            assert httpx.get(f"{server.base_url}/health").status_code == 200
        finally:
            stop_server(server)


def test_failed_load_backs_off(tmp_path: Path) -> None:
    broken = tmp_path / "broken.gguf"
    broken.write_bytes(b"GGUF" + b"\0" * 4096)
    registry = tmp_path / "registry.toml"
    registry.write_text(f'[[models]]\nid = "broken"\npath = "{broken}"\n')
    server: RunningServer = start_server(tmp_path, "--registry", str(registry),
                                         "--ctx-size", "1024", name="broken")
    try:
        body = {"model": "broken", "prompt": "x", "max_tokens": 1}
        first = httpx.post(f"{server.v1}/completions", json=body, timeout=30)
        second = httpx.post(f"{server.v1}/completions", json=body, timeout=30)
        for r in (first, second):
            assert r.status_code == 503
            assert r.json()["error"]["code"] == "model_unavailable"
            assert str(tmp_path) not in r.text
        assert int(second.headers["Retry-After"]) >= 1
        assert server.log_text().count("could not load model broken") == 1
        ok = httpx.post(f"{server.v1}/completions", timeout=30,
                        json={"model": DEFAULT_MODEL, "prompt": "x", "max_tokens": 1})
        assert ok.status_code == 200
    finally:
        stop_server(server)
