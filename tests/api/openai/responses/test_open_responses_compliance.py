"""The Open Responses specification's compliance suite, ported: its cases (basic text,
streaming, system prompt, tool calling plain and streamed, image input, multi-turn) sent
as the suite sends them, each answer and each streamed event validated against the
specification's own JSON schemas (open_responses/openapi.json: its published OpenAPI
document, version 2026-04-24, as the suite's zod schemas are generated from it), then
the suite's own semantic checks; and POST /responses/compact against its CompactResource.

Where the port departs from the suite, it says so: every body adds `temperature: 0` and
`max_output_tokens` (an answer the same on every run and bounded in time on a busy
machine), and the tool cases add `tool_choice: "required"` (whether a 135M model calls a
tool unasked is the model's doing, not the server's). The suite validates with zod
unions, which accept any matching branch: the schemas' `oneOf` is read as `anyOf` here.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import jsonschema
import pytest
from conftest import DEFAULT_MODEL, RunningServer, start_server, stop_server, write_test_projector

SPEC = json.loads((Path(__file__).parent / "open_responses" / "openapi.json").read_text())
MAX_OUTPUT_TOKENS = 256
WEATHER = {
    "type": "function", "name": "get_weather",
    "description": "Get the current weather for a location",
    "parameters": {"type": "object", "properties": {"location": {
        "type": "string", "description": "The city and state, e.g. San Francisco, CA"}},
        "required": ["location"]},
}
# The suite's image: a red heart on white, 32 x 32 pixels.
HEART = ("data:image/png;base64,iVBORw0KGgoAAAANSUhEUgAAACAAAAAgCAIAAAD8GO2jAAABmklEQVR42tyWAaTy"
         "UBzFew/eG4AHz+MBSAHKBiJRGFKwIgQQJKLUIioBIhCAiCAAEizAQIAECaASqFFJq84nudjnaqvuPnxzgP9x"
         "frq5938csPn7PwHTKSoViCIEAYEAMhmoKsU2mUCWEQqB5xEMIp/HaGQG2G6RSuH9HQ7H34rFrtPbdz4jl6Pb"
         "wmEsl3QA1mt4vcRKk8dz9eg6IpF7tt9fzGY0gCgafFRFo5Blc5vLhf3eCOj1yNhM5GRMVK0aATxPZoz09YXj"
         "kQDmczJgquGQAPp9WwCNBgG027YACgUC6HRsAZRKBDAY2AJoNv/ZnwzA6WScznG3p4UAymXGAEkyXrTFAh8f"
         "LAGqagQAyGaZpYsi7bHTNPz8MEj//LxuFPo+UBS8vb0KaLXubrRa7aX0RMLCykwmn0z3+XA4WACcTpCkh9MF"
         "AZpmuVXo+mO/w+/HZvNgbblcUCxaSo/Hyck80Yu6XXDcvfVZr79cvMZjuN2U9O9vKAqjZrfbIZ0mV4TUi9Xq"
         "z6jddNy//7+e3n8Fhf/Llo2kxi8AQyGRoDkmAhAAAAAASUVORK5CYII=")


def _any_of(node: Any) -> Any:
    if isinstance(node, dict):
        return {("anyOf" if k == "oneOf" else k): _any_of(v) for k, v in node.items()}
    if isinstance(node, list):
        return [_any_of(v) for v in node]
    return node


COMPONENTS = _any_of(copy.deepcopy(SPEC["components"]))
STREAM_EVENTS = [branch["$ref"] for branch in SPEC["paths"]["/responses"]["post"][
    "responses"]["200"]["content"]["text/event-stream"]["schema"]["oneOf"]]


def validator(schema: dict[str, Any]) -> jsonschema.Draft202012Validator:
    return jsonschema.Draft202012Validator({**schema, "components": COMPONENTS})


RESOURCE = validator({"$ref": "#/components/schemas/ResponseResource"})
EVENT = validator({"anyOf": [{"$ref": ref} for ref in STREAM_EVENTS]})
COMPACTED = validator({"$ref": "#/components/schemas/CompactResource"})


def schema_errors(checker: jsonschema.Draft202012Validator, instance: Any) -> list[str]:
    return [f"{'.'.join(map(str, e.absolute_path)) or 'root'}: {e.message[:300]}"
            for e in checker.iter_errors(instance)]


CASES: dict[str, dict[str, Any]] = {
    "basic-response": {"input": [
        {"type": "message", "role": "user", "content": "Say hello in exactly 3 words."}]},
    "streaming-response": {"stream": True, "input": [
        {"type": "message", "role": "user", "content": "Count from 1 to 5."}]},
    "system-prompt": {"input": [
        {"type": "message", "role": "system",
         "content": "You are a pirate. Always respond in pirate speak."},
        {"type": "message", "role": "user", "content": "Say hello."}]},
    "tool-calling": {"tools": [WEATHER], "tool_choice": "required", "input": [
        {"type": "message", "role": "user",
         "content": "What's the weather like in San Francisco?"}]},
    "tool-calling-streaming": {"stream": True, "tools": [WEATHER], "tool_choice": "required",
                               "input": [{"type": "message", "role": "user",
                                          "content": "What's the weather like in San Francisco?"}]},
    "image-input": {"input": [{"type": "message", "role": "user", "content": [
        {"type": "input_text", "text": "What do you see in this image? Answer in one sentence."},
        {"type": "input_image", "image_url": HEART}]}]},
    "multi-turn": {"input": [
        {"type": "message", "role": "user", "content": "My name is Alice."},
        {"type": "message", "role": "assistant",
         "content": "Hello Alice! Nice to meet you. How can I help you today?"},
        {"type": "message", "role": "user", "content": "What is my name?"}]},
}
# The suite's semantic checks of each case (besides the schema).
CHECKS = {
    "basic-response": ("output", "completed"),
    "streaming-response": ("events", "completed"),
    "system-prompt": ("output", "completed"),
    "tool-calling": ("output", "function_call"),
    "tool-calling-streaming": ("events", "function_call_events"),
    "image-input": ("output", "completed"),
    "multi-turn": ("output", "completed"),
}


@pytest.fixture(scope="module")
def seeing(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    tmp = tmp_path_factory.mktemp("open-responses")
    projector = write_test_projector(tmp / "mmproj.gguf")
    server = start_server(tmp, "--mmproj", str(projector), "--parallel", "2",
                          "--ctx-size", "4096", name="open-responses")
    yield server
    stop_server(server)


def _events(body: bytes) -> tuple[list[dict[str, Any]], list[str]]:
    """The stream's events, as the suite's SSE parser reads them, with their errors."""
    events, errors = [], []
    for block in body.decode().split("\n\n"):
        data = "".join(line[5:].strip() for line in block.split("\n")
                       if line.startswith("data:"))
        if not data or data == "[DONE]":
            continue
        event = json.loads(data)
        events.append(event)
        errors += [f"event {event.get('type')}: {e}" for e in schema_errors(EVENT, event)]
    return events, errors


def run_case(server: RunningServer, name: str) -> tuple[dict[str, Any], list[str]]:
    body = {"model": DEFAULT_MODEL, "temperature": 0, "max_output_tokens": MAX_OUTPUT_TOKENS,
            **CASES[name]}
    r = httpx.post(f"{server.v1}/responses", json=body, timeout=300)
    assert r.status_code == 200, r.text
    if not body.get("stream"):
        final = r.json()
        return final, schema_errors(RESOURCE, final)
    events, errors = _events(r.content)
    finals = [e["response"] for e in events if e.get("type") in (
        "response.completed", "response.failed", "response.incomplete")]
    assert finals, "the stream has no final response event"
    errors += semantic(name, finals[-1], events)
    return finals[-1], errors + schema_errors(RESOURCE, finals[-1])


def semantic(name: str, response: dict[str, Any], events: list[dict[str, Any]]) -> list[str]:
    errors = []
    for check in CHECKS[name]:
        if check == "output" and not response.get("output"):
            errors.append("Response has no output items")
        if check == "completed" and response.get("status") != "completed":
            errors.append(f"Expected status completed but got {response.get('status')}")
        if check == "function_call" and not any(
                item.get("type") == "function_call" for item in response.get("output", [])):
            errors.append("Expected output item of type function_call but none found")
        if check == "events" and not events:
            errors.append("No streaming events received")
        if check == "function_call_events":
            kinds = [e.get("type") for e in events]
            for want in ("response.function_call_arguments.delta",
                         "response.function_call_arguments.done"):
                if want not in kinds:
                    errors.append(f"Missing {want} event")
            for kind in ("response.output_item.added", "response.output_item.done"):
                if not any(e.get("type") == kind and e.get("item", {}).get("type")
                           == "function_call" for e in events):
                    errors.append(f"Missing {kind} event with function_call item")
    return errors


@pytest.mark.parametrize("name", sorted(CASES))
def test_the_compliance_case_passes(seeing: RunningServer, name: str) -> None:
    response, errors = run_case(seeing, name)
    if not CASES[name].get("stream"):
        errors += semantic(name, response, [])
    assert errors == [], json.dumps(response)[:2000]


def test_compact_answers_a_compact_resource(seeing: RunningServer) -> None:
    r = httpx.post(f"{seeing.v1}/responses/compact", timeout=300, json={
        "model": DEFAULT_MODEL, "input": CASES["multi-turn"]["input"]})
    assert r.status_code == 200, r.text
    assert schema_errors(COMPACTED, r.json()) == []


def test_the_schemas_refuse_what_the_specification_refuses(seeing: RunningServer) -> None:
    """The validators are the specification's, not empty ones: a real answer with a
    required property dropped, or retyped, and an event of no known kind, fail them."""
    answer, errors = run_case(seeing, "basic-response")
    assert errors == []
    for broken in ({k: v for k, v in answer.items() if k != "completed_at"},
                   {**answer, "tools": [{"type": "function"}]},
                   {**answer, "usage": {"input_tokens": "1"}}):
        assert schema_errors(RESOURCE, broken), broken
    assert schema_errors(EVENT, {"type": "response.output_text.delta"})
    assert schema_errors(EVENT, {"type": "response.nothing", "sequence_number": 0})
