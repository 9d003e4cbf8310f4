"""Every real chat template of llama.cpp's collection renders our way exactly as
transformers' reference renderer (`render_jinja_template`, what `apply_chat_template`
calls) renders it, for a set of conversations: plain turns, a system message, tools,
assistant tool calls with tool results, parallel calls, earlier reasoning, and template
variables the caller asks for.

Our side is the real prompt path: the request validated as /v1/chat/completions takes
it, its messages and variables as the server prepares them (api/chat/prompt.py), the
template rendered by engine/chat_template.py. The reference gets the same conversation
as a transformers user writes it (tool-call arguments as objects; null fields dropped,
as apply_chat_template drops them). `strftime_now` reads one fixed clock on both sides.
"""

from __future__ import annotations

import copy
import json
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
from conftest import llama_sources

from edge_server.api.openai.chat import tools as tooling
from edge_server.api.openai.chat.prompt import template_messages, template_variables
from edge_server.api.openai.chat.protocol import ChatCompletionRequest
from edge_server.engine.chat_template import ChatTemplate, TemplateError

chat_template_utils = pytest.importorskip("transformers.utils.chat_template_utils")

NOW = datetime(2026, 3, 14, 9, 26, 53)
BOS, EOS = "<s>", "</s>"

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                   "required": ["city"]}}}
TIME = {"type": "function", "function": {
    "name": "get_time", "description": "The local time in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"},
                                                   "utc": {"type": "boolean"}}}}}


def _call(call_id: str, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
    return {"id": call_id, "type": "function",
            "function": {"name": name, "arguments": json.dumps(arguments)}}


USER = {"role": "user", "content": "What is the weather in Paris?"}
CALL = {"role": "assistant", "content": None,
        "tool_calls": [_call("call00001", "get_weather", {"city": "Paris"})]}
RESULT = {"role": "tool", "tool_call_id": "call00001", "content": '{"temp_c": 18}'}

# name -> the request body's fields (messages, tools, template variables).
CONVERSATIONS: dict[str, dict[str, Any]] = {
    "plain": {"messages": [
        {"role": "user", "content": "Hello!"},
        {"role": "assistant", "content": "Hi, how can I help?"},
        {"role": "user", "content": "Tell me a joke."}]},
    "system": {"messages": [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "Hello!"},
        {"role": "assistant", "content": "Hi."},
        {"role": "user", "content": "Name a colour."}]},
    "tools": {"tools": [WEATHER, TIME], "messages": [
        {"role": "system", "content": "You are terse."}, USER]},
    "tool_calls": {"tools": [WEATHER], "messages": [
        USER, CALL, RESULT]},
    "tool_calls_answered": {"tools": [WEATHER], "messages": [
        USER, {**CALL, "content": ""}, RESULT,
        {"role": "assistant", "content": "It is 18 degrees."},
        {"role": "user", "content": "Thanks!"}]},
    "parallel_calls": {"tools": [WEATHER, TIME], "messages": [
        {"role": "user", "content": "Weather and time in Paris?"},
        {"role": "assistant", "content": None, "tool_calls": [
            _call("call00001", "get_weather", {"city": "Paris"}),
            _call("call00002", "get_time", {"city": "Paris", "utc": False})]},
        {"role": "tool", "tool_call_id": "call00001", "content": '{"temp_c": 18}'},
        {"role": "tool", "tool_call_id": "call00002", "content": '{"time": "09:26"}'}]},
    "reasoning": {"messages": [
        {"role": "user", "content": "What is 2 + 2?"},
        {"role": "assistant", "content": "4.", "reasoning_content": "Two plus two is four."},
        {"role": "user", "content": "And 3 + 3?"}]},
    "thinking_off": {"chat_template_kwargs": {"enable_thinking": False}, "messages": [
        {"role": "user", "content": "Hello!"}]},
    "effort": {"reasoning_effort": "low", "messages": [
        {"role": "user", "content": "Hello!"}]},
}

# Where we render differently on purpose: (template, conversation) -> why.
NO_TOOLS = "the template knows no tools: the server describes them in a generic prompt"
EXCEPTIONS: dict[tuple[str, str], str] = {
    (template, conversation): NO_TOOLS
    for template in ("google-gemma-2-2b-it", "llama-cpp-rwkv-world",
                     "microsoft-Phi-3.5-mini-instruct", "HuggingFaceTB-SmolLM3-3B",
                     "deepseek-ai-DeepSeek-R1-Distill-Llama-8B",
                     "deepseek-ai-DeepSeek-R1-Distill-Qwen-32B", "deepseek-ai-DeepSeek-V3.1",
                     "fireworks-ai-llama-3-firefunction-v2")
    for conversation in ("tools", "tool_calls", "tool_calls_answered", "parallel_calls")
}


def _templates() -> list[Path]:
    return sorted((llama_sources() / "models" / "templates").glob("*.jinja"))


def _ours(source: str, body: dict[str, Any]) -> str:
    template = ChatTemplate(source, bos_token=BOS, eos_token=EOS, now=lambda: NOW)
    req = ChatCompletionRequest.model_validate({"model": "m", **copy.deepcopy(body)})
    tools = tooling.active_tools(req)
    items = template_messages(req.messages, template, tools)
    variables = template_variables(template, tools, req.template_kwargs)
    return template.render(items, add_generation_prompt=True, **variables).text


def _reference_messages(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out = []
    for message in copy.deepcopy(messages):
        for call in message.get("tool_calls") or []:
            call["function"]["arguments"] = json.loads(call["function"]["arguments"])
        out.append({k: v for k, v in message.items() if v is not None})
    return out


def _reference(source: str, body: dict[str, Any]) -> str:
    kwargs = dict(body.get("chat_template_kwargs") or {})
    if "reasoning_effort" in body:
        kwargs = {"enable_thinking": body["reasoning_effort"] != "none",
                  "reasoning_effort": body["reasoning_effort"], **kwargs}
    rendered, _ = chat_template_utils.render_jinja_template(
        conversations=[_reference_messages(body["messages"])],
        tools=copy.deepcopy(body.get("tools")), chat_template=source,
        add_generation_prompt=True, bos_token=BOS, eos_token=EOS, **kwargs)
    return str(rendered[0])


class _FixedClock(datetime):
    @classmethod
    def now(cls, tz: Any = None) -> datetime:  # type: ignore[override]
        return NOW


@pytest.fixture(autouse=True)
def _fixed_clock(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(chat_template_utils, "datetime", _FixedClock)


def test_every_template_loads() -> None:
    templates = _templates()
    assert len(templates) >= 70
    for path in templates:
        ChatTemplate(path.read_text(encoding="utf-8"))  # raises if it does not parse


@pytest.mark.parametrize("conversation", sorted(CONVERSATIONS))
def test_renders_as_transformers(conversation: str) -> None:
    body = CONVERSATIONS[conversation]
    compared, differing = 0, []
    for path in _templates():
        source = path.read_text(encoding="utf-8")
        try:
            expected = _reference(source, body)
        except Exception:  # where the reference cannot render, there is nothing to match
            continue
        try:
            got = _ours(source, body)
        except TemplateError as exc:
            got = f"<error: {exc}>"
        if (path.stem, conversation) in EXCEPTIONS:
            continue
        compared += 1
        if got != expected:
            differing.append(path.stem)
    assert not differing, f"{len(differing)} of {compared} templates differ: {differing}"
    assert compared > 0
