"""pydantic-ai's OpenAI chat model against the real server (see test_client_compat)."""

from __future__ import annotations

from typing import Any

from conftest import DEFAULT_MODEL, RunningServer
from pydantic_ai import Agent
from pydantic_ai.messages import (
    ModelRequest,
    ModelResponse,
    TextPart,
    ToolCallPart,
    ToolReturnPart,
    UserPromptPart,
)
from pydantic_ai.models.openai import OpenAIChatModel
from pydantic_ai.output import NativeOutput
from pydantic_ai.providers.openai import OpenAIProvider
from pydantic_ai.settings import ModelSettings
from test_client_compat import (
    CHAT_PROMPT,
    CHAT_TOKENS,
    JSON_TOKENS,
    NO_EOS,
    PET_AGE_CALL_ID,
    PET_PROMPT,
    TOOL_QUESTION,
    Pet,
)

CHAT_SETTINGS = ModelSettings(max_tokens=CHAT_TOKENS, temperature=0, extra_body=NO_EOS)
JSON_SETTINGS = ModelSettings(max_tokens=JSON_TOKENS, temperature=0)


def agent(server: RunningServer, **kwargs: Any) -> Agent[None, Any]:
    provider = OpenAIProvider(base_url=server.v1, api_key="unused")
    return Agent(OpenAIChatModel(DEFAULT_MODEL, provider=provider), **kwargs)


def test_pydantic_ai_chat(server: RunningServer) -> None:
    r = agent(server).run_sync(CHAT_PROMPT, model_settings=CHAT_SETTINGS)
    assert isinstance(r.output, str) and r.output
    assert r.usage.requests == 1
    assert r.usage.input_tokens > 0 and 0 < r.usage.output_tokens <= CHAT_TOKENS
    [response] = [m for m in r.new_messages() if isinstance(m, ModelResponse)]
    assert response.model_name == DEFAULT_MODEL
    assert response.finish_reason == "length"


def test_pydantic_ai_stream(server: RunningServer) -> None:
    r = agent(server).run_stream_sync(CHAT_PROMPT, model_settings=CHAT_SETTINGS)
    deltas = list(r.stream_text(delta=True, debounce_by=None))
    assert len([d for d in deltas if d]) >= 3
    assert r.is_complete
    assert 0 < r.usage.output_tokens <= CHAT_TOKENS


def test_pydantic_ai_native_output(server: RunningServer) -> None:
    r = agent(server, output_type=NativeOutput(Pet)).run_sync(
        PET_PROMPT, model_settings=JSON_SETTINGS
    )
    assert isinstance(r.output, Pet)
    assert r.usage.requests == 1


def test_pydantic_ai_native_output_stream(server: RunningServer) -> None:
    r = agent(server, output_type=NativeOutput(Pet)).run_stream_sync(
        PET_PROMPT, model_settings=JSON_SETTINGS
    )
    outputs = list(r.stream_output(debounce_by=None))
    assert outputs
    assert isinstance(r.get_output(), Pet)


def test_pydantic_ai_tool_output(server: RunningServer) -> None:
    """The default output mode: a forced call of the `final_result` tool."""
    r = agent(server, output_type=Pet).run_sync(PET_PROMPT, model_settings=JSON_SETTINGS)
    assert isinstance(r.output, Pet)
    assert r.usage.requests == 1
    response = next(m for m in r.new_messages() if isinstance(m, ModelResponse))
    assert [p.tool_name for p in response.parts if isinstance(p, ToolCallPart)] == ["final_result"]


def test_pydantic_ai_tool_output_stream(server: RunningServer) -> None:
    r = agent(server, output_type=Pet).run_stream_sync(PET_PROMPT, model_settings=JSON_SETTINGS)
    outputs = list(r.stream_output(debounce_by=None))
    assert outputs
    assert isinstance(r.get_output(), Pet)
    assert r.usage.requests == 1


def test_pydantic_ai_tool_result_round_trip(server: RunningServer) -> None:
    """A history holding a tool call and its result, then the final answer (no tools on
    the last request, so the answer is text whatever the model would call)."""
    history = [
        ModelRequest(parts=[UserPromptPart(TOOL_QUESTION)]),
        ModelResponse(
            parts=[ToolCallPart("pet_age", {"name": "Rex"}, tool_call_id=PET_AGE_CALL_ID)]
        ),
        ModelRequest(parts=[ToolReturnPart("pet_age", 3, tool_call_id=PET_AGE_CALL_ID)]),
    ]
    r = agent(server).run_sync(message_history=history, model_settings=CHAT_SETTINGS)
    assert isinstance(r.output, str) and r.output
    [response] = [m for m in r.new_messages() if isinstance(m, ModelResponse)]
    assert [type(p) for p in response.parts] == [TextPart]
