"""Schemas whose `$defs` refer to themselves or carry names GBNF cannot: a forced tool
call (chat and /v1/messages) and response_format.

A tool's definitions are renamed per tool (`tree.Node`) when they move to the call
schema's root; a ref that recursed used that name as a GBNF rule name as written, and
llama.cpp refused the grammar (a 400 for a valid schema). Rule names now never come from
a ref as written. Asserted: 200s, calls that parse and validate where they finished, and
definitions named like the converter's own rules (`space`) keeping their own schema.
"""

from __future__ import annotations

import json
from typing import Any

import httpx
import jsonschema
import pytest
from conftest import DEFAULT_MODEL, RunningServer

from edge_server.engine.grammar.json_grammar import grammar_for_schema

NODE = {"type": "object", "required": ["v"], "properties": {
    "v": {"type": "integer", "minimum": 0, "maximum": 9},
    "kids": {"type": "array", "maxItems": 2, "items": {"$ref": "#/$defs/tree_node"}}}}
# A recursive definition whose name has an underscore; a plain one next to it.
TREE = {"type": "object", "required": ["root", "at"],
        "properties": {"root": {"$ref": "#/$defs/tree_node"}, "at": {"$ref": "#/$defs/Point"}},
        "$defs": {"tree_node": NODE, "Point": {
            "type": "object", "required": ["x"], "properties": {"x": {"type": "integer"}}}}}
# Definitions named like rules the converter writes itself.
CLASHING = {"type": "object", "required": ["space", "root"],
            "properties": {"space": {"$ref": "#/$defs/space"}, "root": {"$ref": "#/$defs/root"}},
            "$defs": {"space": {"enum": ["wide", "narrow"]}, "root": {"type": "boolean"}}}
MESSAGES = [{"role": "user", "content": "Draw a small tree."}]


def chat(server: RunningServer, **body: Any) -> httpx.Response:
    return httpx.post(f"{server.v1}/chat/completions", timeout=300, json={
        "model": DEFAULT_MODEL, "messages": MESSAGES, "max_tokens": 40, "temperature": 0,
        **body})


@pytest.mark.parametrize("schema", [TREE, CLASHING], ids=["recursive", "clashing-names"])
def test_forced_chat_call_with_defs(server: RunningServer, schema: dict[str, Any]) -> None:
    r = chat(server, tools=[{"type": "function", "function": {"name": "tree",
                                                              "parameters": schema}}],
             tool_choice={"type": "function", "function": {"name": "tree"}})
    assert r.status_code == 200, r.text
    choice = r.json()["choices"][0]
    [call] = choice["message"]["tool_calls"]
    assert call["function"]["name"] == "tree"
    if choice["finish_reason"] == "tool_calls":  # not cut off by max_tokens
        jsonschema.validate(json.loads(call["function"]["arguments"]), schema)


@pytest.mark.parametrize("schema", [TREE, CLASHING], ids=["recursive", "clashing-names"])
def test_forced_anthropic_tool_use_with_defs(server: RunningServer,
                                             schema: dict[str, Any]) -> None:
    r = httpx.post(f"{server.v1}/messages", timeout=300, json={
        "model": DEFAULT_MODEL, "max_tokens": 40, "messages": MESSAGES,
        "tools": [{"name": "tree", "input_schema": schema}],
        "tool_choice": {"type": "tool", "name": "tree"}})
    assert r.status_code == 200, r.text
    body = r.json()
    [block] = [b for b in body["content"] if b["type"] == "tool_use"]
    assert block["name"] == "tree"
    if body["stop_reason"] == "tool_use":
        jsonschema.validate(block["input"], schema)


@pytest.mark.parametrize("schema", [TREE, CLASHING], ids=["recursive", "clashing-names"])
def test_response_format_with_defs(server: RunningServer, schema: dict[str, Any]) -> None:
    r = chat(server, response_format={"type": "json_schema", "json_schema": {
        "name": "tree", "schema": schema}})
    assert r.status_code == 200, r.text
    choice = r.json()["choices"][0]
    if choice["finish_reason"] == "stop":
        jsonschema.validate(json.loads(choice["message"]["content"]), schema)


def test_rule_names_from_refs_are_gbnf_names() -> None:
    grammar = grammar_for_schema(TREE)
    names = [line.split(" ::= ")[0] for line in grammar.splitlines()]
    body = " ".join(line.split(" ::= ", 1)[1] for line in grammar.splitlines())
    assert all(name.replace("-", "").isalnum() for name in names), names
    assert "tree_node" not in body  # the ref as written never names a rule
    # `space` the definition is not `space` the whitespace rule.
    assert "wide" in grammar_for_schema(CLASHING)
