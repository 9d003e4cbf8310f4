"""The Anthropic Messages API (/v1/messages, /v1/messages/count_tokens) through the
official `anthropic` client against the real model: shapes, event sequences, stop
reasons, tool use and errors, never the words the model picks."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import httpx
import jsonschema
import pytest
from conftest import DEFAULT_MODEL, RunningServer, start_server, stop_server

from edge_server.api.anthropic.messages.blocks import Blocks
from edge_server.api.anthropic.messages.error_shape import anthropic_body

ADD_SCHEMA = {
    "type": "object",
    "properties": {
        "a": {"type": "integer", "minimum": 0, "maximum": 9},
        "b": {"type": "integer", "minimum": 0, "maximum": 9},
    },
    "required": ["a", "b"],
}
ADD = {"name": "add", "description": "Adds two digits.", "input_schema": ADD_SCHEMA}
ASK = [{"role": "user", "content": "Add 2 and 3."}]
FORCED: Any = {"type": "tool", "name": "add"}


@pytest.fixture()
def claude(server: RunningServer) -> Iterator[anthropic.Anthropic]:
    with anthropic.Anthropic(base_url=server.base_url, api_key="unused", max_retries=0) as c:
        yield c


def _error(exc: anthropic.APIStatusError, kind: str) -> str:
    body = exc.response.json()
    assert set(body) == {"type", "error"} and body["type"] == "error"
    assert set(body["error"]) == {"type", "message"}
    assert body["error"]["type"] == kind
    return str(body["error"]["message"])


def test_create_text(claude: anthropic.Anthropic) -> None:
    msg = claude.messages.create(model="default", max_tokens=8, system="Be brief.",
                                 messages=[{"role": "user", "content": "Name a colour."}])
    assert msg.id.startswith("msg_") and msg.type == "message" and msg.role == "assistant"
    assert msg.model == DEFAULT_MODEL  # the served id, whichever alias was asked for
    assert all(block.type == "text" for block in msg.content)
    assert msg.stop_reason in ("end_turn", "max_tokens") and msg.stop_sequence is None
    assert 1 <= msg.usage.output_tokens <= 8
    assert msg.usage.input_tokens + (msg.usage.cache_read_input_tokens or 0) > 0


def test_stream_text_event_sequence(claude: anthropic.Anthropic) -> None:
    with claude.messages.stream(model=DEFAULT_MODEL, max_tokens=8,
                                messages=[{"role": "user", "content": "Say hello."}]) as s:
        events = list(s)
        final = s.get_final_message()
    kinds = [e.type for e in events if e.type in (
        "message_start", "content_block_start", "content_block_delta", "content_block_stop",
        "message_delta", "message_stop")]
    assert kinds[0] == "message_start" and kinds[-2:] == ["message_delta", "message_stop"]
    open_index: int | None = None
    texts: list[str] = []
    for event in events:
        if event.type == "content_block_start":
            assert open_index is None
            open_index = event.index
        elif event.type == "content_block_delta":
            assert event.index == open_index and event.delta.type == "text_delta"
            texts.append(event.delta.text)
        elif event.type == "content_block_stop":
            assert event.index == open_index
            open_index = None
    assert open_index is None
    assert final.stop_reason in ("end_turn", "max_tokens")
    assert "".join(b.text for b in final.content if b.type == "text") == "".join(texts)
    assert 1 <= final.usage.output_tokens <= 8


def test_forced_tool_use(claude: anthropic.Anthropic) -> None:
    msg = claude.messages.create(model=DEFAULT_MODEL, max_tokens=64, messages=ASK,
                                 tools=[ADD], tool_choice=FORCED)
    assert msg.stop_reason == "tool_use"
    calls = [b for b in msg.content if b.type == "tool_use"]
    assert len(calls) == 1 and calls[0].name == "add" and calls[0].id.startswith("toolu_")
    jsonschema.validate(calls[0].input, ADD_SCHEMA)


def test_forced_tool_use_streams_input_json(claude: anthropic.Anthropic) -> None:
    with claude.messages.stream(model=DEFAULT_MODEL, max_tokens=64, messages=ASK,
                                tools=[ADD], tool_choice=FORCED) as s:
        events = list(s)
        final = s.get_final_message()
    starts = [e for e in events if e.type == "content_block_start"]
    assert [e.content_block.type for e in starts] == ["tool_use"]
    assert starts[0].content_block.input == {}
    fragments = [e.delta.partial_json for e in events
                 if e.type == "content_block_delta" and e.delta.type == "input_json_delta"]
    assert fragments
    streamed = json.loads("".join(fragments))
    jsonschema.validate(streamed, ADD_SCHEMA)
    assert final.stop_reason == "tool_use"
    assert final.content[0].type == "tool_use" and final.content[0].input == streamed


def test_tool_result_round_trip(claude: anthropic.Anthropic) -> None:
    first = claude.messages.create(model=DEFAULT_MODEL, max_tokens=64, messages=ASK,
                                   tools=[ADD], tool_choice=FORCED)
    call = next(b for b in first.content if b.type == "tool_use")
    history: Any = [
        *ASK,
        {"role": "assistant", "content": first.content},  # replayed as the client got it
        {"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": call.id, "content": "5"},
            {"type": "tool_result", "tool_use_id": call.id, "is_error": True,
             "content": [{"type": "text", "text": "a second try failed"}]},
            {"type": "text", "text": "What is the result?"},
        ]},
    ]
    msg = claude.messages.create(model=DEFAULT_MODEL, max_tokens=8, messages=history,
                                 tools=[ADD], tool_choice={"type": "none"})
    assert msg.stop_reason in ("end_turn", "max_tokens")
    assert all(block.type == "text" for block in msg.content)


def test_count_tokens_matches_usage(claude: anthropic.Anthropic) -> None:
    request: Any = {"model": DEFAULT_MODEL, "system": [{"type": "text", "text": "Be exact."}],
                    "messages": ASK, "tools": [ADD]}
    counted = claude.messages.count_tokens(**request).input_tokens
    msg = claude.messages.create(max_tokens=4, **request)
    assert counted > 0
    # Anthropic reports prompt tokens read from a cache apart from input_tokens.
    assert msg.usage.input_tokens + (msg.usage.cache_read_input_tokens or 0) == counted
    longer = claude.messages.count_tokens(**{**request, "system": "Be exact. " * 20})
    assert longer.input_tokens > counted


def test_output_config_format_is_enforced(claude: anthropic.Anthropic) -> None:
    schema = {"type": "object", "properties": {"n": {"type": "integer", "minimum": 0,
                                                     "maximum": 9}},
              "required": ["n"], "additionalProperties": False}
    msg = claude.messages.create(
        model=DEFAULT_MODEL, max_tokens=32, messages=ASK,
        output_config={"format": {"type": "json_schema", "schema": schema}})
    assert msg.stop_reason == "end_turn"
    jsonschema.validate(json.loads("".join(b.text for b in msg.content if b.type == "text")),
                        schema)


STOPS = [" ", "e", "a", "o"]  # any English text hits one within a few tokens
STORY = [{"role": "user", "content": "Write a long story about a cat."}]


def test_stop_sequences(claude: anthropic.Anthropic) -> None:
    msg = claude.messages.create(model=DEFAULT_MODEL, max_tokens=32, messages=STORY,
                                 stop_sequences=STOPS, extra_body={"temperature": 0.0})
    assert msg.stop_reason == "stop_sequence" and msg.stop_sequence in STOPS
    text = "".join(b.text for b in msg.content if b.type == "text")
    assert not any(stop in text for stop in STOPS)  # cut, as Anthropic cuts it
    with claude.messages.stream(model=DEFAULT_MODEL, max_tokens=32, messages=STORY,
                                stop_sequences=STOPS, extra_body={"temperature": 0.0}) as s:
        final = s.get_final_message()
    assert final.stop_reason == "stop_sequence" and final.stop_sequence == msg.stop_sequence


@pytest.mark.parametrize(("body", "named"), [
    ({"messages": ASK}, "max_tokens"),
    ({"max_tokens": 4, "messages": [{"role": "user", "content": [
        {"type": "text", "text": "What is this?"},
        {"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                     "data": "iVBORw0KGgo="}}]}]}, "messages[0].content[1]"),
    ({"max_tokens": 4, "messages": ASK, "tools": [ADD], "tool_choice": {"type": "bogus"}},
     "tool_choice"),
    ({"max_tokens": 4, "messages": ASK, "tools": [ADD],
      "tool_choice": {"type": "tool", "name": "mul"}}, "tool_choice.name"),
    ({"max_tokens": 4, "messages": ASK, "temperature": 1.5}, "temperature"),
    ({"max_tokens": 4, "messages": ASK, "frobnicate": 1}, "frobnicate"),
    ({"max_tokens": 4, "messages": ASK, "container": "c1"}, "container"),
    ({"max_tokens": 4, "messages": ASK, "tools": [{"type": "web_search_20250305",
                                                   "name": "web_search"}]}, "tools[0].type"),
    ({"max_tokens": 2000, "messages": ASK, "tools": [ADD], "tool_choice": FORCED,
      "thinking": {"type": "enabled", "budget_tokens": 1024}}, "thinking"),
    ({"max_tokens": 1024, "messages": ASK,
      "thinking": {"type": "enabled", "budget_tokens": 1024}}, "budget_tokens"),
])
def test_bad_request_names_the_field(claude: anthropic.Anthropic, body: dict[str, Any],
                                     named: str) -> None:
    with pytest.raises(anthropic.BadRequestError) as info:
        claude.post("/v1/messages", cast_to=httpx.Response,
                    body={"model": DEFAULT_MODEL, **body})
    assert named in _error(info.value, "invalid_request_error")


def test_unknown_model_and_bad_json(claude: anthropic.Anthropic, http: httpx.Client) -> None:
    with pytest.raises(anthropic.NotFoundError) as info:
        claude.messages.create(model="no-such-model", max_tokens=4, messages=ASK)
    assert "no-such-model" in _error(info.value, "not_found_error")
    r = http.post("/v1/messages/count_tokens", content=b"{not json")
    assert r.status_code == 400 and r.json()["error"]["type"] == "invalid_request_error"
    r = http.get("/v1/messages")
    assert r.status_code == 405 and r.json()["type"] == "error"


def test_x_api_key(tmp_path: Path) -> None:
    server = start_server(tmp_path, "--api-key", "sesame", "--parallel", "1",
                          "--ctx-size", "512", name="keyed")
    try:
        request: Any = {"model": DEFAULT_MODEL, "messages": ASK}
        with anthropic.Anthropic(base_url=server.base_url, api_key="sesame",
                                 max_retries=0) as good:
            assert good.messages.count_tokens(**request).input_tokens > 0
        with anthropic.Anthropic(base_url=server.base_url, api_key="wrong",
                                 max_retries=0) as bad, \
                pytest.raises(anthropic.AuthenticationError) as info:
            bad.messages.count_tokens(**request)
        _error(info.value, "authentication_error")
        # OpenAI's Bearer keeps working, and the OpenAI door keeps its own error shape.
        r = httpx.get(f"{server.base_url}/v1/models", headers={"x-api-key": "wrong"})
        assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"
        r = httpx.get(f"{server.base_url}/v1/models",
                      headers={"Authorization": "Bearer sesame"})
        assert r.status_code == 200
    finally:
        stop_server(server)


# --- no model needed -------------------------------------------------------------------

def test_blocks_from_chat_deltas() -> None:
    blocks = Blocks()
    events = blocks.feed([{"reasoning_content": "hmm"}, {"reasoning_content": " ok"},
                          {"content": "\n\n"}, {"content": "Hi"},
                          {"tool_calls": [{"index": 0, "id": "c", "type": "function",
                                           "function": {"name": "add", "arguments": ""}}]},
                          {"tool_calls": [{"index": 0, "function": {"arguments": '{"a":'}}]},
                          {"tool_calls": [{"index": 0, "function": {"arguments": " 1}"}}]}])
    events += blocks.close()
    assert [b["type"] for b in blocks.blocks] == ["thinking", "text", "tool_use"]
    assert blocks.blocks[0]["thinking"] == "hmm ok" and blocks.blocks[1]["text"] == "Hi"
    assert blocks.blocks[2]["input"] == {"a": 1}
    kinds = [k for k, _ in events]
    assert kinds.count("content_block_start") == kinds.count("content_block_stop") == 3
    deltas = [p["delta"]["type"] for k, p in events if k == "content_block_delta"]
    assert deltas == ["thinking_delta", "thinking_delta", "text_delta", "input_json_delta",
                      "input_json_delta"]


@pytest.mark.parametrize(("status", "openai_type", "kind"), [
    (400, "invalid_request_error", "invalid_request_error"),
    (401, "invalid_request_error", "authentication_error"),
    (404, "invalid_request_error", "not_found_error"),
    (429, "server_overloaded", "rate_limit_error"),
    (503, "server_overloaded", "overloaded_error"),
    (503, "server_error", "api_error"),
    (500, "server_error", "api_error"),
])
def test_error_types(status: int, openai_type: str, kind: str) -> None:
    body = anthropic_body(status, {"error": {"message": "m", "type": openai_type,
                                             "param": "p", "code": None}})
    assert body == {"type": "error", "error": {"type": kind, "message": "p: m"}}
