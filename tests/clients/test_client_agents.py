"""openai-agents over its Chat Completions model against the real server (see
test_client_compat)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import openai
import pytest
from agents import (
    Agent,
    FunctionTool,
    ModelSettings,
    OpenAIChatCompletionsModel,
    Runner,
    function_tool,
    set_tracing_disabled,
)
from agents.items import ToolCallItem
from conftest import DEFAULT_MODEL, RunningServer
from openai.types.responses import (
    ResponseCompletedEvent,
    ResponseFunctionCallArgumentsDeltaEvent,
    ResponseTextDeltaEvent,
)
from test_client_compat import (
    CHAT_PROMPT,
    CHAT_TOKENS,
    JSON_TOKENS,
    NO_EOS,
    PET_AGE_ARGUMENTS,
    PET_AGE_CALL_ID,
    PET_PROMPT,
    TOOL_QUESTION,
    Pet,
)

T = TypeVar("T")
CHAT_SETTINGS = ModelSettings(
    max_tokens=CHAT_TOKENS, temperature=0, include_usage=True, extra_body=NO_EOS
)
JSON_SETTINGS = ModelSettings(max_tokens=JSON_TOKENS, temperature=0, include_usage=True)


@pytest.fixture(autouse=True, scope="module")
def no_tracing() -> None:
    # Traces would be exported to OpenAI's platform: nothing leaves this machine.
    set_tracing_disabled(True)


def run(server: RunningServer, body: Callable[[OpenAIChatCompletionsModel], Awaitable[T]]) -> T:
    """`body` with a model on a client of its own event loop."""

    async def main() -> T:
        async with openai.AsyncOpenAI(base_url=server.v1, api_key="unused", max_retries=0) as c:
            return await body(OpenAIChatCompletionsModel(model=DEFAULT_MODEL, openai_client=c))

    return asyncio.run(main())


def pet_recorder() -> tuple[FunctionTool, list[Pet]]:
    """A tool taking the Pet model (an Enum field, a nested model), and what it was given."""
    pets: list[Pet] = []

    @function_tool
    def record_pet(pet: Pet) -> str:
        """Record a pet and its owner."""
        pets.append(pet)
        return "recorded"

    return record_pet, pets


def test_agents_chat(server: RunningServer) -> None:
    async def body(model: OpenAIChatCompletionsModel) -> Any:
        return await Runner.run(
            Agent(name="a", model=model, model_settings=CHAT_SETTINGS), CHAT_PROMPT
        )

    r = run(server, body)
    assert isinstance(r.final_output, str) and r.final_output
    usage = r.context_wrapper.usage
    assert usage.requests == 1
    assert usage.input_tokens > 0 and 0 < usage.output_tokens <= CHAT_TOKENS
    assert usage.total_tokens == usage.input_tokens + usage.output_tokens


def test_agents_stream(server: RunningServer) -> None:
    async def body(model: OpenAIChatCompletionsModel) -> tuple[Any, list[Any]]:
        agent = Agent(name="a", model=model, model_settings=CHAT_SETTINGS)
        r = Runner.run_streamed(agent, CHAT_PROMPT)
        raw = [e.data async for e in r.stream_events() if e.type == "raw_response_event"]
        return r, raw

    r, raw = run(server, body)
    assert len([e for e in raw if isinstance(e, ResponseTextDeltaEvent) and e.delta]) >= 3
    assert isinstance(raw[-1], ResponseCompletedEvent)
    assert isinstance(r.final_output, str) and r.final_output
    assert 0 < r.context_wrapper.usage.output_tokens <= CHAT_TOKENS


def test_agents_output_type(server: RunningServer) -> None:
    """A structured output_type goes out as a strict json_schema response_format."""

    async def body(model: OpenAIChatCompletionsModel) -> Any:
        agent = Agent(name="a", model=model, model_settings=JSON_SETTINGS, output_type=Pet)
        return await Runner.run(agent, PET_PROMPT)

    r = run(server, body)
    assert isinstance(r.final_output, Pet)


def test_agents_output_type_stream(server: RunningServer) -> None:
    async def body(model: OpenAIChatCompletionsModel) -> Any:
        agent = Agent(name="a", model=model, model_settings=JSON_SETTINGS, output_type=Pet)
        r = Runner.run_streamed(agent, PET_PROMPT)
        [_ async for _ in r.stream_events()]
        return r

    assert isinstance(run(server, body).final_output, Pet)


@pytest.mark.parametrize("stream", [False, True])
def test_agents_forced_tool(server: RunningServer, stream: bool) -> None:
    """A required call of a strict function tool whose parameter is the Pet model; the run
    stops at the tool, so there is one request."""
    tool, pets = pet_recorder()

    async def body(model: OpenAIChatCompletionsModel) -> tuple[Any, list[Any]]:
        agent = Agent(
            name="a",
            model=model,
            model_settings=JSON_SETTINGS.resolve(ModelSettings(tool_choice="record_pet")),
            tools=[tool],
            tool_use_behavior="stop_on_first_tool",
        )
        if not stream:
            return await Runner.run(agent, PET_PROMPT), []
        r = Runner.run_streamed(agent, PET_PROMPT)
        raw = [e.data async for e in r.stream_events() if e.type == "raw_response_event"]
        return r, raw

    r, raw = run(server, body)
    assert r.final_output == "recorded"
    assert len(pets) == 1 and isinstance(pets[0], Pet)
    assert [i.raw_item.name for i in r.new_items if isinstance(i, ToolCallItem)] == ["record_pet"]
    assert r.context_wrapper.usage.requests == 1
    if stream:
        assert any(isinstance(e, ResponseFunctionCallArgumentsDeltaEvent) for e in raw)


def test_agents_tool_result_round_trip(server: RunningServer) -> None:
    """An input holding a function call and its output, then the final answer (no tools,
    so the answer is text whatever the model would call)."""
    history: list[Any] = [
        {"role": "user", "content": TOOL_QUESTION},
        {
            "type": "function_call",
            "call_id": PET_AGE_CALL_ID,
            "name": "pet_age",
            "arguments": PET_AGE_ARGUMENTS,
        },
        {"type": "function_call_output", "call_id": PET_AGE_CALL_ID, "output": "3"},
    ]

    async def body(model: OpenAIChatCompletionsModel) -> Any:
        agent = Agent(name="a", model=model, model_settings=CHAT_SETTINGS)
        return await Runner.run(agent, history)

    r = run(server, body)
    assert isinstance(r.final_output, str) and r.final_output
    assert r.context_wrapper.usage.requests == 1
