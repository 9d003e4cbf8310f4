"""Continuous batching: concurrent requests, disconnects, backpressure."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import httpx
import jsonschema
import pytest
from conftest import DEFAULT_MODEL, RunningServer, start_server, stop_server

PROMPTS = [
    "The history of the bicycle begins",
    "A recipe for bread:",
    "In the year 3000, cities",
    "The best way to learn a language is",
    "Dear diary, today I",
    "The ocean is home to",
    "def fibonacci(n):",
    "Three facts about the moon:",
]


def complete(base_url: str, prompt: str, **extra) -> dict:
    r = httpx.post(f"{base_url}/v1/completions", json={
        "model": DEFAULT_MODEL, "prompt": prompt, "max_tokens": 24, "temperature": 0,
        "ignore_eos": True, **extra}, timeout=120)
    assert r.status_code == 200, r.text
    return r.json()


def busy(base_url: str) -> tuple[int, int]:
    stats = httpx.get(f"{base_url}/health", timeout=10).json()["models"][DEFAULT_MODEL]
    return stats["busy_slots"], stats["waiting"]


def wait_idle(base_url: str, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if busy(base_url) == (0, 0):
            return
        time.sleep(0.1)
    raise AssertionError(f"still busy after {timeout}s: {busy(base_url)}")


def test_eight_concurrent_requests_match_solo_runs(server: RunningServer) -> None:
    """Greedy outputs inside a batch agree with the same requests run alone.

    llama.cpp's kernels are not batch-invariant: the attention path taken depends on the
    batch's make-up, and this small Q4 model is sensitive to it (measured here: the same
    token's logprob moved by up to 0.16 inside a mixed batch; replaying the server's exact
    batches through llama.cpp in-process reproduces the same values, and merely turning
    flash attention off moves them by 0.17). Greedy output can therefore split only where
    the top two tokens are close. So: the texts agree token for token up to any split,
    logprobs on the shared part stay within that noise, and every split happens where
    the solo run's top two tokens were close.
    """

    def run(prompt: str) -> dict:
        return complete(server.base_url, prompt, max_tokens=32, logprobs=2)

    solo = [run(p) for p in PROMPTS]
    with ThreadPoolExecutor(len(PROMPTS)) as pool:
        batched = list(pool.map(run, PROMPTS))
    identical = 0
    for prompt, alone, together in zip(PROMPTS, solo, batched, strict=True):
        assert together["usage"]["completion_tokens"] == 32
        assert together["choices"][0]["finish_reason"] == "length"
        a, b = alone["choices"][0]["logprobs"], together["choices"][0]["logprobs"]
        split = next((k for k in range(32) if a["tokens"][k] != b["tokens"][k]), None)
        shared = 32 if split is None else split
        for k in range(shared):
            assert abs(a["token_logprobs"][k] - b["token_logprobs"][k]) < 0.25, (prompt, k)
        if split is None:
            identical += 1
            continue
        top_two = sorted(a["top_logprobs"][split].values(), reverse=True)[:2]
        assert len(top_two) == 2 and top_two[0] - top_two[1] < 0.5, (prompt, split, top_two)
    assert identical >= len(PROMPTS) // 2


def test_fields_work_inside_a_batch(server: RunningServer) -> None:
    base = server.base_url
    schema = {"type": "object", "properties": {"n": {"type": "integer", "minimum": 1,
                                                     "maximum": 9}}, "required": ["n"]}
    jobs = {
        "schema": lambda: httpx.post(f"{base}/v1/chat/completions", json={
            "model": DEFAULT_MODEL, "max_tokens": 40, "messages": [
                {"role": "user", "content": "A number as JSON"}],
            "response_format": {"type": "json_schema",
                                "json_schema": {"name": "n", "schema": schema}}},
            timeout=120).json(),
        "logprobs": lambda: complete(base, PROMPTS[0], logprobs=2, max_tokens=8),
        "n": lambda: complete(base, PROMPTS[1], n=3, temperature=1.0, seed=1, max_tokens=8),
        "stop": lambda: complete(base, PROMPTS[2], stop=[" "], ignore_eos=False),
        "bias": lambda: complete(base, PROMPTS[3], max_tokens=4,
                                 logit_bias={"28": 100}),
        "plain": lambda: complete(base, PROMPTS[4]),
    }
    with ThreadPoolExecutor(len(jobs)) as pool:
        futures = {name: pool.submit(fn) for name, fn in jobs.items()}
        results = {name: f.result() for name, f in futures.items()}
    jsonschema.validate(json.loads(results["schema"]["choices"][0]["message"]["content"]),
                        schema)
    assert len(results["logprobs"]["choices"][0]["logprobs"]["tokens"]) == 8
    assert len(results["n"]["choices"]) == 3
    assert " " not in results["stop"]["choices"][0]["text"].strip(" ")
    forced = httpx.post(f"{base}/detokenize", json={"model": DEFAULT_MODEL,
                                                    "tokens": [28]}).json()["content"]
    assert results["bias"]["choices"][0]["text"] == forced * 4
    assert results["plain"]["usage"]["completion_tokens"] == 24


def _disconnect_mid_stream(base_url: str, i: int) -> int:
    """Reads two events of a long stream, then drops the connection."""
    with httpx.Client(timeout=120) as client, client.stream(
        "POST", f"{base_url}/v1/completions", json={
            "model": DEFAULT_MODEL, "prompt": PROMPTS[i % len(PROMPTS)], "max_tokens": 400,
            "ignore_eos": True, "stream": True, "seed": i}) as r:
        seen = 0
        for line in r.iter_lines():
            if line.startswith("data: "):
                seen += 1
                if seen == 2:
                    break
        return seen


def test_fifty_disconnects_leave_no_busy_sequence(server: RunningServer) -> None:
    with ThreadPoolExecutor(10) as pool:
        seen = list(pool.map(lambda i: _disconnect_mid_stream(server.base_url, i), range(50)))
    assert seen == [2] * 50
    wait_idle(server.base_url, timeout=10)
    assert complete(server.base_url, "Hello")["usage"]["completion_tokens"] == 24


def test_disconnect_during_prompt_frees_the_slot(server: RunningServer) -> None:
    long_prompt = "lorem ipsum dolor sit amet " * 250  # 2,500 tokens: seconds of prefill
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(f"{server.base_url}/v1/completions", json={
            "model": DEFAULT_MODEL, "prompt": long_prompt, "max_tokens": 5},
            timeout=httpx.Timeout(60, read=0.5))
    wait_idle(server.base_url, timeout=8)


@pytest.fixture(scope="module")
def small_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    server = start_server(tmp_path_factory.mktemp("small"), "--parallel", "1", "--max-queue",
                          "1", "--queue-timeout", "1.5", "--ctx-size", "2048", name="small")
    yield server
    stop_server(server)


def test_queue_overflow_and_wait_timeout(small_server: RunningServer) -> None:
    url = f"{small_server.base_url}/v1/completions"
    body = {"model": DEFAULT_MODEL, "prompt": "Tell a story", "ignore_eos": True}
    results: dict[str, httpx.Response] = {}

    def send(name: str, max_tokens: int) -> None:
        results[name] = httpx.post(url, json={**body, "max_tokens": max_tokens}, timeout=120)

    running = threading.Thread(target=send, args=("running", 300))
    running.start()
    deadline = time.monotonic() + 10
    while busy(small_server.base_url)[0] == 0 and time.monotonic() < deadline:
        time.sleep(0.05)
    waiting = threading.Thread(target=send, args=("waiting", 5))
    waiting.start()
    while busy(small_server.base_url)[1] == 0 and time.monotonic() < deadline:
        time.sleep(0.05)
    send("refused", 5)
    waiting.join()
    running.join()

    refused = results["refused"]
    assert refused.status_code == 429
    assert refused.headers["Retry-After"]
    assert refused.json()["error"]["code"] == "server_overloaded"
    timed_out = results["waiting"]
    assert timed_out.status_code == 503, timed_out.text
    assert timed_out.headers["Retry-After"]
    assert "1.5s" in timed_out.json()["error"]["message"]
    admitted = results["running"]
    assert admitted.status_code == 200
    assert admitted.json()["usage"]["completion_tokens"] == 300


def test_stream_refused_before_headers_when_queue_full(small_server: RunningServer) -> None:
    """A streaming request that cannot be served gets a real status, not a 200 + error."""
    url = f"{small_server.base_url}/v1/completions"
    body = {"model": DEFAULT_MODEL, "prompt": "Tell a story", "ignore_eos": True}
    blocker = threading.Thread(target=lambda: httpx.post(
        url, json={**body, "max_tokens": 200}, timeout=120))
    blocker.start()
    time.sleep(0.3)
    queued = threading.Thread(target=lambda: httpx.post(
        url, json={**body, "max_tokens": 2}, timeout=120))
    queued.start()
    time.sleep(0.3)
    r = httpx.post(url, json={**body, "max_tokens": 2, "stream": True}, timeout=30)
    assert r.status_code == 429
    blocker.join()
    queued.join()
