"""separate_reasoning and enable_thinking, through a template that opens a think block
(as Qwen3- and DeepSeek-R1-style templates do)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from conftest import RunningServer, start_server, stop_server

from edge_server.api.chat.reasoning import ReasoningSplitter

THINKING_TEMPLATE = (
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


def post(server: RunningServer, **body) -> dict:
    r = httpx.post(f"{server.v1}/chat/completions", json={
        "model": MODEL, "messages": [{"role": "user", "content": "Why is the sky blue?"}],
        "max_tokens": 12, "temperature": 0, "ignore_eos": True, **body}, timeout=60)
    assert r.status_code == 200, r.text
    return r.json()


def test_reasoning_goes_to_reasoning_content(thinking_server) -> None:
    plain = post(thinking_server)["choices"][0]["message"]["content"]
    split = post(thinking_server, separate_reasoning=True)["choices"][0]["message"]
    assert split["reasoning_content"] == plain.strip() or split["reasoning_content"] == plain
    assert split["content"] in (None, "")


def test_enable_thinking_reaches_the_template(thinking_server) -> None:
    on = post(thinking_server, separate_reasoning=True)
    off = post(thinking_server, separate_reasoning=True, enable_thinking=False)
    assert off["usage"]["prompt_tokens"] > on["usage"]["prompt_tokens"]
    message = off["choices"][0]["message"]
    assert message["content"]
    assert "reasoning_content" not in message


def test_reasoning_streams_as_reasoning_deltas(thinking_server) -> None:
    with httpx.stream("POST", f"{thinking_server.v1}/chat/completions", json={
        "model": MODEL, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 8,
        "stream": True, "separate_reasoning": True, "ignore_eos": True,
        "temperature": 0}, timeout=60) as r:
        deltas = [json.loads(line[6:])["choices"][0]["delta"] for line in r.iter_lines()
                  if line.startswith("data: {")]
    assert any(d.get("reasoning_content") for d in deltas)
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
