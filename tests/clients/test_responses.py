"""POST /v1/responses with the official `openai` client and openai-agents' default model,
against the real server: shapes, events and statuses, never the words the model picks.

Where a test needs several text deltas or a cut-off answer, a text.format grammar asks for
a long string, so the model cannot end early whatever it would say."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx
import jsonschema
import openai
import pytest
from agents import Agent, ModelSettings, OpenAIResponsesModel, Runner, set_tracing_disabled
from agents.items import ToolCallItem
from conftest import DEFAULT_MODEL, RunningServer
from openai.types.responses import Response
from test_client_agents import pet_recorder
from test_client_compat import PET_PROMPT, Pet

from edge_server.api.openai.responses.streaming import OutputItems
from edge_testkit.tools import ADD, Paint

LONG_TEXT = {"type": "json_schema", "name": "t",
             "schema": {"type": "string", "pattern": "^[a-z ]{200,400}$"}}
ADD_TOOL = {"type": "function", **ADD}


def create(client: openai.OpenAI, **kwargs: Any) -> Response:
    return client.responses.create(model=DEFAULT_MODEL, **kwargs)


def check_usage(r: Response, max_output: int) -> None:
    assert r.usage is not None
    assert r.usage.input_tokens > 0 and 0 < r.usage.output_tokens <= max_output
    assert r.usage.total_tokens == r.usage.input_tokens + r.usage.output_tokens
    assert r.usage.input_tokens_details.cached_tokens >= 0
    assert r.usage.output_tokens_details.reasoning_tokens == 0


def test_plain_text(client: openai.OpenAI) -> None:
    r = create(client, input="Name a colour.", instructions="Answer briefly.",
               max_output_tokens=16, temperature=0, metadata={"k": "v"})
    assert r.object == "response" and r.id.startswith("resp_")
    assert r.status in ("completed", "incomplete") and r.model == DEFAULT_MODEL
    [item] = r.output
    assert item.type == "message" and item.role == "assistant" and item.id.startswith("msg_")
    [part] = item.content
    assert part.type == "output_text" and part.annotations == []
    assert isinstance(r.output_text, str) and r.output_text == part.text and r.output_text
    check_usage(r, 16)
    # The request's settings are echoed, and the whole answer is a valid Response.
    assert r.instructions == "Answer briefly." and r.metadata == {"k": "v"}
    assert r.temperature == 0 and r.max_output_tokens == 16 and r.tools == []
    Response.model_validate(r.model_dump())


def test_max_output_tokens_cut_is_incomplete(client: openai.OpenAI) -> None:
    r = create(client, input="Tell a story.", max_output_tokens=5, text={"format": LONG_TEXT})
    assert r.status == "incomplete"
    assert r.incomplete_details is not None
    assert r.incomplete_details.reason == "max_output_tokens"
    assert r.output[0].status == "incomplete" and r.usage and r.usage.output_tokens == 5


def test_json_schema_output_parses(client: openai.OpenAI) -> None:
    schema = Paint.model_json_schema()
    r = create(client, input="Paint something.", max_output_tokens=160, temperature=0,
               text={"format": {"type": "json_schema", "name": "paint", "schema": schema,
                                "strict": True}})
    assert r.status == "completed"
    Paint.model_validate_json(r.output_text)
    assert r.text and r.text.format and r.text.format.type == "json_schema"


def test_forced_function_call(client: openai.OpenAI) -> None:
    """A named tool_choice of a tool whose parameters hold an Enum and a nested model."""
    parameters = Paint.model_json_schema()
    tool = {"type": "function", "name": "paint", "description": "Paint a point.",
            "parameters": parameters, "strict": True}
    r = create(client, input="Paint a red point.", tools=[tool], max_output_tokens=160,
               tool_choice={"type": "function", "name": "paint"}, temperature=0)
    [call] = r.output
    assert call.type == "function_call" and call.name == "paint" and call.status == "completed"
    assert call.id and call.id.startswith("fc_") and call.call_id
    jsonschema.validate(json.loads(call.arguments), parameters)
    assert r.tool_choice.type == "function" and r.tools[0].name == "paint"  # type: ignore[union-attr]
    assert r.output_text == ""


def test_function_call_output_round_trip(client: openai.OpenAI) -> None:
    """A call and its output fed back as input; no tools, so the answer is a message."""
    first = create(client, input="Add 2 and 3.", tools=[ADD_TOOL], tool_choice="required",
                   max_output_tokens=60, temperature=0)
    [call] = first.output
    assert call.type == "function_call"
    history: list[Any] = [{"role": "user", "content": "Add 2 and 3."},
                          *[item.model_dump(exclude_none=True) for item in first.output],
                          {"type": "function_call_output", "call_id": call.call_id,
                           "output": "5"}]
    r = create(client, input=history, max_output_tokens=8)
    assert [item.type for item in r.output] == ["message"]
    check_usage(r, 8)


def test_stream_events(client: openai.OpenAI) -> None:
    with client.responses.stream(model=DEFAULT_MODEL, input="Tell a story.",
                                 max_output_tokens=8, text={"format": LONG_TEXT}) as stream:
        events = list(stream)
    # The cut-off answer ends with response.incomplete, as OpenAI's does (the client's
    # get_final_response() only takes response.completed).
    final = events[-1].response  # type: ignore[union-attr]
    types = [e.type for e in events]
    assert types[:5] == ["response.created", "response.in_progress",
                         "response.output_item.added", "response.content_part.added",
                         "response.output_text.delta"]
    assert types[-4:] == ["response.output_text.done", "response.content_part.done",
                          "response.output_item.done", "response.incomplete"]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    deltas = [e.delta for e in events if e.type == "response.output_text.delta"]
    assert len(deltas) >= 3
    done = next(e for e in events if e.type == "response.output_text.done")
    assert done.text == "".join(deltas) == final.output_text
    assert final.status == "incomplete" and final.usage and final.usage.output_tokens == 8


def test_stream_function_call_arguments(client: openai.OpenAI) -> None:
    with client.responses.stream(model=DEFAULT_MODEL, input="Add 2 and 3.", tools=[ADD_TOOL],
                                 tool_choice="required", max_output_tokens=60,
                                 temperature=0) as stream:
        events = list(stream)
    types = [e.type for e in events]
    assert types[:3] == ["response.created", "response.in_progress", "response.output_item.added"]
    assert types[-3:] == ["response.function_call_arguments.done", "response.output_item.done",
                          "response.completed"]
    fragments = [e.delta for e in events if e.type == "response.function_call_arguments.delta"]
    assert len(fragments) >= 2
    done = events[-3]
    assert done.name == "add" and done.arguments == "".join(fragments)  # type: ignore[union-attr]
    jsonschema.validate(json.loads(done.arguments), ADD["parameters"])  # type: ignore[union-attr]
    final = events[-1].response  # type: ignore[union-attr]
    assert final.output[0].arguments == done.arguments  # type: ignore[union-attr]


@pytest.mark.parametrize(("body", "param"), [
    ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]},
     "input[0].content[0]"),
    ({"input": "hi", "tools": [{"type": "web_search"}]}, "tools[0].type"),
    ({"input": "hi", "conversation": "c"}, "conversation"),
    ({"input": "hi", "frobnicate": 1}, "frobnicate"),
    ({"input": [{"type": "function_call", "name": "f", "arguments": "{}"}]}, "input[0].call_id"),
    ({"input": "hi", "temperature": 3}, "temperature"),
    ({"input": "hi", "tool_choice": "required"}, "tool_choice"),
    ({"input": "hi", "text": {"format": {"type": "json_schema", "name": "x"}}},
     "text.format.schema"),
    ({"input": "hi", "text": {"format": {"type": "json_schema", "name": "x",
                                         "schema": {"$ref": "#/nope"}}}}, "text.format"),
    ({"input": "hi", "reasoning": {"summary": "auto"}}, "reasoning.summary"),
])
def test_bad_input_is_400_naming_the_field(http: httpx.Client, body: dict[str, Any],
                                           param: str) -> None:
    r = http.post("/v1/responses", json={"model": DEFAULT_MODEL, **body})
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == param and error["type"] == "invalid_request_error"


def test_harmless_defaults_are_accepted(client: openai.OpenAI) -> None:
    r = create(client, input="Hi.", max_output_tokens=2, store=False, include=[],
               truncation="disabled", parallel_tool_calls=True, reasoning={"effort": "low"},
               prompt_cache_key="k", user="u", top_p=0.9)
    assert r.status in ("completed", "incomplete") and r.store is False


def test_unknown_model_is_404(client: openai.OpenAI) -> None:
    with pytest.raises(openai.NotFoundError):
        client.responses.create(model="no-such-model", input="hi")


def test_output_items_from_chat_deltas() -> None:
    """Reasoning, text and a call become three items, and whitespace that opens no message
    makes none; the events build exactly the items (no server: the chat deltas are given)."""
    items = OutputItems()
    events = items.push([{"reasoning_content": "think"}, {"content": "Hi"}, {"content": " "}])
    events += items.push([{"content": "\n"}])
    call = {"index": 0, "id": "call_1", "type": "function",
            "function": {"name": "f", "arguments": ""}}
    events += items.push([{"content": " "}, {"tool_calls": [call]}])
    events += items.push([{"tool_calls": [{"index": 0, "function": {"arguments": "{}"}}]}])
    events += items.finish(incomplete=False)
    assert [i["type"] for i in items.items] == ["reasoning", "message", "function_call"]
    assert items.items[0]["content"] == [{"type": "reasoning_text", "text": "think"}]
    assert items.output_text == "Hi \n " and items.items[2]["arguments"] == "{}"
    done = [e["item"] for e in events if e["type"] == "response.output_item.done"]
    assert done == items.items and all(i["status"] == "completed" for i in done)
    assert [e["output_index"] for e in events if e["type"] == "response.output_item.added"] \
        == [0, 1, 2]
    blank = OutputItems()
    blank.push([{"content": "\n "}, {"tool_calls": [call]}])
    blank.finish(incomplete=False)
    assert [i["type"] for i in blank.items] == ["function_call"]
    empty = OutputItems()
    empty.finish(incomplete=True)
    assert [(i["type"], i["status"]) for i in empty.items] == [("message", "incomplete")]


@pytest.fixture(autouse=True, scope="module")
def no_tracing() -> None:
    # Traces would be exported to OpenAI's platform: nothing leaves this machine.
    set_tracing_disabled(True)


@pytest.mark.parametrize("stream", [False, True])
def test_agents_default_model_forced_tool(server: RunningServer, stream: bool) -> None:
    """openai-agents' default model (the Responses API) calls a strict function tool."""
    tool, pets = pet_recorder()

    async def main() -> Any:
        async with openai.AsyncOpenAI(base_url=server.v1, api_key="unused",
                                      max_retries=0) as c:
            agent = Agent(
                name="a", tools=[tool], tool_use_behavior="stop_on_first_tool",
                model=OpenAIResponsesModel(model=DEFAULT_MODEL, openai_client=c),
                model_settings=ModelSettings(max_tokens=160, temperature=0,
                                             tool_choice="record_pet"),
            )
            if not stream:
                return await Runner.run(agent, PET_PROMPT, max_turns=2)
            r = Runner.run_streamed(agent, PET_PROMPT, max_turns=2)
            [_ async for _ in r.stream_events()]
            return r

    r = asyncio.run(main())
    assert r.final_output == "recorded"
    assert len(pets) == 1 and isinstance(pets[0], Pet)
    assert [i.raw_item.name for i in r.new_items if isinstance(i, ToolCallItem)] == ["record_pet"]
    assert r.context_wrapper.usage.requests == 1 and r.context_wrapper.usage.input_tokens > 0
