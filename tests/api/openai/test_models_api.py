"""GET /v1/models and /v1/models/{model}, and the `default` alias: the model the server
was started to serve, listed first, and named by its own id in every response."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest
from conftest import DEFAULT_MODEL, RunningServer, start_server, stop_server

from edge_server.catalogue.pool import ModelPool
from edge_server.catalogue.spec import ModelSpec, UnknownModel
from edge_server.catalogue.store import RegistryError, load_registry
from edge_server.cli import main
from edge_testkit.models.gemma import GEMMA_TEMPLATE, gemma_gguf

GEMMA = "gemma3-270m"
MSG = [{"role": "user", "content": "Hi"}]


# --- the session server: the embedded model is the default ---------------------------

@pytest.mark.parametrize("name", [DEFAULT_MODEL, "SmolLM2-135M-Instruct", "default"])
def test_retrieve_by_id_or_alias(client, name: str) -> None:
    model = client.models.retrieve(name)
    assert model.id == DEFAULT_MODEL
    assert model.object == "model"
    assert model.owned_by == "edge_server"
    assert model.created > 0
    extra = model.model_extra or {}
    assert set(extra["aliases"]) == {"SmolLM2-135M-Instruct", "default"}
    assert extra["status"] == "loaded"


def test_list_has_the_default_model_first(client) -> None:
    data = client.models.list().data
    assert data[0].id == DEFAULT_MODEL
    assert "default" in data[0].model_extra["aliases"]
    assert all("default" not in m.model_extra["aliases"] for m in data[1:])


def test_unknown_model_is_404(client, http) -> None:
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("no-such-model")
    for name in ("no-such-model", "org/with-a-slash"):
        r = http.get(f"/v1/models/{name}")
        assert r.status_code == 404
        error = r.json()["error"]
        assert set(error) == {"message", "type", "param", "code"}
        assert error["code"] == "model_not_found"
        assert error["type"] == "invalid_request_error"
        assert error["param"] == "model"
        assert name in error["message"]


def test_trailing_slash_lists_the_models(http) -> None:
    r = http.get("/v1/models/")
    assert r.status_code == 200
    assert r.json()["object"] == "list"


def test_alias_request_answers_with_the_model_id(http) -> None:
    r = http.post("/v1/chat/completions", json={
        "model": "SmolLM2-135M-Instruct", "messages": MSG, "max_tokens": 1, "stream": True})
    chunks = [json.loads(line[6:]) for line in r.text.splitlines()
              if line.startswith("data: {")]
    assert chunks and {c["model"] for c in chunks} == {DEFAULT_MODEL}


# --- serve --model <gemma>: gemma is the default --------------------------------------

@pytest.fixture(scope="module")
def gemma_default(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    tmp = tmp_path_factory.mktemp("gemma-default")
    gguf = gemma_gguf(tmp)
    # The GGUF carries no chat template; --chat-template-file applies to the default model.
    server = start_server(tmp, "--model", str(gguf), "--model-id", GEMMA,
                          "--chat-template-file", str(GEMMA_TEMPLATE),
                          "--ctx-size", "2048", "--parallel", "2", name="gemma-default")
    yield server
    stop_server(server)
    gguf.unlink()
    assert "Traceback" not in server.log_text()


@pytest.fixture()
def gemma_client(gemma_default: RunningServer) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=gemma_default.v1, api_key="unused", max_retries=0) as c:
        yield c


def test_served_model_is_listed_first_and_is_default(gemma_client) -> None:
    data = gemma_client.models.list().data
    assert data[0].id == GEMMA
    assert "default" in data[0].model_extra["aliases"]
    # The embedded model is still served, under its own names only.
    smol = next(m for m in data if m.id == DEFAULT_MODEL)
    assert "default" not in smol.model_extra["aliases"]
    assert gemma_client.models.retrieve("default").id == GEMMA
    assert gemma_client.models.retrieve("gemma-3-270m-q4_k_m").id == GEMMA  # the file name


def test_default_requests_are_served_by_the_served_model(gemma_default, gemma_client) -> None:
    chat = gemma_client.chat.completions.create(
        model="default", messages=MSG, max_tokens=2, extra_body={"ignore_eos": True})
    assert chat.model == GEMMA
    comp = gemma_client.completions.create(model="default", prompt="The sky is",
                                           max_tokens=2, extra_body={"ignore_eos": True})
    assert comp.model == GEMMA
    chunks = list(gemma_client.completions.create(
        model="default", prompt="The sky is", max_tokens=2, stream=True))
    assert {c.model for c in chunks} == {GEMMA}

    # Gemma's vocabulary, not SmolLM2's, counted the prompt.
    def tokens(model: str) -> list[int]:
        r = httpx.post(f"{gemma_default.base_url}/tokenize", timeout=60, json={
            "model": model, "content": "The sky is", "add_special": True})
        return r.json()["tokens"]

    assert tokens("default") == tokens(GEMMA) != tokens(DEFAULT_MODEL)
    assert comp.usage.prompt_tokens == len(tokens(GEMMA))


def test_health_and_metrics_name_the_served_model(gemma_default) -> None:
    health = httpx.get(f"{gemma_default.base_url}/health", timeout=10).json()
    assert health["status"] == "ok"
    assert health["default_model"] == GEMMA
    assert GEMMA in health["models"]
    httpx.get(f"{gemma_default.v1}/models/default", timeout=10).raise_for_status()
    metrics = httpx.get(f"{gemma_default.base_url}/metrics", timeout=10).text
    assert f'edge_server_model_loaded{{model="{GEMMA}"}} 1.0' in metrics
    # Retrievals share one label, whatever the name asked for.
    assert 'endpoint="/v1/models/{model}",status="200"' in metrics


# --- no server needed ------------------------------------------------------------------

def test_pool_puts_the_default_first() -> None:
    a, b = ModelSpec("a", None), ModelSpec("b", None, ("bee",))
    pool = ModelPool([a, b], default="bee")
    assert [s.id for s in pool.specs] == ["b", "a"]
    assert pool.spec("default").id == pool.default_id == "b"
    assert ModelPool([a, b]).spec("default").id == "a"
    with pytest.raises(UnknownModel):
        ModelPool([a, b], default="c")
    with pytest.raises(ValueError, match="used twice"):
        ModelPool([a, ModelSpec("c", None, ("a",))])


def test_registry_may_not_claim_default(tmp_path: Path) -> None:
    registry = tmp_path / "registry.toml"
    registry.write_text('[[models]]\nid = "x"\naliases = ["default"]\npath = "x.gguf"\n')
    with pytest.raises(RegistryError, match="reserved"):
        load_registry(registry)


@pytest.mark.parametrize(("args", "says"), [
    (["--model", "no-such-model-or-file"], "neither a registry model nor a file"),
    (["--model", "{gguf}", "--model-id", "gemma3"], "already names a registry model"),
    (["--model", "{gguf}", "--model-id", "default"], "already names a registry model"),
])
def test_serve_refuses_bad_model_flags(tmp_path: Path, monkeypatch, capsys,
                                       args: list[str], says: str) -> None:
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))
    gguf = tmp_path / "some.gguf"
    gguf.write_bytes(b"GGUF")  # never loaded: the flags are refused first
    assert main(["serve", *(a.format(gguf=gguf) for a in args)]) == 2
    assert says in capsys.readouterr().err
