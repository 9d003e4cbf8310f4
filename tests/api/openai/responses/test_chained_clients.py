"""Real clients chaining Responses by previous_response_id against the real server: a
Codex-style tool turn through the `openai` client (a function call, then only its
output sent back, streamed), and openai-agents' Responses model over two runs."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import openai
import pytest
from agents import Agent, ModelSettings, OpenAIResponsesModel, Runner, set_tracing_disabled
from conftest import DEFAULT_MODEL, RunningServer
from openai.types.responses import Response
from test_stored_responses import check_continues

from edge_testkit.tools import ADD

ADD_TOOL = {"type": "function", **ADD}


@pytest.fixture(autouse=True, scope="module")
def no_tracing() -> None:
    # Traces would be exported to OpenAI's platform: nothing leaves this machine.
    set_tracing_disabled(True)


def test_codex_style_function_call_then_its_output(client: openai.OpenAI) -> None:
    """The call is answered by sending only its function_call_output: the server holds
    the rest. The model's own call tokens are continued, not re-rendered."""
    first = client.responses.create(model=DEFAULT_MODEL, input="Add 2 and 3.",
                                    tools=[ADD_TOOL], tool_choice="required",
                                    max_output_tokens=60, temperature=0)
    [call] = first.output
    assert call.type == "function_call" and json.loads(call.arguments)
    events = list(client.responses.create(
        model=DEFAULT_MODEL, previous_response_id=first.id, tools=[ADD_TOOL],
        input=[{"type": "function_call_output", "call_id": call.call_id, "output": "5"}],
        max_output_tokens=8, temperature=0, stream=True))
    assert events[0].type == "response.created"
    assert events[-1].type in ("response.completed", "response.incomplete")
    second: Response = events[-1].response  # type: ignore[union-attr]
    assert second.previous_response_id == first.id and second.output
    check_continues(first, second)
    # The stored conversation: the request, the call, then the call's output.
    items = client.responses.input_items.list(second.id, order="asc").data
    assert [item.type for item in items] == ["message", "function_call",
                                             "function_call_output"]
    assert items[1].call_id == items[2].call_id == call.call_id  # type: ignore[union-attr]


def test_agents_responses_model_over_two_runs(server: RunningServer) -> None:
    """The second run sends only its new message, chained by previous_response_id."""

    async def main() -> tuple[Any, Any, list[Any]]:
        async with openai.AsyncOpenAI(base_url=server.v1, api_key="unused",
                                      max_retries=0) as c:
            agent = Agent(name="a", instructions="Answer briefly.",
                          model=OpenAIResponsesModel(model=DEFAULT_MODEL, openai_client=c),
                          model_settings=ModelSettings(max_tokens=12, temperature=0))
            first = await Runner.run(agent, "Name a colour.")
            second = await Runner.run(agent, "Name another one.",
                                      previous_response_id=first.last_response_id)
            listed = await c.responses.input_items.list(second.last_response_id, order="asc")
            return first, second, listed.data

    first, second, items = asyncio.run(main())
    assert isinstance(first.final_output, str) and isinstance(second.final_output, str)
    [first_response] = first.raw_responses
    [second_response] = second.raw_responses
    assert second.last_response_id != first.last_response_id
    usage_1, usage_2 = first_response.usage, second_response.usage
    assert usage_2.input_tokens_details.cached_tokens >= (
        usage_1.input_tokens + usage_1.output_tokens - 1)
    assert [(item.type, item.role) for item in items] == [
        ("message", "user"), ("message", "assistant"), ("message", "user")]
