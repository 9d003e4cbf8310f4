"""Tool inputs and schemas nested past the 64 levels a request body may, on every door.

A recursive input_schema (an array of arrays, forced by tool_choice) makes the model
open a bracket with every token. Python's JSON parser recurses per level, so an input
some 1,000 levels deep once made a 500, and a stream that ended without message_stop
(1,100 tokens, 275 s). A whole answer is now refused with a 400 the moment its input
nests deeper than a request body may (64 levels: the same input could not be sent back
in the conversation), so a max_tokens of 1,200 costs some 65 tokens; a stream sends the
input as JSON text, needs no parse, and ends as every stream does.

In a request, nesting is refused before anything parses it further: a 400 that names
the field (`messages[1].content[0].input.a.a…`), in each door's error shape, within a
fraction of a second at 1,200 and 5,000 levels.
"""

from __future__ import annotations

import json
import time

import httpx
import pytest
from conftest import DEFAULT_MODEL, RunningServer

DEPTH_LIMIT = 64
DEEP_TOOL = {
    "name": "deep", "description": "Nests arrays.",
    "input_schema": {"type": "object", "required": ["a"], "properties": {
        "a": {"type": "array", "minItems": 1, "items": {"$ref": "#/properties/a"}}}},
}


FAST_S = 60  # generous for a loaded machine: the whole answer took minutes before


def ask(server: RunningServer, *, stream: bool, max_tokens: int = 100) -> httpx.Response:
    # Every token holds at least one bracket: 100 tokens nest well past the limit.
    return httpx.post(f"{server.v1}/messages", timeout=900, json={
        "model": DEFAULT_MODEL, "max_tokens": max_tokens, "stream": stream,
        "tools": [DEEP_TOOL], "tool_choice": {"type": "tool", "name": "deep"},
        "messages": [{"role": "user", "content": "Go."}]})


def test_too_deep_tool_input_is_a_400_not_a_500(server: RunningServer) -> None:
    started = time.monotonic()
    r = ask(server, stream=False, max_tokens=1200)  # room for 1,000+ levels
    took = time.monotonic() - started
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert r.json()["type"] == "error" and error["type"] == "invalid_request_error"
    assert "deeper than 64 levels" in error["message"]
    assert took < FAST_S, f"{took:.0f} s: generation went on past the limit"


def test_too_deep_tool_input_streams_and_ends_with_message_stop(
        server: RunningServer) -> None:
    # At worst every other token is a single space (the grammar allows one between
    # brackets): 140 tokens still open more than 64 brackets.
    r = ask(server, stream=True, max_tokens=140)
    assert r.status_code == 200
    events = [line[7:] for line in r.text.splitlines() if line.startswith("event: ")]
    assert events[-1] == "message_stop" and "error" not in events
    partial = "".join(
        json.loads(line[6:])["delta"]["partial_json"]
        for line in r.text.splitlines()
        if line.startswith("data: ") and '"input_json_delta"' in line)
    assert partial.count("[") > DEPTH_LIMIT  # the input as the model wrote it
    assert httpx.get(f"{server.base_url}/health").status_code == 200


def test_nesting_depth_counts_brackets_outside_strings() -> None:
    from edge_server.api.http.limits import nesting_depth

    assert nesting_depth('{"a": [[1], {"b": [2]}]}') == 4
    assert nesting_depth('{"a": "[[[[{{{{"}') == 1
    assert nesting_depth('{"a": "\\"[[[", "b": [') == 2
    assert nesting_depth("[" * 5000) == 5000  # cut off: what it opened counts


def nested_object(depth: int) -> str:
    """JSON text `{"a": {"a": … 1}}` nesting `depth` levels (built as text)."""
    return '{"a":' * depth + "1" + "}" * depth


def nested_schema(depth: int) -> str:
    return ('{"type":"object","properties":{"a":' * depth + '{"type":"integer"}'
            + "}}" * depth)


def conversation(input_text: str) -> str:
    return (
        f'{{"model":"{DEFAULT_MODEL}","max_tokens":4,"messages":['
        '{"role":"user","content":"Go."},'
        f'{{"role":"assistant","content":[{{"type":"tool_use","id":"toolu_1","name":"deep",'
        f'"input":{input_text}}}]}},'
        '{"role":"user","content":[{"type":"tool_result","tool_use_id":"toolu_1",'
        '"content":"ok"}]}],'
        '"tools":[{"name":"deep","input_schema":{"type":"object"}}]}')


def chat_with_call(arguments: str) -> str:
    return (f'{{"model":"{DEFAULT_MODEL}","max_tokens":4,"messages":['
            '{"role":"user","content":"Go."},'
            '{"role":"assistant","tool_calls":[{"id":"c1","type":"function",'
            f'"function":{{"name":"deep","arguments":{arguments}}}}}]}},'
            '{"role":"tool","tool_call_id":"c1","content":"ok"}]}')


def requests(depth: int) -> list[tuple[str, str, str, str]]:
    """(door, path, body, the field the error names)."""
    deep, schema = nested_object(depth), nested_schema(depth)
    tool = '"tools":[{"type":"function","function":{"name":"deep","parameters":%s}}]'
    simple = (f'"model":"{DEFAULT_MODEL}","max_tokens":4,'
              '"messages":[{"role":"user","content":"Go."}]')
    return [
        ("anthropic", "/v1/messages", conversation(deep), "messages[1].content[0].input.a"),
        ("anthropic", "/v1/messages",
         f'{{{simple},"tools":[{{"name":"deep","input_schema":{schema}}}]}}',
         "tools[0].input_schema.properties.a"),
        ("openai", "/v1/chat/completions", chat_with_call(json.dumps(deep)),
         "messages[1].tool_calls[0].function.arguments"),
        ("openai", "/v1/chat/completions", chat_with_call(deep),
         "messages[1].tool_calls[0].function.arguments.a"),
        ("openai", "/v1/chat/completions", f'{{{simple},{tool % schema}}}',
         "tools[0].function.parameters.properties.a"),
        ("openai", "/v1/chat/completions",
         f'{{{simple},"response_format":{{"type":"json_schema","json_schema":'
         f'{{"name":"o","schema":{schema}}}}}}}',
         "response_format.json_schema.schema.properties.a"),
        ("ollama", "/api/chat",
         f'{{"model":"{DEFAULT_MODEL}","stream":false,"messages":['
         '{"role":"user","content":"Go."},{"role":"assistant","content":"",'
         f'"tool_calls":[{{"function":{{"name":"deep","arguments":{deep}}}}}]}}]}}',
         "messages[1].tool_calls[0].function.arguments.a"),
        ("ollama", "/api/chat",
         f'{{"model":"{DEFAULT_MODEL}","stream":false,"messages":['
         f'{{"role":"user","content":"Go."}}],"format":{schema}}}',
         "format.properties.a"),
    ]


@pytest.mark.parametrize("depth", [1_200, 5_000])
def test_deep_nesting_in_a_request_is_a_fast_400_naming_the_field(
        server: RunningServer, depth: int) -> None:
    with httpx.Client(base_url=server.base_url, timeout=60) as client:
        for door, path, body, field in requests(depth):
            started = time.monotonic()
            r = client.post(path, content=body, headers={"Content-Type": "application/json"})
            took = time.monotonic() - started
            assert r.status_code == 400, (door, field, r.text)
            assert took < 5, (door, field, took)
            answer = r.json()
            if door == "anthropic":
                assert answer["type"] == "error", answer
                assert answer["error"]["type"] == "invalid_request_error"
                message = answer["error"]["message"]
            elif door == "ollama":
                message = answer["error"]
            else:
                message = answer["error"]["message"]
                assert answer["error"]["param"].startswith(field), answer
            assert field in message and "deeper than" in message, (door, message)
            assert "Traceback" not in r.text
        assert client.get("/health").status_code == 200
