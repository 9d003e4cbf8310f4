"""Tool calling over HTTP against the real model: shapes, streaming, finish reasons and
argument validity, never the words the model picks.

Where a test needs the answer to be text, or to be several calls, a response_format
grammar makes it so: the protocol is what is under test, not the model's choices."""

from __future__ import annotations

import json
from typing import Any

import httpx
import jsonschema
import openai
import pytest
from conftest import DEFAULT_MODEL

from edge_testkit.tools import ADD, Paint

NOTE = {  # a call that cannot finish within a few dozen tokens
    "name": "note",
    "parameters": {
        "type": "object",
        "properties": {"text": {"type": "string", "minLength": 1000}},
        "required": ["text"],
    },
}
MESSAGES = [{"role": "user", "content": "Add 2 and 3."}]


def as_tool(function: dict[str, Any]) -> dict[str, Any]:
    return {"type": "function", "function": function}


def post(http: httpx.Client, **body: Any) -> dict[str, Any]:
    r = http.post("/v1/chat/completions", json={"model": DEFAULT_MODEL, **body})
    assert r.status_code == 200, r.text
    return r.json()


def stream(http: httpx.Client, **body: Any) -> list[dict[str, Any]]:
    payload = {"model": DEFAULT_MODEL, "stream": True, **body}
    with http.stream("POST", "/v1/chat/completions", json=payload) as r:
        assert r.status_code == 200, r.read()
        return [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: {")]


def assembled(chunks: list[dict[str, Any]]) -> dict[str, Any]:
    """Content, calls and finish reason of a streamed choice, checking every tool-call
    delta has the OpenAI shape: the first for an index carries id, type and name with
    empty arguments; later ones only that index and an arguments fragment."""
    out: dict[str, Any] = {"content": "", "calls": {}, "fragments": 0, "finish_reason": None}
    for chunk in chunks:
        [choice] = chunk["choices"]
        delta = choice["delta"]
        out["content"] += delta.get("content") or ""
        for call in delta.get("tool_calls") or []:
            index = call["index"]
            if index not in out["calls"]:
                assert index == len(out["calls"]), "indices are 0, 1, … in order"
                assert call["id"] and call["type"] == "function"
                assert call["function"]["arguments"] == ""
                out["calls"][index] = {"name": call["function"]["name"], "arguments": ""}
            else:
                assert set(call) == {"index", "function"} and set(call["function"]) == {
                    "arguments"
                }
                out["calls"][index]["arguments"] += call["function"]["arguments"]
                out["fragments"] += 1
        out["finish_reason"] = choice["finish_reason"] or out["finish_reason"]
    out["calls"] = [out["calls"][k] for k in sorted(out["calls"])]
    return out


def test_forced_call_streams_name_first_then_argument_fragments(http) -> None:
    chunks = stream(
        http, messages=MESSAGES, tools=[as_tool(ADD)], tool_choice="required",
        max_tokens=60, temperature=0,
    )
    got = assembled(chunks)
    assert got["finish_reason"] == "tool_calls" and got["content"] == ""
    [call] = got["calls"]
    assert call["name"] == "add" and got["fragments"] >= 2
    jsonschema.validate(json.loads(call["arguments"]), ADD["parameters"])


def test_auto_stream_sends_content_at_once_and_token_by_token(http) -> None:
    """The first content delta comes within two decode steps, and a 64-token answer comes
    in many deltas: text is held back only while it may begin a call. Each decode step's
    logprob rides with its text (text held back carries its steps' logprobs along), so
    the logprob entries number the steps."""
    # Far more characters than 64 tokens can hold: the grammar cannot end the answer
    # early, whatever words the model picks.
    text_only = {"type": "string", "pattern": "^[a-z ]{900,1000}$"}
    chunks = stream(
        http, messages=[{"role": "user", "content": "Tell me a story."}],
        tools=[as_tool(ADD)], tool_choice="auto", max_tokens=64, logprobs=True,
        response_format={"type": "json_schema", "json_schema": {"name": "t", "schema": text_only}},
    )
    steps, first_content_step, content_deltas = 0, None, 0
    for chunk in chunks[1:]:
        choice = chunk["choices"][0]
        steps += len((choice["logprobs"] or {}).get("content") or [])
        if choice["delta"].get("content"):
            content_deltas += 1
            first_content_step = first_content_step or steps
    assert steps == 64 and chunks[-1]["choices"][0]["finish_reason"] == "length"
    assert first_content_step is not None and first_content_step <= 2
    assert content_deltas >= 5


@pytest.mark.parametrize("parallel", [None, False])
def test_several_calls_get_indices_unless_parallel_calls_are_off(http, parallel) -> None:
    """The grammar makes the answer a bare list of two calls, which the parser reads as
    two calls; parallel_tool_calls false keeps the first."""
    call = {
        "type": "object",
        "properties": {"name": {"const": "add"}, "arguments": ADD["parameters"]},
        "required": ["name", "arguments"],
    }
    two = {"type": "array", "items": call, "minItems": 2, "maxItems": 2}
    body: dict[str, Any] = dict(
        messages=MESSAGES, tools=[as_tool(ADD)], max_tokens=80, temperature=0,
        response_format={"type": "json_schema", "json_schema": {"name": "two", "schema": two}},
    )
    if parallel is not None:
        body["parallel_tool_calls"] = parallel
    expected = 1 if parallel is False else 2
    choice = post(http, **body)["choices"][0]
    assert choice["finish_reason"] == "tool_calls" and choice["message"]["content"] is None
    calls = choice["message"]["tool_calls"]
    assert len(calls) == expected and len({c["id"] for c in calls}) == expected
    streamed = assembled(stream(http, **body))
    assert len(streamed["calls"]) == expected and streamed["finish_reason"] == "tool_calls"
    for got in [*calls, *({"function": c} for c in streamed["calls"])]:
        jsonschema.validate(json.loads(got["function"]["arguments"]), ADD["parameters"])


def test_forced_tool_with_enum_and_nested_model(client) -> None:
    """pydantic writes $defs and $refs for the Enum and the nested model."""
    paint = openai.pydantic_function_tool(Paint)
    assert "$defs" in paint["function"]["parameters"]
    for choice in ("required", {"type": "function", "function": {"name": "Paint"}}):
        r = client.chat.completions.create(
            model=DEFAULT_MODEL, messages=[{"role": "user", "content": "Paint a dot."}],
            tools=[paint, as_tool(ADD)], tool_choice=choice, max_tokens=120, temperature=0,
        )
        assert r.choices[0].finish_reason == "tool_calls"
        [call] = r.choices[0].message.tool_calls
        schema = paint["function"]["parameters"] if call.function.name == "Paint" else ADD[
            "parameters"
        ]
        jsonschema.validate(json.loads(call.function.arguments), schema)


def test_same_definition_name_in_two_forced_tools(http) -> None:
    def tool(name: str, colours: list[str]) -> dict[str, Any]:
        return as_tool({"name": name, "parameters": {
            "type": "object", "$defs": {"Color": {"enum": colours}},
            "properties": {"c": {"$ref": "#/$defs/Color"}}, "required": ["c"],
        }})
    tools = [tool("warm", ["red", "orange"]), tool("cold", ["blue", "teal"])]
    for name, colours in (("warm", ["red", "orange"]), ("cold", ["blue", "teal"])):
        choice = post(
            http, messages=MESSAGES, tools=tools, max_tokens=40, temperature=0,
            tool_choice={"type": "function", "function": {"name": name}},
        )["choices"][0]
        [call] = choice["message"]["tool_calls"]
        assert call["function"]["name"] == name
        assert json.loads(call["function"]["arguments"])["c"] in colours


def test_forced_call_cut_off_by_max_tokens_is_a_partial_call(http) -> None:
    body = dict(messages=MESSAGES, tools=[as_tool(NOTE)], tool_choice="required", max_tokens=30)
    choice = post(http, **body)["choices"][0]
    assert choice["finish_reason"] == "length" and choice["message"]["content"] is None
    [call] = choice["message"]["tool_calls"]
    assert call["function"]["name"] == "note"
    assert call["function"]["arguments"].startswith('{')
    with pytest.raises(ValueError):
        json.loads(call["function"]["arguments"])  # cut off: not yet a whole object
    streamed = assembled(stream(http, **body))
    assert streamed["finish_reason"] == "length" and streamed["content"] == ""
    [call] = streamed["calls"]
    assert call["name"] == "note" and call["arguments"].startswith("{")


def test_legacy_functions_answer_with_function_call(http) -> None:
    body = dict(
        messages=MESSAGES, functions=[ADD], function_call={"name": "add"}, max_tokens=60,
        temperature=0,
    )
    choice = post(http, **body)["choices"][0]
    assert choice["finish_reason"] == "function_call"
    message = choice["message"]
    assert "tool_calls" not in message and message["function_call"]["name"] == "add"
    jsonschema.validate(json.loads(message["function_call"]["arguments"]), ADD["parameters"])
    chunks = stream(http, **body)
    deltas = [c["choices"][0]["delta"] for c in chunks]
    calls = [d["function_call"] for d in deltas if "function_call" in d]
    assert calls[0] == {"name": "add", "arguments": ""} and len(calls) >= 3
    assert all(set(c) == {"arguments"} for c in calls[1:])
    jsonschema.validate(json.loads("".join(c["arguments"] for c in calls)), ADD["parameters"])
    assert not any("tool_calls" in d for d in deltas)
    assert chunks[-1]["choices"][0]["finish_reason"] == "function_call"


def test_legacy_functions_with_the_openai_client(client) -> None:
    r = client.chat.completions.create(
        model=DEFAULT_MODEL, messages=MESSAGES, functions=[ADD], function_call="auto",
        max_tokens=30, temperature=0,
    )
    choice = r.choices[0]
    assert choice.finish_reason in {"stop", "length", "function_call"}
    if choice.finish_reason == "function_call":
        assert choice.message.function_call.name == "add" and not choice.message.tool_calls


def test_legacy_history_is_accepted(http) -> None:
    messages = [
        *MESSAGES,
        {"role": "assistant", "content": None,
         "function_call": {"name": "add", "arguments": '{"a": 2, "b": 3}'}},
        {"role": "function", "name": "add", "content": "5"},
    ]
    for extra in ({"functions": [ADD]}, {"tools": [as_tool(ADD)]}, {}):
        choice = post(http, messages=messages, max_tokens=4, **extra)["choices"][0]
        assert choice["finish_reason"] in {"stop", "length", "tool_calls", "function_call"}


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"functions": [ADD], "tools": [as_tool(ADD)]}, "functions"),
        ({"function_call": "auto"}, "function_call"),
        ({"functions": [ADD], "function_call": {"name": "nope"}}, "function_call"),
        ({"functions": [ADD], "function_call": "auto", "tool_choice": "auto"}, "function_call"),
        ({"functions": []}, "functions"),
        ({"function_call": "sometimes", "functions": [ADD]}, "function_call"),
    ],
)
def test_bad_legacy_fields_are_refused_by_name(http, body, param) -> None:
    r = http.post(
        "/v1/chat/completions",
        json={"model": DEFAULT_MODEL, "messages": MESSAGES, "max_tokens": 2, **body},
    )
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param


def test_bad_definition_in_a_forced_tool_names_the_function(http) -> None:
    parameters = {
        "type": "object", "properties": {"c": {"$ref": "#/$defs/Bad"}},
        "$defs": {"Bad": {"type": "strnig"}},
    }
    r = http.post("/v1/chat/completions", json={
        "model": DEFAULT_MODEL, "messages": MESSAGES, "max_tokens": 2, "tool_choice": "required",
        "tools": [as_tool({"name": "f", "parameters": parameters})],
    })
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == "tools" and "f.parameters#/$defs/Bad/type" in error["message"]


def test_auto_answer_is_content_or_well_formed_calls(http) -> None:
    """Whatever the model writes with tools attached, streamed or not, the answer is
    content and/or calls of the listed tool, with the matching finish reason."""
    body = dict(messages=MESSAGES, tools=[as_tool(ADD)], max_tokens=48, seed=3)
    for choice in (post(http, **body)["choices"][0], None):
        if choice is None:
            got = assembled(stream(http, **body))
            calls, reason = got["calls"], got["finish_reason"]
        else:
            reason = choice["finish_reason"]
            calls = [c["function"] for c in choice["message"].get("tool_calls") or []]
        assert all(c["name"] == "add" for c in calls)
        if calls and reason != "length":
            assert reason == "tool_calls"
        if not calls:
            assert reason in {"stop", "length"}
