"""Response objects as the Open Responses specification's schema has them: every
property it requires, typed as it types them, in the answer, in the stream's
`response.created` and its last event (`response.completed` or `.incomplete`), and in
what GET /v1/responses/{id} returns; each echoed function tool carries all of
FunctionTool's keys."""

from __future__ import annotations

import json
from typing import Any

import httpx
import jsonschema
from conftest import DEFAULT_MODEL

NULLABLE_INT = {"type": ["integer", "null"]}
NULLABLE_STRING = {"type": ["string", "null"]}
# The required properties of the specification's ResponseResource, with the types it
# gives them (objects whose inner shape other tests check are typed loosely here).
RESPONSE_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": [
        "id", "object", "created_at", "completed_at", "status", "incomplete_details",
        "model", "previous_response_id", "instructions", "output", "error", "tools",
        "tool_choice", "truncation", "parallel_tool_calls", "text", "top_p",
        "presence_penalty", "frequency_penalty", "top_logprobs", "temperature",
        "reasoning", "user", "usage", "max_output_tokens", "max_tool_calls", "store",
        "background", "service_tier", "metadata", "safety_identifier", "prompt_cache_key",
    ],
    "properties": {
        "id": {"type": "string"},
        "object": {"const": "response"},
        "created_at": {"type": "integer"},
        "completed_at": NULLABLE_INT,
        "status": {"type": "string"},
        "incomplete_details": {"type": ["object", "null"]},
        "model": {"type": "string"},
        "previous_response_id": NULLABLE_STRING,
        "instructions": NULLABLE_STRING,
        "output": {"type": "array"},
        "error": {"type": ["object", "null"]},
        "tools": {"type": "array", "items": {
            "type": "object",
            "required": ["type", "name", "description", "parameters", "strict"],
            "properties": {"type": {"const": "function"}, "name": {"type": "string"},
                           "description": NULLABLE_STRING,
                           "parameters": {"type": ["object", "null"]},
                           "strict": {"type": ["boolean", "null"]}}}},
        "tool_choice": {"type": ["string", "object"]},
        "truncation": {"enum": ["auto", "disabled"]},
        "parallel_tool_calls": {"type": "boolean"},
        "text": {"type": "object"},
        "top_p": {"type": "number"},
        "presence_penalty": {"type": "number"},
        "frequency_penalty": {"type": "number"},
        "top_logprobs": {"type": "integer"},
        "temperature": {"type": "number"},
        "reasoning": {"type": ["object", "null"]},
        "user": NULLABLE_STRING,
        "usage": {"type": ["object", "null"]},
        "max_output_tokens": NULLABLE_INT,
        "max_tool_calls": NULLABLE_INT,
        "store": {"type": "boolean"},
        "background": {"type": "boolean"},
        "service_tier": {"type": "string"},
        "metadata": {"type": "object"},
        "safety_identifier": NULLABLE_STRING,
        "prompt_cache_key": NULLABLE_STRING,
    },
}
TOOL = {"type": "function", "name": "get_weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}
BODY = {"model": DEFAULT_MODEL, "input": "Say hi.", "max_output_tokens": 4,
        "tools": [TOOL], "safety_identifier": "user-1", "prompt_cache_key": "k1"}


# Required keys of the specification's output items, content parts and text events.
ITEM_KEYS = {"message": {"type", "id", "status", "role", "content"},
             "function_call": {"type", "id", "call_id", "name", "arguments", "status"},
             "reasoning": {"type", "id", "summary"}}
OUTPUT_TEXT_KEYS = {"type", "text", "annotations", "logprobs"}
EVENT_KEYS = {"response.output_text.delta": {"type", "sequence_number", "item_id",
                                             "output_index", "content_index", "delta",
                                             "logprobs"},
              "response.output_text.done": {"type", "sequence_number", "item_id",
                                            "output_index", "content_index", "text",
                                            "logprobs"}}


def assert_items(items: list[dict[str, Any]]) -> None:
    for item in items:
        assert ITEM_KEYS[item["type"]] <= set(item), item
        for part in item.get("content") or []:
            if part["type"] == "output_text":
                assert set(part) >= OUTPUT_TEXT_KEYS, part


def test_the_answer_and_the_stored_response_have_every_required_property(
        http: httpx.Client) -> None:
    r = http.post("/v1/responses", json=BODY)
    assert r.status_code == 200, r.text
    answer = r.json()
    jsonschema.validate(answer, RESPONSE_SCHEMA)
    assert_items(answer["output"])
    assert answer["tools"][0]["description"] is None and answer["tools"][0]["strict"] is None
    assert answer["safety_identifier"] == "user-1" and answer["prompt_cache_key"] == "k1"
    assert (answer["completed_at"] is None) == (answer["status"] == "incomplete")
    if answer["completed_at"] is not None:
        assert answer["completed_at"] >= answer["created_at"]
    stored = http.get(f"/v1/responses/{answer['id']}")
    assert stored.status_code == 200, stored.text
    jsonschema.validate(stored.json(), RESPONSE_SCHEMA)


def test_the_stream_carries_the_whole_object_from_its_first_event(
        http: httpx.Client) -> None:
    with http.stream("POST", "/v1/responses", json={**BODY, "stream": True}) as r:
        assert r.status_code == 200
        events = [json.loads(line[len("data: "):]) for line in r.iter_lines()
                  if line.startswith("data: ")]
    by_type = {event["type"]: event for event in events}
    created = by_type["response.created"]
    done = by_type.get("response.completed") or by_type["response.incomplete"]
    for event in (created, done):
        jsonschema.validate(event["response"], RESPONSE_SCHEMA)
    assert_items(done["response"]["output"])
    for event in events:
        if event["type"] in EVENT_KEYS:
            assert EVENT_KEYS[event["type"]] <= set(event), event
        if event["type"] in ("response.output_item.added", "response.output_item.done"):
            assert_items([event["item"]])
    assert created["response"]["completed_at"] is None
    assert created["response"]["status"] == "in_progress"


def test_input_tokens_counts_what_the_response_evaluates(http: httpx.Client) -> None:
    """POST /v1/responses/input_tokens: the prompt tokens the same request's answer
    reports as `usage.input_tokens`, a conversation continued by previous_response_id
    included; nothing is stored."""
    body = {"model": DEFAULT_MODEL, "input": "Name a colour.", "instructions": "Be brief.",
            "tools": [TOOL]}
    counted = http.post("/v1/responses/input_tokens", json=body)
    assert counted.status_code == 200, counted.text
    assert counted.json()["object"] == "response.input_tokens"
    answered = http.post("/v1/responses", json={**body, "max_output_tokens": 2}).json()
    assert counted.json()["input_tokens"] == answered["usage"]["input_tokens"]
    follow = {"model": DEFAULT_MODEL, "input": "Another.",
              "previous_response_id": answered["id"]}
    more = http.post("/v1/responses/input_tokens", json=follow)
    assert more.status_code == 200, more.text
    next_answer = http.post("/v1/responses", json={**follow, "max_output_tokens": 2}).json()
    assert more.json()["input_tokens"] == next_answer["usage"]["input_tokens"]
    # Refused as the create route refuses: by name, before any model work.
    bad = http.post("/v1/responses/input_tokens", json={**body, "top_logprobs": 2})
    assert bad.status_code == 400 and "top_logprobs" in bad.text
