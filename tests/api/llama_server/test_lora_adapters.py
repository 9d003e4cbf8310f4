"""LoRA adapters through the real server: `--lora`, GET/POST /lora-adapters and the
per-request `lora` field, on a tiny random Qwen3-MoE model with an untied output layer
and two adapters of edge_testkit/models/make_test_lora.py made for it at test time: a
zero one (B = 0: nothing may change) and a scaling one (every logit times 1 + s * FACTOR
at scale s: the gap between the two likeliest tokens grows by exactly that factor)."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from conftest import RunningServer, arch_model, start_server, stop_server

from edge_testkit.models.make_test_lora import FACTOR, write_adapter

ZERO, SCALING = 0, 1
PROMPT = " ".join(["river stone lamp quiet orange market window seven"] * 12)


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    tmp = tmp_path_factory.mktemp("lora")
    model = arch_model("qwen3moe")
    zero = write_adapter("zero", model, tmp / "zero.gguf")
    scaling = write_adapter("scaling", model, tmp / "scaling.gguf")
    server = start_server(tmp, "--model", str(model), "--lora", str(zero), "--lora",
                          f"{scaling}:0.5", "--lora-init-without-apply", "--parallel", "4")
    yield server
    assert stop_server(server) == 0
    assert "Traceback" not in server.log_text()


def complete(server: RunningServer, lora: list[dict[str, Any]] | None = None,
             prompt: str = "river stone lamp", max_tokens: int = 6) -> dict[str, Any]:
    body: dict[str, Any] = {"prompt": prompt, "max_tokens": max_tokens, "temperature": 0,
                            "logprobs": 2, "draft": False}
    if lora is not None:
        body["lora"] = lora
    r = httpx.post(f"{server.v1}/completions", json=body, timeout=120)
    assert r.status_code == 200, r.text
    return r.json()  # type: ignore[no-any-return]


def first_gap(answer: dict[str, Any]) -> float:
    """How far the likeliest first token's logprob leads the runner-up's."""
    top = sorted(answer["choices"][0]["logprobs"]["top_logprobs"][0].values(), reverse=True)
    return top[0] - top[1]


def token_logprobs(answer: dict[str, Any]) -> list[float]:
    return answer["choices"][0]["logprobs"]["token_logprobs"]  # type: ignore[no-any-return]


def test_the_loaded_adapters_are_listed_by_name_at_their_scales(served: RunningServer) -> None:
    r = httpx.get(f"{served.base_url}/lora-adapters", timeout=30)
    assert r.status_code == 200
    listed = r.json()
    assert [(a["id"], a["path"], a["scale"]) for a in listed] == [
        (ZERO, "zero.gguf", 0.0), (SCALING, "scaling.gguf", 0.0)]  # init without apply


def test_a_zero_adapter_changes_nothing(served: RunningServer) -> None:
    plain = complete(served)
    adapted = complete(served, [{"id": ZERO, "scale": 1.0}])
    assert adapted["choices"][0]["text"] == plain["choices"][0]["text"]
    assert token_logprobs(adapted) == pytest.approx(token_logprobs(plain), abs=1e-3)


@pytest.mark.parametrize("scale", [0.5, 1.0, -0.5])
def test_the_scaling_adapter_moves_the_logits_by_its_scale(served: RunningServer,
                                                           scale: float) -> None:
    base = first_gap(complete(served))
    adapted = complete(served, [{"id": SCALING, "scale": scale}])
    assert first_gap(adapted) == pytest.approx(base * (1 + scale * FACTOR), rel=0.01)


def test_a_request_without_the_adapter_in_flight_beside_it_is_unaffected(
        served: RunningServer) -> None:
    """A long stream without adapters, and requests under the scaling adapter sent once its
    first token came: they take turns with it (one set a step), each keeps its own
    numbers, and the stream's are those of the same request alone."""
    alone = complete(served, max_tokens=120)
    base_gap = first_gap(complete(served))
    started, stream_done = threading.Event(), threading.Event()
    streamed: list[float] = []
    adapted_during: list[bool] = []

    def stream() -> None:
        body = {"prompt": "river stone lamp", "max_tokens": 120, "temperature": 0,
                "logprobs": 2, "draft": False, "stream": True}
        try:
            with httpx.stream("POST", f"{served.v1}/completions", json=body,
                              timeout=120) as r:
                for line in r.iter_lines():
                    if line.startswith("data: {"):
                        choice = json.loads(line[6:])["choices"][0]
                        if choice.get("logprobs"):
                            streamed.extend(choice["logprobs"]["token_logprobs"])
                            started.set()
        finally:
            started.set()
            stream_done.set()

    thread = threading.Thread(target=stream)
    thread.start()
    try:
        assert started.wait(timeout=120)
        for _ in range(3):
            answer = complete(served, [{"id": SCALING, "scale": 1.0}], max_tokens=2)
            adapted_during.append(not stream_done.is_set())
            assert first_gap(answer) == pytest.approx(base_gap * (1 + FACTOR), rel=0.01)
    finally:
        thread.join(timeout=120)
    assert adapted_during[0], "the stream ended before an adapted request was answered"
    assert streamed == pytest.approx(token_logprobs(alone), abs=1e-3)
    stats = httpx.get(f"{served.base_url}/health", timeout=10).json()["models"]
    assert next(iter(stats.values()))["lora_set_switches"] > 0


def test_cached_prefixes_are_kept_per_adapter_set(served: RunningServer) -> None:
    def cached(lora: list[dict[str, Any]] | None) -> int:
        answer = complete(served, lora, prompt=PROMPT, max_tokens=1)
        return answer["usage"]["prompt_tokens_details"]["cached_tokens"]  # type: ignore[no-any-return]

    cached(None)
    assert cached(None) > 0
    # The zero adapter's KV is the same numbers, but no other set's KV is ever taken.
    assert cached([{"id": ZERO, "scale": 1.0}]) == 0
    assert cached([{"id": ZERO, "scale": 1.0}]) > 0
    assert cached([{"id": ZERO, "scale": 0.5}]) == 0


def test_post_sets_the_scales_of_requests_that_name_none(served: RunningServer) -> None:
    base = first_gap(complete(served))
    r = httpx.post(f"{served.base_url}/lora-adapters", json=[{"id": SCALING, "scale": 1.0}],
                   timeout=30)
    assert r.status_code == 200 and r.json() == {"success": True}
    try:
        listed = httpx.get(f"{served.base_url}/lora-adapters", timeout=30).json()
        assert [a["scale"] for a in listed] == [0.0, 1.0]
        assert first_gap(complete(served)) == pytest.approx(base * (1 + FACTOR), rel=0.01)
        # An empty list asks for the defaults, as in llama-server.
        assert first_gap(complete(served, [])) == pytest.approx(base * (1 + FACTOR), rel=0.01)
        # A request's own list turns the rest off.
        assert first_gap(complete(served, [{"id": ZERO, "scale": 1.0}])) == pytest.approx(
            base, rel=0.01)
    finally:
        r = httpx.post(f"{served.base_url}/lora-adapters", json=[], timeout=30)
        assert r.status_code == 200
    assert first_gap(complete(served)) == pytest.approx(base, rel=0.01)


@pytest.mark.parametrize(("lora", "named"), [
    ([{"id": 2, "scale": 1.0}], "lora"),
    ([{"id": -1, "scale": 1.0}], "lora"),
    ([{"id": 0, "scale": 9.0}], "lora"),
    ([{"id": 0, "scale": "nan"}], "lora"),
    ([{"id": 0, "scale": 1.0}, {"id": 0, "scale": 0.5}], "lora"),
    ([{"id": 0}], "lora"),
    ({"id": 0, "scale": 1.0}, "lora"),
])
def test_a_bad_lora_field_is_a_400_naming_it(served: RunningServer, lora: Any,
                                             named: str) -> None:
    r = httpx.post(f"{served.v1}/completions", timeout=30,
                   json={"prompt": "hi", "max_tokens": 1, "lora": lora})
    assert r.status_code == 400, r.text
    assert named in r.text


@pytest.mark.parametrize("body", [{"id": 0, "scale": 1}, [{"id": 7, "scale": 1}],
                                  [{"id": 0, "scale": 1e9}], "x"])
def test_a_bad_post_is_a_400(served: RunningServer, body: Any) -> None:
    r = httpx.post(f"{served.base_url}/lora-adapters", json=body, timeout=30)
    assert r.status_code == 400, r.text
    assert "Traceback" not in r.text


def test_a_file_that_is_no_adapter_of_the_model_stops_the_server(tmp_path: Path) -> None:
    model = arch_model("qwen3moe")
    server = start_server(tmp_path, "--model", str(model), "--lora", str(model), wait=False)
    assert server.process.wait(timeout=120) != 0
    assert "could not load the LoRA adapter" in server.log_text()
    assert "Traceback" not in server.log_text()


def test_a_registry_entry_loads_its_adapters(tmp_path: Path) -> None:
    model = arch_model("qwen3moe")
    write_adapter("scaling", model, tmp_path / "scaling.gguf")
    registry = tmp_path / "registry.toml"
    registry.write_text(f'[[models]]\nid = "moe"\npath = "{model}"\n'
                        'lora = ["scaling.gguf:0.5"]\n')
    server = start_server(tmp_path, "--registry", str(registry), "--model", "moe")
    try:
        listed = httpx.get(f"{server.base_url}/lora-adapters", timeout=30).json()
        assert [(a["path"], a["scale"]) for a in listed] == [("scaling.gguf", 0.5)]
        base = first_gap(complete(server, [{"id": 0, "scale": 0.0}]))
        assert first_gap(complete(server)) == pytest.approx(base * (1 + 0.5 * FACTOR),
                                                            rel=0.01)
    finally:
        assert stop_server(server) == 0
