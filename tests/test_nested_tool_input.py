"""/v1/messages: a tool call whose input nests deeper than the server returns.

A recursive input_schema (an array of arrays, forced by tool_choice) makes the model
open a bracket with every token. Python's JSON parser recurses per level, so an input
some 1,000 levels deep once made a 500, and a stream that ended without message_stop
(reproduced: 1,100 tokens, 275 s here, too slow for the suite). Inputs deeper than a
request body may nest (64 levels: the same input could not be sent back in the
conversation) are now refused with a 400 before any parse; a stream sends the input as
JSON text, needs no parse, and ends as every stream does.
"""

from __future__ import annotations

import json

import httpx
from conftest import DEFAULT_MODEL, RunningServer

DEPTH_LIMIT = 64
DEEP_TOOL = {
    "name": "deep", "description": "Nests arrays.",
    "input_schema": {"type": "object", "required": ["a"], "properties": {
        "a": {"type": "array", "minItems": 1, "items": {"$ref": "#/properties/a"}}}},
}


def ask(server: RunningServer, *, stream: bool) -> httpx.Response:
    # Every token holds at least one bracket: 100 tokens nest well past the limit.
    return httpx.post(f"{server.v1}/messages", timeout=300, json={
        "model": DEFAULT_MODEL, "max_tokens": 100, "stream": stream, "tools": [DEEP_TOOL],
        "tool_choice": {"type": "tool", "name": "deep"},
        "messages": [{"role": "user", "content": "Go."}]})


def test_too_deep_tool_input_is_a_400_not_a_500(server: RunningServer) -> None:
    r = ask(server, stream=False)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert r.json()["type"] == "error" and error["type"] == "invalid_request_error"
    assert "deeper than 64 levels" in error["message"]


def test_too_deep_tool_input_streams_and_ends_with_message_stop(
        server: RunningServer) -> None:
    r = ask(server, stream=True)
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
    from edge_server.api.messages.blocks import nesting_depth

    assert nesting_depth('{"a": [[1], {"b": [2]}]}') == 4
    assert nesting_depth('{"a": "[[[[{{{{"}') == 1
    assert nesting_depth('{"a": "\\"[[[", "b": [') == 2
    assert nesting_depth("[" * 5000) == 5000  # cut off: what it opened counts
