"""Tool-call parsers and forced-call schemas on fixed inputs (no server): every answer
gives the same content and calls however its text is cut into deltas."""

from __future__ import annotations

import json
import random
from enum import Enum
from typing import Any

import jsonschema
import openai
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import BaseModel, Field

from edge_server.api.http.errors import APIError
from edge_server.api.openai.chat.choice_output import ChoiceOutput, ToolMode
from edge_server.api.openai.chat.protocol import Tool
from edge_server.api.openai.chat.tool_parsers import (
    FORCED,
    HERMES,
    LLAMA3,
    MISTRAL,
    TOOL_CALL_TOKEN,
    CallArguments,
    CallStart,
    Content,
    Event,
    ToolCallFormat,
    ToolCallParser,
    format_for_template,
)
from edge_server.api.openai.chat.tool_schema import call_grammar, call_schema

NAMES = ("add", "get_weather")
ADD = {"name": "add", "arguments": {"a": 1, "b": "x}\"{"}}
WEATHER = {"name": "get_weather", "arguments": {"city": "Paris", "days": [1, 2]}}


def j(value: Any) -> str:
    return json.dumps(value)


def parse(
    text: str, fmt: ToolCallFormat, pieces: list[str] | None = None, **options: Any
) -> tuple[str, list[tuple[str, str]], list[Event]]:
    """(content, [(name, arguments)], events) of the text fed in the given pieces."""
    parser = ToolCallParser(NAMES, fmt, **options)
    events: list[Event] = []
    for piece in pieces if pieces is not None else [text]:
        events += parser.feed(piece)
    events += parser.finish()
    content = "".join(e.text for e in events if isinstance(e, Content))
    calls: dict[int, list[str]] = {}
    for event in events:
        if isinstance(event, CallStart):
            assert event.index == len(calls), "calls are numbered 0, 1, … in order"
            calls[event.index] = [event.name, ""]
        elif isinstance(event, CallArguments):
            calls[event.index][1] += event.text
    return content, [(name, arguments) for name, arguments in calls.values()], events


def chunkings(text: str, rng: random.Random) -> list[list[str]]:
    """Single characters, and random cuts (many inside markers and keys)."""
    out = [list(text)]
    for _ in range(40):
        cuts = sorted(rng.sample(range(1, len(text)), min(len(text) - 1, rng.randint(1, 12))))
        out.append([text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)], strict=True)])
    return out


CASES: dict[str, tuple[ToolCallFormat, str, str, list[dict[str, Any]]]] = {
    "plain_text": (HERMES, "Hello <b>there</b> {not json", "Hello <b>there</b> {not json", []),
    "hermes": (HERMES, f"<tool_call>\n{j(ADD)}\n</tool_call>", "", [ADD]),
    "hermes_text_then_two": (
        HERMES,
        f"Let me see. <tool_call>{j(ADD)}</tool_call>\n<tool_call>{j(WEATHER)}</tool_call>",
        "Let me see. ",
        [ADD, WEATHER],
    ),
    "hermes_unknown_name_is_content": (
        HERMES,
        '<tool_call>{"name": "nope", "arguments": {}}</tool_call>',
        '<tool_call>{"name": "nope", "arguments": {}}</tool_call>',
        [],
    ),
    "hermes_missing_brace": (
        HERMES, '<tool_call>{"name": "add", "arguments": {"a": 1}</tool_call> ok', "ok",
        [{"name": "add", "arguments": {"a": 1}}],
    ),
    "bare_json": (HERMES, j(ADD), "", [ADD]),
    "bare_json_other_object": (HERMES, '{"answer": 42}', '{"answer": 42}', []),
    "bare_list": (HERMES, j([ADD, WEATHER]), "", [ADD, WEATHER]),
    "string_arguments": (HERMES, j({**ADD, "arguments": j(ADD["arguments"])}), "", [ADD]),
    "arguments_first": (HERMES, j({"arguments": ADD["arguments"], "name": "add"}), "", [ADD]),
    "no_arguments": (HERMES, '{"name": "add"}', "", [{"name": "add", "arguments": {}}]),
    "nested_function": (
        HERMES, j({"type": "function", "function": ADD}), "", [ADD]
    ),
    "partial_marker_at_end": (HERMES, "a < b <tool_ca", "a < b <tool_ca", []),
    "llama3": (
        LLAMA3,
        '<|python_tag|>{"name": "add", "parameters": {"a": 1}}; '
        '{"name": "get_weather", "parameters": {"city": "P"}}',
        "",
        [
            {"name": "add", "arguments": {"a": 1}},
            {"name": "get_weather", "arguments": {"city": "P"}},
        ],
    ),
    "llama3_bare": (LLAMA3, '  {"name": "add", "parameters": {"a": 1}}', "", [
        {"name": "add", "arguments": {"a": 1}}]),
    "mistral_list": (MISTRAL, f"[TOOL_CALLS]{j([ADD, WEATHER])}", "", [ADD, WEATHER]),
    "mistral_bare_list": (MISTRAL, j([ADD]), "", [ADD]),
    "mistral_named": (
        MISTRAL,
        f"[TOOL_CALLS]add[ARGS]{j(ADD['arguments'])}"
        f"[TOOL_CALLS]get_weather[CALL_ID]a1b2c3d4e[ARGS]{j(WEATHER['arguments'])}",
        "",
        [ADD, WEATHER],
    ),
    "mistral_named_bare": (MISTRAL, f"add{j(ADD['arguments'])}", "", [ADD]),
    "mistral_word_like_a_name": (MISTRAL, "add more sugar", "add more sugar", []),
    "tool_call_token": (
        TOOL_CALL_TOKEN, f"<|tool_call|>{j([ADD])}<|/tool_call|>", "", [ADD]
    ),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_parser_gives_the_same_answer_however_the_text_is_cut(name: str) -> None:
    fmt, text, content, calls = CASES[name]
    expected = [(c["name"], c["arguments"]) for c in calls]
    for pieces in [[text], *chunkings(text, random.Random(name))]:
        got_content, got_calls, _ = parse(text, fmt, pieces)
        assert got_content.strip() == content.strip(), pieces
        assert [(n, json.loads(a)) for n, a in got_calls] == expected, pieces


# Pieces of every format's syntax, so generated texts are often almost calls.
_ATOMS = [
    "<tool_call>", "</tool_call>", "[TOOL_CALLS]", "[ARGS]", "[CALL_ID]", "<|python_tag|>",
    "<|tool_call|>", "<|/tool_call|>", "{", "}", "[", "]", ":", ",", ";", " ", "\n", "\\",
    '"', '"name"', '"arguments"', '"parameters"', '"function"', '"add"', "add", "get_weather",
    "1", "hi", "<", "<t", j(ADD),
]
_FORMATS = [HERMES, LLAMA3, MISTRAL, TOOL_CALL_TOKEN, FORCED]


@settings(max_examples=400, deadline=None, derandomize=True, database=None)
@given(
    text=st.one_of(st.lists(st.sampled_from(_ATOMS), max_size=24).map("".join), st.text()),
    fmt=st.sampled_from(_FORMATS),
    forced=st.booleans(),
    max_calls=st.sampled_from([None, 1]),
    cuts=st.lists(st.integers(0, 400), max_size=8),
)
def test_any_text_parses_without_error_the_same_however_cut(
    text: str, fmt: ToolCallFormat, forced: bool, max_calls: int | None, cuts: list[int]
) -> None:
    at = sorted({c % (len(text) + 1) for c in cuts})
    pieces = [text[a:b] for a, b in zip([0, *at], [*at, len(text)], strict=True)]
    whole = parse(text, fmt, forced=forced, max_calls=max_calls)[:2]
    assert parse(text, fmt, pieces, forced=forced, max_calls=max_calls)[:2] == whole
    assert parse(text, fmt, list(text), forced=forced, max_calls=max_calls)[:2] == whole


def test_arguments_stream_raw_and_concatenate_to_what_the_model_wrote() -> None:
    arguments = '{"a": 1,  "b": [1, 2, {"c": "}]"}]}'
    text = '<tool_call>{"name": "add", "arguments": ' + arguments + "}</tool_call>"
    _, calls, events = parse(text, HERMES, list(text))
    assert calls == [("add", arguments)]
    fragments = [e for e in events if isinstance(e, CallArguments)]
    assert len(fragments) > 10  # one per character fed once the name was known


def test_content_is_held_only_while_it_may_begin_a_marker() -> None:
    parser = ToolCallParser(NAMES, HERMES)
    assert parser.feed("Hi") == [Content("Hi")]
    assert parser.feed(" <") == [Content(" ")]  # "<" may begin <tool_call>
    assert parser.feed("b>") == [Content("<b>")]
    assert parser.feed("<tool_") == []
    assert parser.feed('call>{"name": "ad') == []
    [start] = parser.feed('d", ')
    assert isinstance(start, CallStart) and start.name == "add" and start.index == 0


def test_max_calls_keeps_the_first_call_only() -> None:
    text = f"<tool_call>{j(ADD)}</tool_call><tool_call>{j(WEATHER)}</tool_call>"
    content, calls, _ = parse(text, HERMES, max_calls=1)
    assert content == "" and [n for n, _ in calls] == ["add"]


def test_forced_call_cut_off_keeps_its_partial_arguments() -> None:
    text = '{"name": "add", "arguments": {"a": 1, "b": [1, 2'
    for pieces in [[text], list(text)]:
        content, calls, _ = parse(text, FORCED, pieces, forced=True)
        assert content == "" and calls == [("add", '{"a": 1, "b": [1, 2')]


def test_forced_call_cut_off_inside_its_name_names_the_one_tool_it_can_be() -> None:
    assert parse('{"name": "get_w', FORCED, forced=True)[:2] == ("", [("get_weather", "")])
    # Two tools still possible: no call can be named.
    assert parse('{"na', FORCED, forced=True)[1] == []


@pytest.mark.parametrize(
    ("template", "fmt"),
    [
        ("{% for m in messages %}{{ m.content }}{% endfor %}", HERMES),
        ("{% if tools %}<tool_call>{{ tools | tojson }}</tool_call>{% endif %}", HERMES),
        ("{% if tools %}[AVAILABLE_TOOLS]{{ tools }}[TOOL_CALLS]{% endif %}", MISTRAL),
        ("{% if tools %}{{ tools }}<|python_tag|>{% endif %}", LLAMA3),
        ("{% if tools %}<|tool_call|>{{ tools }}{% endif %}", TOOL_CALL_TOKEN),
        ("{% if tools %}{{ tools }}{% endif %}", HERMES),
    ],
)
def test_format_follows_the_template(template: str, fmt: ToolCallFormat) -> None:
    assert format_for_template(template, "tools" in template) is fmt


def output(legacy: bool, forced: bool = False) -> ChoiceOutput:
    mode = ToolMode(NAMES, FORCED if forced else HERMES, forced, 1 if legacy else None, legacy)
    return ChoiceOutput(split_reasoning=False, reasoning_opened=False, tools=mode)


def test_legacy_answer_is_a_function_call() -> None:
    out = output(legacy=True)
    deltas = out.push(f"<tool_call>{j(ADD)}</tool_call>") + out.finish()
    assert deltas[0] == {"function_call": {"name": "add", "arguments": ""}}
    assert all(set(d) == {"function_call"} for d in deltas)
    message = out.message()
    assert message.tool_calls is None and message.function_call is not None
    assert json.loads(message.function_call["arguments"]) == ADD["arguments"]
    assert out.finish_reason("stop") == "function_call"
    assert out.finish_reason("length") == "length"


def test_tool_call_deltas_have_the_openai_shape() -> None:
    out = output(legacy=False)
    deltas = out.push(f"<tool_call>{j(ADD)}") + out.finish()
    [first, *rest] = deltas
    [call] = first["tool_calls"]
    assert set(call) == {"index", "id", "type", "function"}
    assert call["function"] == {"name": "add", "arguments": ""} and call["index"] == 0
    assert all(d["tool_calls"][0].keys() == {"index", "function"} for d in rest)
    assert out.finish_reason("stop") == "tool_calls"


# Forced-call schemas: $defs / $ref --------------------------------------------------


class Color(Enum):
    red = "red"
    green = "green"


class Point(BaseModel):
    x: int = Field(ge=0, le=9)
    y: int = Field(ge=0, le=9)


class Paint(BaseModel):
    color: Color
    at: Point


def tool(spec: dict[str, Any]) -> Tool:
    return Tool.model_validate(spec)


def test_defs_move_to_the_call_schema_root_and_refs_follow() -> None:
    paint = tool(openai.pydantic_function_tool(Paint))
    built = call_schema([paint]).schema
    assert "$defs" not in built["properties"]["arguments"]
    arguments = built["properties"]["arguments"]
    assert arguments["properties"]["color"] == {"$ref": "#/$defs/Paint.Color"}
    call = {"name": "Paint", "arguments": {"color": "red", "at": {"x": 1, "y": 2}}}
    jsonschema.validate(call, built)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({**call, "arguments": {**call["arguments"], "color": "blue"}}, built)
    assert call_grammar([paint])  # the grammar limits and converter accept it


def test_definitions_of_several_tools_do_not_clash() -> None:
    other = {
        "type": "function",
        "function": {
            "name": "shade",
            "parameters": {
                "type": "object",
                "definitions": {"Color": {"enum": ["dark"]}, "a/b~c": {"type": "integer"}},
                "properties": {
                    "c": {"$ref": "#/definitions/Color"},
                    "n": {"$ref": "#/definitions/a~1b~0c"},
                },
                "required": ["c", "n"],
            },
        },
    }
    built = call_schema([tool(openai.pydantic_function_tool(Paint)), tool(other)]).schema
    assert {"Paint.Color", "shade.Color", "shade.a_b_c"} <= set(built["$defs"])
    jsonschema.validate({"name": "shade", "arguments": {"c": "dark", "n": 3}}, built)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({"name": "shade", "arguments": {"c": "red", "n": 3}}, built)
    call_grammar([tool(openai.pydantic_function_tool(Paint)), tool(other)])


def test_refs_to_the_parameters_themselves_are_moved_too() -> None:
    recursive = {
        "name": "tree",
        "parameters": {
            "type": "object",
            "properties": {"kids": {"type": "array", "items": {"$ref": "#"}, "maxItems": 2}},
        },
    }
    built = call_schema([tool({"type": "function", "function": recursive})]).schema
    assert built["properties"]["arguments"]["properties"]["kids"]["items"] == {
        "$ref": "#/properties/arguments"
    }


def test_an_error_in_a_definition_names_where_the_client_wrote_it() -> None:
    bad = {
        "name": "f",
        "parameters": {
            "type": "object",
            "properties": {"c": {"$ref": "#/$defs/Bad"}},
            "$defs": {"Bad": {"type": "strnig"}},
        },
    }
    with pytest.raises(APIError) as caught:
        call_grammar([tool({"type": "function", "function": bad})])
    assert caught.value.param == "tools"
    assert "f.parameters#/$defs/Bad/type" in caught.value.message
