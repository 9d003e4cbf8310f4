"""Real model-family templates served through HTTP (the real model with each family's
template as its `chat_template_file`): templates with `{% generation %}` load and serve,
Gemma 2 (no system role) answers with tools, a template's own raise_exception is a 400
naming its message on every door that renders, and a template's defaults hold where the
caller asks for nothing (Apertus deliberates only when asked), and earlier reasoning
reaches the template from every door that replays it."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest
from conftest import RunningServer, llama_sources, start_server, stop_server

from edge_server.catalogue.default_model import default_model_path

FAMILIES = {
    "gemma2": "google-gemma-2-2b-it",
    "laguna": "poolside-Laguna-XS.2",
    "lfm25": "LFM2.5-8B-A1B",
    "apertus": "Apertus-8B-Instruct",
    "qwen3": "Qwen-Qwen3-0.6B",  # keeps the reasoning of turns after the last user query
    "gpt-oss": "openai-gpt-oss-120b",  # reasons in harmony's analysis channel, no <think>
}
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}
HELLO = [{"role": "user", "content": "Hello!"}]


@pytest.fixture(scope="module")
def families(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    tmp = tmp_path_factory.mktemp("families")
    templates = llama_sources() / "models" / "templates"
    registry = tmp / "registry.toml"
    registry.write_text("".join(
        f'[[models]]\nid = "{name}"\npath = "{default_model_path()}"\nctx_size = 2048\n'
        f'chat_template_file = "{templates / (stem + ".jinja")}"\n\n'
        for name, stem in FAMILIES.items()))
    server = start_server(tmp, "--registry", str(registry), "--ctx-size", "2048",
                          "--parallel", "1", name="families")
    yield server
    stop_server(server)
    assert "Traceback" not in server.log_text()


def _chat(server: RunningServer, model: str, **fields: object) -> httpx.Response:
    return httpx.post(f"{server.v1}/chat/completions", timeout=120, json={
        "model": model, "max_tokens": 3, "temperature": 0, **fields})


def _prompt(server: RunningServer, model: str, **fields: object) -> str:
    r = httpx.post(f"{server.base_url}/apply-template", timeout=60,
                   json={"model": model, **fields})
    assert r.status_code == 200, r.text
    return str(r.json()["prompt"])


@pytest.mark.parametrize("model", ["laguna", "lfm25"])
def test_generation_block_templates_serve(families: RunningServer, model: str) -> None:
    r = _chat(families, model, messages=HELLO)
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["completion_tokens"] >= 1


def test_gemma2_answers_with_tools(families: RunningServer) -> None:
    r = _chat(families, "gemma2", messages=HELLO, tools=[WEATHER])
    assert r.status_code == 200, r.text
    prompt = _prompt(families, "gemma2", messages=HELLO, tools=[WEATHER])
    # No system turn (the template refuses one): the tools lead the first user turn.
    assert "<start_of_turn>user\nYou can call functions." in prompt
    assert prompt.endswith("Hello!<end_of_turn>\n<start_of_turn>model\n")


SYSTEM = "You are terse."
REFUSED = "System role not supported"  # Gemma 2's own raise_exception


@pytest.mark.parametrize("door", ["chat", "apply-template", "messages", "ollama", "responses"])
def test_template_exception_is_a_400_naming_it(families: RunningServer, door: str) -> None:
    base = families.base_url
    with_system = [{"role": "system", "content": SYSTEM}, *HELLO]
    requests = {
        "chat": (f"{base}/v1/chat/completions", {"messages": with_system, "max_tokens": 2}),
        "apply-template": (f"{base}/apply-template", {"messages": with_system}),
        "messages": (f"{base}/v1/messages", {"system": SYSTEM, "messages": HELLO,
                                             "max_tokens": 2}),
        "ollama": (f"{base}/api/chat", {"messages": with_system, "stream": False,
                                        "options": {"num_predict": 2}}),
        "responses": (f"{base}/v1/responses", {"instructions": SYSTEM, "input": "Hello!",
                                               "max_output_tokens": 16}),
    }
    url, body = requests[door]
    r = httpx.post(url, json={"model": "gemma2", **body}, timeout=60)
    assert r.status_code == 400, r.text
    assert REFUSED in r.text
    assert "Traceback" not in r.text


def test_template_defaults_hold_unless_asked(families: RunningServer) -> None:
    assert "Deliberation: disabled" in _prompt(families, "apertus", messages=HELLO)
    asked = _prompt(families, "apertus", messages=HELLO,
                    chat_template_kwargs={"enable_thinking": True})
    assert "Deliberation: enabled" in asked


THOUGHT = "The user wants the weather, so I call the tool."


def _tool_turns(thought: str | None) -> dict[str, list[dict[str, object]]]:
    """One tool exchange whose assistant turn carries `thought`, as each door writes it
    (Qwen 3 shows the reasoning of turns after the last user query)."""
    ask = {"role": "user", "content": "Weather in Paris?"}
    chat_call = {"role": "assistant", "content": "", "tool_calls": [{
        "id": "call00001", "type": "function",
        "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]}
    ollama_call = {"role": "assistant", "content": "", "tool_calls": [{
        "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]}
    use = {"type": "tool_use", "id": "toolu_1", "name": "get_weather",
           "input": {"city": "Paris"}}
    blocks: list[dict[str, object]] = [use]
    if thought is not None:
        chat_call["reasoning_content"] = thought
        ollama_call["thinking"] = thought
        blocks = [{"type": "thinking", "thinking": thought, "signature": ""}, use]
    return {
        "chat": [ask, chat_call, {"role": "tool", "tool_call_id": "call00001",
                                  "content": "18 C"}],
        "ollama": [ask, ollama_call, {"role": "tool", "tool_name": "get_weather",
                                      "content": "18 C"}],
        "messages": [ask, {"role": "assistant", "content": blocks}, {"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "toolu_1", "content": "18 C"}]}],
    }


def _prompt_tokens(server: RunningServer, door: str, thought: str | None) -> int:
    base, messages = server.base_url, _tool_turns(thought)[door]
    if door == "chat":
        r = httpx.post(f"{base}/tokenize", json={"model": "qwen3", "messages": messages,
                                                 "tools": [WEATHER]}, timeout=60)
        assert r.status_code == 200, r.text
        return len(r.json()["tokens"])
    if door == "ollama":
        r = httpx.post(f"{base}/api/chat", timeout=120, json={
            "model": "qwen3", "messages": messages, "stream": False,
            "tools": [WEATHER], "options": {"num_predict": 1}})
        assert r.status_code == 200, r.text
        return int(r.json()["prompt_eval_count"])
    r = httpx.post(f"{base}/v1/messages/count_tokens", timeout=60, json={
        "model": "qwen3", "messages": messages, "tools": [{
            "name": "get_weather", "input_schema": WEATHER["function"]["parameters"]}]})
    assert r.status_code == 200, r.text
    return int(r.json()["input_tokens"])


@pytest.mark.parametrize("door", ["chat", "ollama", "messages"])
def test_earlier_reasoning_reaches_the_template(families: RunningServer, door: str) -> None:
    without = _prompt_tokens(families, door, None)
    with_thought = _prompt_tokens(families, door, THOUGHT)
    assert with_thought > without + 5  # the thought's words, inside <think> … </think>


@pytest.mark.parametrize(("model", "thinks"), [("gpt-oss", True), ("qwen3", True),
                                                ("gemma2", False)])
def test_ollama_show_names_thinking_by_the_familys_markers(
        families: RunningServer, model: str, thinks: bool) -> None:
    r = httpx.post(f"{families.base_url}/api/show", json={"model": model}, timeout=60)
    assert r.status_code == 200, r.text
    assert ("thinking" in r.json()["capabilities"]) is thinks
