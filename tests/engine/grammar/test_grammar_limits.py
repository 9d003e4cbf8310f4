"""Schemas that used to crash or freeze the server: refused with a 400 (strict, or
malformed, or past a limit), quickly, and the server keeps serving.
The converter's own bounds are checked in test_grammar_converter.py."""

from __future__ import annotations

import json
import time
from typing import Any

import httpx
import jsonschema
import pytest
from conftest import DEFAULT_MODEL

MESSAGES = [
    {"role": "system", "content": "Answer with compact JSON only."},
    {"role": "user", "content": "Give an example record."},
]
SECONDS = 5.0


def wrap(value: dict[str, Any]) -> dict[str, Any]:
    return {"type": "object", "properties": {"v": value}, "required": ["v"]}


def chat(schema: Any, *, strict: bool | None, **extra: Any) -> dict[str, Any]:
    spec: dict[str, Any] = {"name": "x", "schema": schema}
    if strict is not None:
        spec["strict"] = strict
    return {
        "model": DEFAULT_MODEL,
        "messages": MESSAGES,
        "max_tokens": 24,
        "temperature": 0,
        "response_format": {"type": "json_schema", "json_schema": spec},
        **extra,
    }


def ask(http: httpx.Client, schema: Any, *, strict: bool | None, **extra: Any) -> httpx.Response:
    return timed_post(http, chat(schema, strict=strict, **extra))


def timed_post(http: httpx.Client, body: dict[str, Any] | bytes) -> httpx.Response:
    start = time.monotonic()
    if isinstance(body, bytes):
        headers = {"content-type": "application/json"}
        r = http.post("/v1/chat/completions", content=body, headers=headers)
    else:
        r = http.post("/v1/chat/completions", json=body)
    assert time.monotonic() - start < SECONDS, f"took {time.monotonic() - start:.1f}s"
    return r


def streamed(http: httpx.Client, body: dict[str, Any]) -> dict[str, Any]:
    """A streamed answer's choice (content, finish_reason, tool_calls), after checking that
    its 200 came within SECONDS: the status goes out once the engine runs the grammar, so
    this holds however slowly a busy machine then decodes the tokens."""
    start = time.monotonic()
    with http.stream("POST", "/v1/chat/completions", json={**body, "stream": True}) as r:
        assert time.monotonic() - start < SECONDS, f"took {time.monotonic() - start:.1f}s"
        assert r.status_code == 200, r.read()
        lines = [line[6:] for line in r.iter_lines() if line.startswith("data: {")]
    choice: dict[str, Any] = {"content": "", "finish_reason": None, "tool_calls": []}
    for delta in (c for c in map(json.loads, lines) if c["choices"]):
        choice["content"] += delta["choices"][0]["delta"].get("content") or ""
        choice["tool_calls"] += delta["choices"][0]["delta"].get("tool_calls") or []
        choice["finish_reason"] = delta["choices"][0]["finish_reason"] or choice["finish_reason"]
    return choice


def still_serving(http: httpx.Client) -> None:
    r = http.post(
        "/v1/chat/completions",
        json={"model": DEFAULT_MODEL, "messages": MESSAGES, "max_tokens": 2},
    )
    assert r.status_code == 200, r.text


def refused(r: httpx.Response, param: str, *words: str) -> None:
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["param"] == param
    for word in words:
        assert word in error["message"], error["message"]


@pytest.fixture()
def short_answers(http: httpx.Client) -> dict[str, float]:
    """logit_bias that makes the model close strings and arrays at once, so relaxed
    outputs finish well inside the token budget (the grammar still decides what fits)."""
    bias: dict[str, float] = {}
    for text in ('"', '""', "]"):
        tokens = http.post("/tokenize", json={"model": DEFAULT_MODEL, "content": text})
        if len(tokens.json()["tokens"]) == 1:
            bias[str(tokens.json()["tokens"][0])] = 30.0
    return bias


STRING, INTEGERS = {"type": "string"}, {"type": "array", "items": {"type": "integer"}}
STRING_16K, INTEGERS_4K = STRING | {"maxLength": 16384}, INTEGERS | {"maxItems": 4096}
# name: (schema, keyword, limit in the strict refusal, the schema it is relaxed to)
KILLERS = {
    "max_length": (STRING | {"maxLength": 100000}, "maxLength", "16384", STRING_16K),
    "min_length": (STRING | {"minLength": 100000}, "minLength", "16384", STRING),
    "min_items": (INTEGERS | {"minItems": 100000000}, "minItems", "4096", INTEGERS),
    "max_items": (INTEGERS | {"maxItems": 100000000}, "maxItems", "4096", INTEGERS_4K),
    "pattern_exact": (STRING | {"pattern": "^a{100000000}$"}, "pattern", "1000", STRING),
    "pattern_range": (STRING | {"pattern": "^[a-z]{0,100000}$"}, "pattern", "1000", STRING),
    "integer_minimum": (
        {"type": "integer", "minimum": 1e15},
        "minimum",
        "999999999999999",
        {"type": "integer", "minimum": 999999999999999},
    ),
}


@pytest.mark.parametrize("strict", [True, False])
@pytest.mark.parametrize("name", sorted(KILLERS))
def test_schema_past_a_limit_is_refused(http, name: str, strict: bool) -> None:
    """The limits keep llama.cpp safe: past one, the schema is refused, strict or not."""
    schema, keyword, limit, _ = KILLERS[name]
    r = ask(http, wrap(schema), strict=strict)
    refused(r, "response_format", keyword, limit, "#/properties/v")
    still_serving(http)


def test_non_finite_bound_is_refused(http) -> None:
    # 1e400 overflows to infinity when parsed: refused before it reaches a grammar.
    raw = (
        b'{"model": "%s", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4,'
        b' "response_format": {"type": "json_schema", "json_schema": {"name": "x",'
        b' "schema": {"type": "number", "minimum": 1e400}}}}'
    ) % DEFAULT_MODEL.encode()
    r = timed_post(http, raw)
    assert r.status_code == 400, r.text
    assert set(r.json()["error"]) == {"message", "type", "param", "code"}
    still_serving(http)


@pytest.mark.parametrize("strict", [True, False])
def test_properties_as_a_list_is_refused(http, strict: bool) -> None:
    r = ask(http, {"type": "object", "properties": ["a"]}, strict=strict)
    refused(r, "response_format", "#/properties", "object")
    still_serving(http)


def forced_tool(parameters: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {
        "model": DEFAULT_MODEL,
        "messages": [{"role": "user", "content": "Call f."}],
        "max_tokens": 24,
        "temperature": 0,
        "tools": [{"type": "function", "function": {"name": "f", "parameters": parameters}}],
        "tool_choice": "required",
        **extra,
    }


def test_forced_tool_with_huge_max_length_is_refused(http) -> None:
    parameters = {
        "type": "object",
        "properties": {"s": {"type": "string", "maxLength": 50000}},
        "required": ["s"],
    }
    r = timed_post(http, forced_tool(parameters))
    refused(r, "tools", "maxLength", "16384")
    still_serving(http)


def test_forced_tool_with_malformed_parameters_names_the_function(http) -> None:
    r = timed_post(http, forced_tool({"type": "object", "properties": {"s": {"type": "strnig"}}}))
    refused(r, "tools", "f.parameters#/properties/s/type")
    still_serving(http)


def test_const_with_quotes_and_backslashes_round_trips(http) -> None:
    const = 'say "hi" \\ ok \u00e9 \U0001f600'
    choice = streamed(http, chat({"const": const}, strict=True))
    assert json.loads(choice["content"]) == const


def test_pattern_with_escapes_and_quotes_is_enforced(http) -> None:
    schema = {"type": "string", "pattern": '^\\d{3}-\\d{2}[.]"?$'}
    choice = streamed(http, chat(schema, strict=True))
    assert choice["finish_reason"] == "stop", choice
    jsonschema.validate(json.loads(choice["content"]), schema)


