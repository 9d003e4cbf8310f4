"""response_format: every output parses and validates against its schema (tool-call
arguments: test_tool_call_arguments.py)."""

from __future__ import annotations

import json

import httpx
import jsonschema
import pytest
from conftest import DEFAULT_MODEL, JSON_MESSAGES
from pydantic import BaseModel, Field

ADDRESS = {
    "type": "object",
    "properties": {
        "street": {"type": "string", "maxLength": 30},
        "zip": {"type": "string", "pattern": "^[0-9]{5}$"},
    },
    "required": ["street", "zip"],
}

SCHEMAS: dict[str, dict] = {
    "flat_object": {
        "type": "object",
        "properties": {"name": {"type": "string", "maxLength": 20}, "age": {"type": "integer"}},
        "required": ["name", "age"],
    },
    "nested_object": {
        "type": "object",
        "properties": {
            "person": {
                "type": "object",
                "properties": {
                    "first": {"type": "string", "maxLength": 15},
                    "last": {"type": "string", "maxLength": 15},
                },
                "required": ["first", "last"],
            }
        },
        "required": ["person"],
    },
    "array_bounds": {
        "type": "object",
        "properties": {
            "tags": {
                "type": "array",
                "items": {"type": "string", "maxLength": 10},
                "minItems": 2,
                "maxItems": 4,
            }
        },
        "required": ["tags"],
    },
    "top_level_array": {
        "type": "array",
        "items": {"type": "integer", "minimum": 0, "maximum": 9},
        "minItems": 1,
        "maxItems": 5,
    },
    "enum": {
        "type": "object",
        "properties": {"colour": {"enum": ["red", "green", "blue"]}},
        "required": ["colour"],
    },
    "enum_mixed": {"enum": ["yes", "no", 1, None]},
    "const": {
        "type": "object",
        "properties": {"version": {"const": 2}, "ok": {"type": "boolean"}},
        "required": ["version", "ok"],
    },
    "anyof_scalar": {
        "type": "object",
        "properties": {
            "value": {"anyOf": [{"type": "integer"}, {"type": "string", "maxLength": 10}]}
        },
        "required": ["value"],
    },
    "anyof_objects": {
        "anyOf": [
            {
                "type": "object",
                "properties": {"cat": {"type": "string", "maxLength": 10}},
                "required": ["cat"],
            },
            {"type": "object", "properties": {"dog": {"type": "integer"}}, "required": ["dog"]},
        ]
    },
    "optional_keys": {
        "type": "object",
        "properties": {"a": {"type": "integer"}, "b": {"type": "boolean"}, "c": {"type": "null"}},
        "required": ["a"],
        "additionalProperties": False,
    },
    "all_optional": {
        "type": "object",
        "properties": {"x": {"type": "integer"}, "y": {"type": "integer"}},
        "additionalProperties": False,
    },
    "integer_range": {
        "type": "object",
        "properties": {"age": {"type": "integer", "minimum": 18, "maximum": 65}},
        "required": ["age"],
    },
    "negative_range": {
        "type": "object",
        "properties": {"t": {"type": "integer", "minimum": -40, "maximum": -5}},
        "required": ["t"],
    },
    "exclusive_range": {
        "type": "object",
        "properties": {"n": {"type": "integer", "exclusiveMinimum": 0, "exclusiveMaximum": 10}},
        "required": ["n"],
    },
    "number_range": {
        "type": "object",
        "properties": {"score": {"type": "number", "minimum": 0, "maximum": 1}},
        "required": ["score"],
    },
    "number_wide": {
        "type": "object",
        "properties": {"price": {"type": "number", "minimum": 1.5, "maximum": 250}},
        "required": ["price"],
    },
    "string_pattern": {
        "type": "object",
        "properties": {"code": {"type": "string", "pattern": "^[A-Z]{3}-[0-9]{3}$"}},
        "required": ["code"],
    },
    "string_lengths": {
        "type": "object",
        "properties": {"word": {"type": "string", "minLength": 3, "maxLength": 8}},
        "required": ["word"],
    },
    "format_date": {
        "type": "object",
        "properties": {"day": {"type": "string", "format": "date"}},
        "required": ["day"],
    },
    "format_uuid": {
        "type": "object",
        "properties": {"id": {"type": "string", "format": "uuid"}},
        "required": ["id"],
    },
    "refs_defs": {
        "type": "object",
        "properties": {"home": {"$ref": "#/$defs/address"}, "work": {"$ref": "#/$defs/address"}},
        "required": ["home", "work"],
        "$defs": {"address": ADDRESS},
    },
    "array_of_objects": {
        "type": "object",
        "properties": {
            "items": {
                "type": "array",
                "maxItems": 3,
                "items": {
                    "type": "object",
                    "properties": {
                        "sku": {"type": "string", "maxLength": 8},
                        "qty": {"type": "integer", "minimum": 1, "maximum": 99},
                    },
                    "required": ["sku", "qty"],
                },
            }
        },
        "required": ["items"],
    },
    "tuple_prefix_items": {
        "type": "array",
        "prefixItems": [
            {"type": "string", "maxLength": 10},
            {"type": "integer"},
            {"type": "boolean"},
        ],
    },
    "nullable_union": {
        "type": "object",
        "properties": {"note": {"type": ["string", "null"], "maxLength": 20}},
        "required": ["note"],
    },
    "boolean_flags": {
        "type": "object",
        "properties": {"a": {"type": "boolean"}, "b": {"type": "boolean"}},
        "required": ["a", "b"],
    },
    "deep_nesting": {
        "type": "object",
        "properties": {
            "l1": {
                "type": "object",
                "properties": {
                    "l2": {
                        "type": "object",
                        "properties": {
                            "l3": {"type": "array", "maxItems": 2, "items": {"type": "integer"}}
                        },
                        "required": ["l3"],
                    }
                },
                "required": ["l2"],
            }
        },
        "required": ["l1"],
    },
}


def check(text: str, schema: dict) -> None:
    data = json.loads(text)
    jsonschema.validate(data, schema)


@pytest.mark.parametrize("name", sorted(SCHEMAS))
@pytest.mark.parametrize("mode", ["json_schema", "json_object"])
def test_schema_output_validates(http, name: str, mode: str) -> None:
    schema = SCHEMAS[name]
    if mode == "json_schema":
        fmt = {"type": "json_schema", "json_schema": {"name": name, "schema": schema}}
    else:
        fmt = {"type": "json_object", "schema": schema}
    r = http.post(
        "/v1/chat/completions",
        json={
            "model": DEFAULT_MODEL,
            "messages": JSON_MESSAGES,
            "response_format": fmt,
            "max_tokens": 400,
            "temperature": 0.7,
            "seed": 1,
        },
    )
    assert r.status_code == 200, r.text
    choice = r.json()["choices"][0]
    assert choice["finish_reason"] == "stop", choice
    check(choice["message"]["content"], schema)


def test_json_object_without_schema_is_an_object(http) -> None:
    r = http.post(
        "/v1/completions",
        json={
            "model": DEFAULT_MODEL,
            "prompt": "A JSON object describing a book:",
            "response_format": {"type": "json_object"},
            "max_tokens": 120,
            "seed": 2,
            "temperature": 0.5,
        },
    )
    text = r.json()["choices"][0]["text"]
    if r.json()["choices"][0]["finish_reason"] == "stop":
        assert isinstance(json.loads(text), dict)
    else:
        assert text.lstrip().startswith("{")


def ask_with_schema(http, schema: dict, **extra) -> httpx.Response:
    fmt = {"type": "json_schema", "json_schema": {"name": "x", "schema": schema, **extra}}
    return http.post("/v1/chat/completions", json={
        "model": DEFAULT_MODEL, "messages": JSON_MESSAGES, "max_tokens": 60,
        "response_format": fmt})


MULTIPLE_OF = {"type": "object", "properties": {"n": {"type": "integer", "multipleOf": 3}},
               "required": ["n"]}


def test_strict_schema_with_unenforceable_keyword_is_refused(http) -> None:
    r = ask_with_schema(http, MULTIPLE_OF, strict=True)
    assert r.status_code == 400
    error = r.json()["error"]
    assert error["param"] == "response_format"
    assert "multipleOf" in error["message"]


def test_non_strict_schema_is_best_effort(http) -> None:
    r = ask_with_schema(http, MULTIPLE_OF)
    assert r.status_code == 200
    assert "n" in json.loads(r.json()["choices"][0]["message"]["content"])


def test_broken_schema_is_400(http) -> None:
    r = ask_with_schema(http, {"type": "object",
                               "properties": {"a": {"$ref": "#/$defs/missing"}}})
    assert r.status_code == 400
    assert r.json()["error"]["param"] == "response_format"


def test_streamed_json_schema_output_validates(http) -> None:
    schema = SCHEMAS["array_of_objects"]
    with http.stream(
        "POST",
        "/v1/chat/completions",
        json={
            "model": DEFAULT_MODEL,
            "messages": JSON_MESSAGES,
            "stream": True,
            "max_tokens": 300,
            "response_format": {
                "type": "json_schema",
                "json_schema": {"name": "o", "schema": schema},
            },
        },
    ) as r:
        chunks = [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: {")]
    check("".join(c["choices"][0]["delta"].get("content") or "" for c in chunks), schema)


class Weather(BaseModel):
    # Bounded, so the JSON always completes within max_tokens: an unbounded string would
    # end only when the model chooses to close it.
    city: str = Field(max_length=20)
    temperature_c: int
    sunny: bool


def test_openai_parse_helper(client) -> None:
    completion = client.chat.completions.parse(
        model=DEFAULT_MODEL,
        messages=[{"role": "user", "content": "Weather in Paris as JSON."}],
        response_format=Weather,
        max_tokens=400,
        temperature=0,
    )
    parsed = completion.choices[0].message.parsed
    assert isinstance(parsed, Weather)
