"""The memory budget holds what loaded models take: each is charged its weights, its KV
streams (resident from load) and its compute buffers, so models past the budget unload
idle ones or are refused, never overcommitted, and /health's memory account shows the
KV streams of the models loaded, whole."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator

import httpx
import pytest
from conftest import DEFAULT_MODEL, RunningServer, start_server, stop_server

from edge_server.catalogue.default_conversion import served_default_model_path

ADMIN = {"Authorization": "Bearer admin-key"}
BUDGET_MIB = 800
# Two slots of 2,048 cells of SmolLM2 in f16 (23,040 bytes a cell): 90 MiB a model. With
# its weights (136 MiB) and compute buffers (~100 MiB), two such models fit 800 MiB and
# three do not; the file alone, x 1.25 + 64 MiB, let three in.
STREAMS = 2 * 2048 * 23040


@pytest.fixture(scope="module")
def budget_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    tmp = tmp_path_factory.mktemp("budget")
    path = served_default_model_path()
    registry = tmp / "registry.toml"
    registry.write_text(
        f'[[models]]\nid = "first"\npath = "{path}"\n\n'
        f'[[models]]\nid = "second"\npath = "{path}"\n\n'
        # f32 streams of the trained 8,192 cells: 720 MiB of KV, more than the budget
        # leaves with weights and compute buffers, whatever else is loaded.
        f'[[models]]\nid = "wide"\npath = "{path}"\nctx_size = 8192\n'
        'cache_type_k = "f32"\ncache_type_v = "f32"\n')
    server = start_server(tmp, "--registry", str(registry), "--memory-budget-mb",
                          str(BUDGET_MIB), "--ctx-size", "2048", "--parallel", "2",
                          "--admin-api-key", "admin-key", name="budget")
    yield server
    stop_server(server)
    assert "Traceback" not in server.log_text()


def loaded(http: httpx.Client) -> dict[str, int]:
    """Loaded model -> the bytes the budget charges it (/api/ps)."""
    return {m["model"].removesuffix(":latest"): m["size"]
            for m in http.get("/api/ps").json()["models"]}


def ask(http: httpx.Client, model: str) -> httpx.Response:
    return http.post("/v1/completions", json={"model": model, "prompt": "Hi",
                                              "max_tokens": 1})


def assert_within_budget(http: httpx.Client) -> dict[str, int]:
    models = loaded(http)
    assert sum(models.values()) <= BUDGET_MIB * 2**20, models
    memory = http.get("/health").json()["memory"]
    assert memory["kv_cache"] == len(models) * STREAMS, (memory, models)
    assert memory["rss"] >= memory["kv_cache"]
    return models


@contextlib.contextmanager
def busy(server: RunningServer, model: str) -> Iterator[None]:
    """A long streamed answer running on `model` (its lease held) until the block ends."""
    started, done = threading.Event(), threading.Event()

    def stream() -> None:
        with httpx.Client(base_url=server.base_url, headers=ADMIN, timeout=120) as client:
            body = {"model": model, "prompt": "Once upon a time", "max_tokens": 1500,
                    "ignore_eos": True, "stream": True, "draft": False}
            with client.stream("POST", "/v1/completions", json=body) as r:
                for _ in r.iter_bytes():
                    started.set()
                    if done.is_set():
                        break  # closed: the server drops the request
        started.set()

    thread = threading.Thread(target=stream)
    thread.start()
    try:
        assert started.wait(60)
        yield
    finally:
        done.set()
        thread.join(timeout=60)


def test_models_past_the_budget_unload_idle_ones_first(budget_server) -> None:
    with httpx.Client(base_url=budget_server.base_url, headers=ADMIN, timeout=300) as http:
        assert set(assert_within_budget(http)) == {DEFAULT_MODEL}
        assert ask(http, "first").status_code == 200
        assert set(assert_within_budget(http)) == {DEFAULT_MODEL, "first"}
        # A third does not fit beside them: the least recently used goes first.
        assert ask(http, "second").status_code == 200
        assert set(assert_within_budget(http)) == {"first", "second"}


def test_a_load_that_cannot_fit_is_refused_and_unloads_nothing(budget_server) -> None:
    with httpx.Client(base_url=budget_server.base_url, headers=ADMIN, timeout=300) as http:
        before = set(assert_within_budget(http))
        r = ask(http, "wide")
        assert r.status_code == 503, r.text
        assert "memory budget" in r.json()["error"]["message"]
        assert set(assert_within_budget(http)) == before
        assert "wide" not in loaded(http)


def test_busy_models_are_not_unloaded_to_make_room(budget_server) -> None:
    with httpx.Client(base_url=budget_server.base_url, headers=ADMIN, timeout=300) as http:
        for model in ("first", "second"):
            assert ask(http, model).status_code == 200
        assert set(assert_within_budget(http)) == {"first", "second"}
        with busy(budget_server, "first"), busy(budget_server, "second"):
            r = ask(http, DEFAULT_MODEL)
            assert r.status_code == 503, r.text
            assert "Retry-After" in r.headers
            assert set(assert_within_budget(http)) == {"first", "second"}
        # Idle again (once the server has seen the streams go): room is made.
        deadline = time.monotonic() + 60
        while (r := ask(http, DEFAULT_MODEL)).status_code == 503:
            assert time.monotonic() < deadline, r.text
            time.sleep(0.5)
        assert r.status_code == 200, r.text
        assert len(assert_within_budget(http)) == 2


def test_the_charge_is_what_llama_cpp_allocated(budget_server) -> None:
    with httpx.Client(base_url=budget_server.base_url, headers=ADMIN, timeout=300) as http:
        models = assert_within_budget(http)
        memory = http.get("/health").json()["memory"]
        held = memory["weights"] + memory["kv_cache"] + memory["compute_buffers"] + (
            memory["embedding_context"] + memory["projector"])
        assert sum(models.values()) == held
        assert all(size > STREAMS + 100 * 2**20 for size in models.values()), models

