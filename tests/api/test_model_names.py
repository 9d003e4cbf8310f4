"""Model names that tools hard-code (`claude-…` from Claude Code and the Anthropic SDK,
`gpt-4o` from agents, `test` from llama.cpp's server tests): a 404 by default; served
when the operator opts in, by glob aliases in the registry or --serve-unknown-models,
with the answer's `model` naming the model that really answered. Ollama's routes keep
their 404 for names they do not have."""

from __future__ import annotations

from collections.abc import Iterator

import anthropic
import httpx
import openai
import pytest
from conftest import DEFAULT_MODEL, RunningServer, start_server, stop_server

from edge_server.catalogue.default_model import default_model_path

PATTERNED = "smol-patterns"  # the registry model answering to the glob aliases
HELLO = [{"role": "user", "content": "Say hi."}]


@pytest.fixture(scope="module")
def opted_in(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    tmp = tmp_path_factory.mktemp("model-names")
    registry = tmp / "registry.toml"
    registry.write_text(f'[[models]]\nid = "{PATTERNED}"\npath = "{default_model_path()}"\n'
                        'aliases = ["claude-*", "gpt-4o*"]\nctx_size = 1024\n')
    server = start_server(tmp, "--registry", str(registry), "--serve-unknown-models",
                          "--ctx-size", "1024", "--parallel", "1")
    yield server
    stop_server(server)
    assert "Traceback" not in server.log_text()


def _claude(server: RunningServer) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=server.base_url, api_key="unused", max_retries=0)


def _openai(server: RunningServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.v1, api_key="unused", max_retries=0)


def test_the_anthropic_sdk_with_a_claude_name_is_served_by_the_pattern(
        opted_in: RunningServer) -> None:
    with _claude(opted_in) as claude:
        message = claude.messages.create(model="claude-haiku-4-5-20251001", max_tokens=2,
                                         messages=HELLO)  # type: ignore[arg-type]
    assert message.model == PATTERNED
    assert message.usage.output_tokens <= 2


def test_the_openai_sdk_with_gpt_4o_is_served_by_the_pattern(opted_in: RunningServer) -> None:
    with _openai(opted_in) as client:
        chat = client.chat.completions.create(model="gpt-4o", max_tokens=2,
                                              messages=HELLO)  # type: ignore[arg-type]
        assert chat.model == PATTERNED
        assert client.models.retrieve("gpt-4o-mini").id == PATTERNED


def test_an_unknown_name_is_served_by_the_default_model(opted_in: RunningServer) -> None:
    # llama.cpp's server tests send "model": "test", on its native route too.
    for path, body in [("/v1/chat/completions", {"messages": HELLO, "max_tokens": 2}),
                       ("/completion", {"prompt": "Hello", "n_predict": 2})]:
        answer = httpx.post(opted_in.base_url + path, json={"model": "test", **body},
                            timeout=60)
        assert answer.status_code == 200, answer.text
        assert answer.json()["model"] == DEFAULT_MODEL


def test_exact_names_still_win(opted_in: RunningServer) -> None:
    with _openai(opted_in) as client:
        chat = client.chat.completions.create(model=DEFAULT_MODEL, max_tokens=1,
                                              messages=HELLO)  # type: ignore[arg-type]
    assert chat.model == DEFAULT_MODEL


@pytest.mark.parametrize("name", ["test", "claude-haiku-4-5", "gpt-4o"])
def test_ollama_routes_keep_their_404(opted_in: RunningServer, name: str) -> None:
    answer = httpx.post(f"{opted_in.base_url}/api/chat", timeout=60,
                        json={"model": name, "messages": HELLO, "stream": False})
    assert answer.status_code == 404
    assert "not found" in answer.json()["error"]


def test_without_opting_in_every_such_name_is_a_404(server: RunningServer) -> None:
    with _claude(server) as claude, pytest.raises(anthropic.NotFoundError):
        claude.messages.create(model="claude-haiku-4-5", max_tokens=2,
                               messages=HELLO)  # type: ignore[arg-type]
    with _openai(server) as client, pytest.raises(openai.NotFoundError) as caught:
        client.chat.completions.create(model="gpt-4o", max_tokens=2,
                                       messages=HELLO)  # type: ignore[arg-type]
    assert caught.value.code == "model_not_found"
    answer = httpx.post(server.base_url + "/completion", timeout=60,
                        json={"model": "test", "prompt": "Hello", "n_predict": 2})
    assert answer.status_code == 404


def test_a_pattern_cannot_be_a_model_id(tmp_path_factory: pytest.TempPathFactory) -> None:
    from edge_server.catalogue.store import RegistryError, load_registry

    registry = tmp_path_factory.mktemp("bad-registry") / "registry.toml"
    registry.write_text('[[models]]\nid = "claude-*"\npath = "/nonexistent.gguf"\n')
    with pytest.raises(RegistryError, match="cannot hold"):
        load_registry(registry)
