"""tools: a required tool call's arguments parse and validate against its function's
parameters, streamed or not, through the OpenAI client and raw HTTP."""

from __future__ import annotations

import json

import jsonschema
import pytest
from conftest import DEFAULT_MODEL, JSON_MESSAGES

FUNCTIONS = [
    {
        "name": "get_weather",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "maxLength": 20},
                "unit": {"enum": ["celsius", "fahrenheit"]},
            },
            "required": ["city", "unit"],
        },
    },
    {
        "name": "add",
        "parameters": {
            "type": "object",
            "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
            "required": ["a", "b"],
        },
    },
    {
        "name": "send_email",
        "parameters": {
            "type": "object",
            "properties": {
                "to": {"type": "string", "maxLength": 30},
                "subject": {"type": "string", "maxLength": 30},
                "urgent": {"type": "boolean"},
            },
            "required": ["to", "subject"],
        },
    },
    {
        "name": "set_alarm",
        "parameters": {
            "type": "object",
            "properties": {
                "hour": {"type": "integer", "minimum": 0, "maximum": 23},
                "minute": {"type": "integer", "minimum": 0, "maximum": 59},
            },
            "required": ["hour", "minute"],
        },
    },
    {
        "name": "search",
        "parameters": {
            "type": "object",
            "properties": {
                "query": {"type": "string", "maxLength": 30},
                "limit": {"type": "integer", "minimum": 1, "maximum": 10},
            },
            "required": ["query"],
        },
    },
    {
        "name": "create_event",
        "parameters": {
            "type": "object",
            "properties": {
                "title": {"type": "string", "maxLength": 20},
                "date": {"type": "string", "format": "date"},
                "attendees": {
                    "type": "array",
                    "items": {"type": "string", "maxLength": 10},
                    "maxItems": 3,
                },
            },
            "required": ["title", "date"],
        },
    },
    {
        "name": "rate",
        "parameters": {
            "type": "object",
            "properties": {"stars": {"type": "number", "minimum": 0, "maximum": 5}},
            "required": ["stars"],
        },
    },
    {
        "name": "toggle",
        "parameters": {
            "type": "object",
            "properties": {"on": {"type": "boolean"}},
            "required": ["on"],
        },
    },
    {
        "name": "move",
        "parameters": {
            "type": "object",
            "properties": {
                "to": {
                    "type": "object",
                    "properties": {"x": {"type": "integer"}, "y": {"type": "integer"}},
                    "required": ["x", "y"],
                }
            },
            "required": ["to"],
        },
    },
    {"name": "no_args", "parameters": {"type": "object", "properties": {}}},
]


@pytest.mark.parametrize("function", FUNCTIONS, ids=[f["name"] for f in FUNCTIONS])
def test_required_tool_call_has_valid_arguments(client, function: dict) -> None:
    tools = [{"type": "function", "function": f} for f in FUNCTIONS]
    r = client.chat.completions.create(
        model=DEFAULT_MODEL,
        messages=[{"role": "user", "content": f"Please use {function['name']}."}],
        tools=tools,
        tool_choice={"type": "function", "function": {"name": function["name"]}},
        max_tokens=400,
        temperature=0.5,
        seed=4,
    )
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls"
    [call] = choice.message.tool_calls
    assert call.type == "function" and call.id.startswith("call_")
    assert call.function.name == function["name"]
    jsonschema.validate(json.loads(call.function.arguments), function["parameters"])


def test_tool_choice_required_picks_a_listed_function(client) -> None:
    tools = [{"type": "function", "function": f} for f in FUNCTIONS[:3]]
    r = client.chat.completions.create(
        model=DEFAULT_MODEL,
        messages=[{"role": "user", "content": "What is 2+3?"}],
        tools=tools,
        tool_choice="required",
        max_tokens=400,
        temperature=0,
    )
    [call] = r.choices[0].message.tool_calls
    spec = next(f for f in FUNCTIONS if f["name"] == call.function.name)
    jsonschema.validate(json.loads(call.function.arguments), spec["parameters"])


def test_tool_call_streamed(http) -> None:
    with http.stream(
        "POST",
        "/v1/chat/completions",
        json={
            "model": DEFAULT_MODEL,
            "stream": True,
            "max_tokens": 400,
            "messages": [{"role": "user", "content": "Add 2 and 3"}],
            "tools": [{"type": "function", "function": FUNCTIONS[1]}],
            "tool_choice": "required",
        },
    ) as r:
        chunks = [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: {")]
    # The call streams as OpenAI's do: its id and name first, then argument fragments.
    deltas = [tc for c in chunks for tc in c["choices"][0]["delta"].get("tool_calls", [])]
    assert {d["index"] for d in deltas} == {0}
    assert deltas[0]["function"]["name"] == "add"
    arguments = "".join(d["function"]["arguments"] for d in deltas)
    jsonschema.validate(json.loads(arguments), FUNCTIONS[1]["parameters"])
    assert chunks[-1]["choices"][0]["finish_reason"] == "tool_calls"


def test_tool_history_is_accepted(client) -> None:
    r = client.chat.completions.create(
        model=DEFAULT_MODEL,
        max_tokens=10,
        tools=[{"type": "function", "function": FUNCTIONS[1]}],
        messages=[
            {"role": "user", "content": "Add 2 and 3"},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": "call_1",
                        "type": "function",
                        "function": {"name": "add", "arguments": '{"a": 2, "b": 3}'},
                    }
                ],
            },
            {"role": "tool", "tool_call_id": "call_1", "content": "5"},
        ],
    )
    assert r.choices[0].finish_reason in {"stop", "length", "tool_calls"}


def test_tool_choice_names_unknown_function(http) -> None:
    r = http.post(
        "/v1/chat/completions",
        json={
            "model": DEFAULT_MODEL,
            "messages": JSON_MESSAGES,
            "tools": [{"type": "function", "function": FUNCTIONS[0]}],
            "tool_choice": {"type": "function", "function": {"name": "nope"}},
        },
    )
    assert r.status_code == 400 and r.json()["error"]["param"] == "tool_choice"
