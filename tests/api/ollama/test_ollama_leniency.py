"""Ollama's leniency: every option some Ollama release accepts is accepted (applied, or
type-checked and ignored), `think` levels are chat's reasoning_effort, and LangChain's
OllamaEmbeddings with `num_ctx` embeds; on the real default model over real HTTP."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import ollama
import pytest
from conftest import DEFAULT_MODEL, RunningServer, start_server, stop_server

# Ollama's docs/api.md, "Generate request (With options)": the request as documented
# ("This example sets every available option"), on this server's model; num_predict 12
# rather than 100, to keep the test short.
DOCUMENTED_OPTIONS: dict[str, Any] = {
    "num_keep": 5, "seed": 42, "num_predict": 12, "draft_num_predict": 4, "top_k": 20,
    "top_p": 0.9, "min_p": 0.0, "typical_p": 0.7, "repeat_last_n": 33, "temperature": 0.8,
    "repeat_penalty": 1.2, "presence_penalty": 1.5, "frequency_penalty": 1.0,
    "penalize_newline": True, "stop": ["\n", "user:"], "numa": False, "num_ctx": 1024,
    "num_batch": 2, "num_gpu": 1, "main_gpu": 0, "use_mmap": True, "num_thread": 8,
}
# The same document's earlier releases also listed these.
OLDER_OPTIONS: dict[str, Any] = {
    "tfs_z": 0.5, "mirostat": 1, "mirostat_tau": 0.8, "mirostat_eta": 0.6, "low_vram": False,
    "vocab_only": False, "use_mlock": False, "f16_kv": True, "logits_all": False,
    "embedding_only": False, "rope_frequency_base": 10000.0, "rope_frequency_scale": 1.0,
    "num_gqa": 1,
}
HELLO = [{"role": "user", "content": "Why is the sky blue?"}]


@pytest.fixture()
def oc(server: RunningServer) -> ollama.Client:
    return ollama.Client(host=server.base_url, timeout=300)


def test_documented_options_example_is_answered(server: RunningServer) -> None:
    http = httpx.Client(base_url=server.base_url, timeout=300)
    r = http.post("/api/generate", json={"model": DEFAULT_MODEL, "prompt": "Why is the sky "
                                         "blue?", "stream": False, "options": DOCUMENTED_OPTIONS})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["done"] and 0 < body["eval_count"] <= 12
    assert "\n" not in body["response"]  # its stop strings apply
    chat = http.post("/api/chat", json={"model": DEFAULT_MODEL, "messages": HELLO,
                                        "stream": False,
                                        "options": {**DOCUMENTED_OPTIONS, **OLDER_OPTIONS}})
    assert chat.status_code == 200, chat.text


def test_ignored_options_change_nothing_and_applied_ones_apply(oc: ollama.Client) -> None:
    plain = {"num_predict": 8, "temperature": 0}
    runner = {"num_thread": 3, "num_batch": 7, "num_gpu": 0, "use_mmap": False,
              "draft_num_predict": 2, "tfs_z": 0.5, "penalize_newline": False}
    base = oc.generate(model=DEFAULT_MODEL, prompt="Name a colour.", options=plain)
    same = oc.generate(model=DEFAULT_MODEL, prompt="Name a colour.", options={**plain, **runner})
    assert same.response == base.response and same.eval_count == base.eval_count
    # num_ctx bounds prompt plus answer: a prompt longer than it is refused by name.
    with pytest.raises(ollama.ResponseError) as small:
        oc.generate(model=DEFAULT_MODEL, prompt="word " * 40, options={"num_ctx": 16})
    assert small.value.status_code == 400 and "num_ctx" in small.value.error


@pytest.mark.parametrize(("options", "name"), [
    ({"num_batch": "2"}, "num_batch"), ({"numa": "yes"}, "numa"), ({"main_gpu": -3}, "main_gpu"),
    ({"penalize_newline": 1}, "penalize_newline"), ({"num_gpus": 1}, "num_gpus"),
])
def test_wrong_types_and_unknown_names_are_refused(http: httpx.Client, options: dict[str, Any],
                                                   name: str) -> None:
    for path, body in (("/api/chat", {"messages": HELLO, "stream": False}),
                       ("/api/embed", {"input": "x"})):
        r = http.post(path, json={"model": DEFAULT_MODEL, "options": options, **body})
        assert r.status_code == 400 and f"options.{name}" in r.json()["error"], r.text


def test_embed_applies_num_ctx(oc: ollama.Client) -> None:
    text = "The sky is blue because of Rayleigh scattering of sunlight. " * 4
    whole = oc.embed(model=DEFAULT_MODEL, input=text)
    cut = oc.embed(model=DEFAULT_MODEL, input=text, options={"num_ctx": 8, "temperature": 0.5})
    assert cut.prompt_eval_count == 8 < (whole.prompt_eval_count or 0)
    assert cut.embeddings[0] != whole.embeddings[0]
    with pytest.raises(ollama.ResponseError) as refused:
        oc.embed(model=DEFAULT_MODEL, input=text, truncate=False, options={"num_ctx": 8})
    assert refused.value.status_code == 400
    legacy = oc.embeddings(model=DEFAULT_MODEL, prompt=text, options={"num_ctx": 8})
    assert legacy.embedding == pytest.approx(cut.embeddings[0], abs=1e-5)


def test_langchain_ollama_embeddings_with_num_ctx(server: RunningServer) -> None:
    from langchain_ollama import OllamaEmbeddings

    embedder = OllamaEmbeddings(base_url=server.base_url, model=DEFAULT_MODEL, num_ctx=2048)
    vectors = embedder.embed_documents(["first text", "second text"])
    assert len(vectors) == 2 and len(vectors[0]) == 576
    assert len(embedder.embed_query("a question")) == 576


# A template that reads the effort (as gpt-oss's does) and opens a think block.
EFFORT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n"
    "{% if reasoning_effort %}Reasoning effort: {{ reasoning_effort }}.\n{% endif %}"
    "{% if enable_thinking %}<think>\n{% else %}<think>\n\n</think>\n\n{% endif %}{% endif %}"
)


@pytest.fixture(scope="module")
def effort_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    tmp = tmp_path_factory.mktemp("effort")
    template = Path(tmp / "template.jinja")
    template.write_text(EFFORT_TEMPLATE)
    server = start_server(tmp, "--chat-template-file", str(template), "--ctx-size", "1024",
                          name="effort")
    yield server
    stop_server(server)
    assert "Traceback" not in server.log_text()


def _prompt_tokens(server: RunningServer, think: Any) -> int:
    r = httpx.post(f"{server.base_url}/api/chat", json={
        "model": DEFAULT_MODEL, "messages": HELLO, "think": think, "stream": False,
        "options": {"num_predict": 2, "temperature": 0}}, timeout=300)
    assert r.status_code == 200, r.text
    return int(r.json()["prompt_eval_count"])


def _openai_prompt_tokens(server: RunningServer, effort: str) -> int:
    r = httpx.post(f"{server.v1}/chat/completions", json={
        "model": DEFAULT_MODEL, "messages": HELLO, "reasoning_effort": effort,
        "max_tokens": 2, "temperature": 0}, timeout=300)
    assert r.status_code == 200, r.text
    return int(r.json()["usage"]["prompt_tokens"])


def test_think_levels_are_chats_reasoning_effort(effort_server: RunningServer) -> None:
    on, off = _prompt_tokens(effort_server, True), _prompt_tokens(effort_server, False)
    assert off > on  # false closes the think block: the template is told not to think
    for think, effort in (("low", "low"), ("medium", "medium"), ("high", "high"),
                          ("max", "xhigh")):
        tokens = _prompt_tokens(effort_server, think)
        assert tokens > on  # the level reached the template
        assert tokens == _openai_prompt_tokens(effort_server, effort)
    with httpx.stream("POST", f"{effort_server.base_url}/api/chat", json={
            "model": DEFAULT_MODEL, "messages": HELLO, "think": "high",
            "options": {"num_predict": 6, "temperature": 0}}, timeout=300) as r:
        assert r.status_code == 200
        lines = [line for line in r.iter_lines() if line]
    assert '"done":true' in lines[-1].replace(" ", "")
