"""Tenants: with API keys, each key's prompts are cached for that key alone (KV slots,
the wait on a prefix being evaluated, the host-RAM prompt store, `cached_tokens`), so no
key gains from or learns about another's. Without keys, the Host header must name this
machine (loopback) or a host of --allowed-hosts: DNS rebinding from a web page fails."""

from __future__ import annotations

import random
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
from conftest import DEFAULT_MODEL, RunningServer, start_server, stop_server

from edge_server.api.http.guards.host_guard import host_name, is_loopback

KEY_A, KEY_B, ADMIN = "tenant-a-key", "tenant-b-key", "tenant-admin-key"
OPENING = 16  # "Ledger N:" tokens every prompt here begins with
WORDS = ["amber", "brook", "cedar", "delta", "ember", "fjord", "grove", "heron", "inlet",
         "juniper", "kestrel", "lagoon", "maple", "nettle", "osprey", "prairie"]


def long_prompt(seed: int, words: int = 500) -> str:
    """About 800 tokens nobody has sent before (but the first few words)."""
    rng = random.Random(seed)
    return f"Ledger {seed}: " + " ".join(rng.choice(WORDS) for _ in range(words))


def cached(url: str, key: str, prompt: str) -> tuple[int, int]:
    """(cached_tokens, prompt_tokens) of a one-token completion sent with `key`."""
    r = httpx.post(f"{url}/v1/completions", timeout=180,
                   headers={"Authorization": f"Bearer {key}"},
                   json={"model": DEFAULT_MODEL, "prompt": prompt, "max_tokens": 1})
    assert r.status_code == 200, r.text
    usage = r.json()["usage"]
    return usage["prompt_tokens_details"]["cached_tokens"], usage["prompt_tokens"]


@pytest.fixture(scope="module")
def keyed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    server = start_server(tmp_path_factory.mktemp("tenants"), "--parallel", "2",
                          "--ctx-size", "4096", "--api-key", KEY_A, "--api-key", KEY_B,
                          "--admin-api-key", ADMIN, name="tenants")
    yield server
    stop_server(server)
    assert "Traceback" not in server.log_text()


def test_another_key_gets_nothing_from_a_cached_prompt(keyed: RunningServer) -> None:
    prompt = long_prompt(1)
    hit, total = cached(keyed.base_url, KEY_A, prompt)
    assert total > 700 and hit < OPENING
    # Key B sends key A's prompt: nothing of it is cached for B ...
    assert cached(keyed.base_url, KEY_B, prompt)[0] < OPENING
    # ... while A repeating it finds it, and so does B the second time (its own copy).
    assert cached(keyed.base_url, KEY_A, prompt)[0] >= total - OPENING
    assert cached(keyed.base_url, KEY_B, prompt)[0] >= total - OPENING


def test_keys_never_wait_for_each_others_prefix(keyed: RunningServer) -> None:
    """Sent together, a key never waits for (and copies) the other's evaluation."""
    prompt = long_prompt(2)
    with ThreadPoolExecutor(2) as pool:
        hits = list(pool.map(lambda key: cached(keyed.base_url, key, prompt)[0],
                             [KEY_A, KEY_B]))
    assert max(hits) < OPENING, hits


def test_spilled_prefixes_are_restored_for_their_key_alone(keyed: RunningServer) -> None:
    """Two slots: a third long prompt of key A evicts the first to the prompt store,
    from which only key A gets it back."""
    first, total = long_prompt(3), 0
    for seed in (3, 4, 5):
        hit, total_seed = cached(keyed.base_url, KEY_A, long_prompt(seed))
        assert hit < OPENING
        total = total if seed != 3 else total_seed
    stats = httpx.get(f"{keyed.base_url}/health", headers={
        "Authorization": f"Bearer {ADMIN}"}).json()["models"][DEFAULT_MODEL]
    assert stats["prompt_store_entries"] >= 1
    assert cached(keyed.base_url, KEY_B, first)[0] < OPENING
    assert cached(keyed.base_url, KEY_A, first)[0] >= total - OPENING


def test_with_keys_any_host_is_served(keyed: RunningServer) -> None:
    r = httpx.get(f"{keyed.base_url}/v1/models", headers={
        "Host": "edge.example", "Authorization": f"Bearer {KEY_A}"})
    assert r.status_code == 200


# --- Host without keys ---------------------------------------------------------------------


@pytest.mark.parametrize("host", ["localhost", "localhost:8080", "127.0.0.1:1", "[::1]:80",
                                  "127.3.4.5", "app.localhost", "LOCALHOST"])
def test_loopback_hosts_are_served(server: RunningServer, host: str) -> None:
    r = httpx.get(f"{server.base_url}/v1/models", headers={"Host": host})
    assert r.status_code == 200, r.text


@pytest.mark.parametrize("host", ["attacker.example", "attacker.example:8080",
                                  "localhost.attacker.example", "10.0.0.5"])
def test_foreign_hosts_are_refused_in_the_protocols_shape(server: RunningServer,
                                                          host: str) -> None:
    r = httpx.post(f"{server.v1}/chat/completions", headers={"Host": host}, json={
        "model": DEFAULT_MODEL, "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": 1})
    assert r.status_code == 403
    error = r.json()["error"]
    assert error["code"] == "host_not_allowed" and error["type"] == "invalid_request_error"
    r = httpx.post(f"{server.v1}/messages", headers={"Host": host}, json={
        "model": DEFAULT_MODEL, "max_tokens": 1,
        "messages": [{"role": "user", "content": "hi"}]})
    assert r.status_code == 403
    assert r.json()["type"] == "error" and r.json()["error"]["type"]


def test_allowed_hosts_from_the_environment(tmp_path_factory: pytest.TempPathFactory) -> None:
    server = start_server(tmp_path_factory.mktemp("hosts"), "--parallel", "1",
                          "--ctx-size", "512", name="hosts",
                          env={"EDGE_SERVER_ALLOWED_HOSTS": "box.lan, Other.LAN:9000"})
    try:
        for host, status in (("box.lan:8080", 200), ("other.lan", 200),
                             ("localhost", 200), ("attacker.example", 403)):
            r = httpx.get(f"{server.base_url}/v1/models", headers={"Host": host})
            assert r.status_code == status, (host, r.text)
    finally:
        stop_server(server)


def test_host_names_are_read_without_port_or_brackets() -> None:
    assert host_name("Example.com:8080") == "example.com"
    assert host_name("[::1]:8080") == "::1"
    assert host_name("::1") == "::1"
    assert is_loopback("::1") and is_loopback("127.0.0.9") and is_loopback("a.localhost")
    assert not is_loopback("localhost.example") and not is_loopback("192.168.1.2")
