"""separate_reasoning and enable_thinking (as a field, or in chat_template_kwargs as vLLM
and llama-server take it), through a template that opens a think block (as Qwen3- and
DeepSeek-R1-style templates do) and reads a variable of the caller's own (`note`)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from conftest import RunningServer, start_server, stop_server

from edge_server.api.openai.chat.reasoning import ReasoningSplitter

THINKING_TEMPLATE = (
    "{% if note %}{{ note }}\n{% endif %}"
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n"
    "{% if enable_thinking %}<think>\n{% else %}<think>\n\n</think>\n\n{% endif %}{% endif %}"
)
MODEL = "smollm2-135m-instruct"


@pytest.fixture(scope="module")
def thinking_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    tmp = tmp_path_factory.mktemp("thinking")
    template = Path(tmp / "template.jinja")
    template.write_text(THINKING_TEMPLATE)
    server = start_server(tmp, "--chat-template-file", str(template), "--parallel", "2",
                          "--ctx-size", "2048", name="thinking")
    yield server
    stop_server(server)


@pytest.fixture(scope="module")
def forced(thinking_server: RunningServer) -> tuple[dict[str, int], str]:
    """A logit_bias that makes every generated token " sky", and that token's text: the
    answer is then known whatever the model would write (it could write `</think>`)."""
    [token] = httpx.post(f"{thinking_server.base_url}/tokenize",
                         json={"model": MODEL, "content": " sky"}).json()["tokens"]
    text = httpx.post(f"{thinking_server.base_url}/detokenize",
                      json={"model": MODEL, "tokens": [token]}).json()["content"]
    return {str(token): 100}, text


def post(server: RunningServer, forced: tuple[dict[str, int], str], **body) -> dict:
    r = httpx.post(f"{server.v1}/chat/completions", json={
        "model": MODEL, "messages": [{"role": "user", "content": "Why is the sky blue?"}],
        "max_tokens": 12, "temperature": 0, "ignore_eos": True, "logit_bias": forced[0],
        **body}, timeout=60)
    assert r.status_code == 200, r.text
    return r.json()


def test_reasoning_goes_to_reasoning_content(thinking_server, forced) -> None:
    plain = post(thinking_server, forced, enable_thinking=True)["choices"][0]["message"]["content"]
    assert plain == forced[1] * 12
    split = post(thinking_server, forced, separate_reasoning=True,
                 enable_thinking=True)["choices"][0]["message"]
    assert split["reasoning_content"] in (plain, plain.strip())
    assert split["content"] in (None, "")


def test_enable_thinking_reaches_the_template(thinking_server, forced) -> None:
    on = post(thinking_server, forced, separate_reasoning=True, enable_thinking=True)
    off = post(thinking_server, forced, separate_reasoning=True, enable_thinking=False)
    assert off["usage"]["prompt_tokens"] > on["usage"]["prompt_tokens"]
    message = off["choices"][0]["message"]
    assert message["content"] in (forced[1] * 12, (forced[1] * 12).strip())
    assert "reasoning_content" not in message


def test_chat_template_kwargs_reach_the_template(thinking_server, forced) -> None:
    off = post(thinking_server, forced, separate_reasoning=True, enable_thinking=False)
    # The kwarg, and reasoning_effort "none", mean what the field means; the kwarg wins.
    for body in ({"chat_template_kwargs": {"enable_thinking": False}},
                 {"reasoning_effort": "none"},
                 {"enable_thinking": True, "chat_template_kwargs": {"enable_thinking": False}}):
        kwarg = post(thinking_server, forced, separate_reasoning=True, **body)
        assert kwarg["usage"] == off["usage"]
        assert kwarg["choices"][0]["message"] == off["choices"][0]["message"]
    base = thinking_server.base_url
    messages = [{"role": "user", "content": "Hi"}]
    prompt = httpx.post(f"{base}/apply-template", json={
        "messages": messages, "chat_template_kwargs": {"enable_thinking": False}}).json()
    assert prompt["prompt"].endswith("<think>\n\n</think>\n\n")
    # A variable of the caller's own is caller text: its control text stays plain text.
    note = "Note <|im_end|> this."
    with_note = httpx.post(f"{base}/apply-template", json={
        "messages": messages, "chat_template_kwargs": {"note": note}}).json()["prompt"]
    assert with_note.startswith(note + "\n")
    [end] = httpx.post(f"{base}/tokenize", json={"content": "<|im_end|>"}).json()["tokens"]
    tokens = httpx.post(f"{base}/tokenize", json={
        "messages": messages, "chat_template_kwargs": {"note": note}}).json()["tokens"]
    assert tokens.count(end) == 1  # the template's own, after the message


def test_reasoning_streams_as_reasoning_deltas(thinking_server, forced) -> None:
    with httpx.stream("POST", f"{thinking_server.v1}/chat/completions", json={
        "model": MODEL, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 8,
        "stream": True, "separate_reasoning": True, "enable_thinking": True, "ignore_eos": True,
        "temperature": 0, "logit_bias": forced[0]}, timeout=60) as r:
        deltas = [json.loads(line[6:])["choices"][0]["delta"] for line in r.iter_lines()
                  if line.startswith("data: {")]
    reasoning = "".join(d.get("reasoning_content") or "" for d in deltas)
    assert reasoning.strip() == (forced[1] * 8).strip()
    assert not any(d.get("content") for d in deltas)


def test_splitter_handles_tags_split_across_deltas() -> None:
    splitter = ReasoningSplitter()
    parts = ["<th", "ink>let me", " think</thi", "nk>\n\nThe answer", " is 4."]
    reasoning, content = "", ""
    for part in parts:
        r, c = splitter.push(part)
        reasoning, content = reasoning + r, content + c
    r, c = splitter.finish()
    reasoning, content = reasoning + r, content + c
    assert reasoning == "let me think"
    assert content == "The answer is 4."


def test_splitter_starting_inside() -> None:
    splitter = ReasoningSplitter(starts_inside=True)
    assert splitter.push("step one</think>done") == ("step one", "done")


def test_enable_thinking_is_passed_only_when_asked(thinking_server, forced) -> None:
    # Nothing asked: the template's own default (here: enable_thinking undefined, off).
    default = post(thinking_server, forced, separate_reasoning=True)
    off = post(thinking_server, forced, separate_reasoning=True, enable_thinking=False)
    assert default["usage"]["prompt_tokens"] == off["usage"]["prompt_tokens"]
    on = post(thinking_server, forced, separate_reasoning=True, reasoning_effort="low")
    assert on["usage"]["prompt_tokens"] < default["usage"]["prompt_tokens"]
    prompt = httpx.post(f"{thinking_server.base_url}/apply-template", json={
        "messages": [{"role": "user", "content": "Hi"}]}).json()["prompt"]
    assert prompt.endswith("<think>\n\n</think>\n\n")
