"""langchain-openai's ChatOpenAI against the real server (see test_client_compat)."""

from __future__ import annotations

from functools import reduce
from operator import add
from typing import Any

import pytest
from conftest import DEFAULT_MODEL, RunningServer
from langchain_core.messages import AIMessage, AIMessageChunk, HumanMessage, ToolMessage
from langchain_openai import ChatOpenAI
from test_client_compat import (
    CHAT_PROMPT,
    CHAT_TOKENS,
    JSON_TOKENS,
    NO_EOS,
    PET_AGE_CALL_ID,
    PET_AGE_TOOL,
    PET_PROMPT,
    TOOL_QUESTION,
    Pet,
)


def chat_model(server: RunningServer, max_tokens: int, **kwargs: Any) -> ChatOpenAI:
    return ChatOpenAI(
        base_url=server.v1,
        api_key="unused",
        model=DEFAULT_MODEL,
        temperature=0,
        max_tokens=max_tokens,
        max_retries=0,
        **kwargs,
    )


def joined(chunks: list[AIMessageChunk]) -> AIMessageChunk:
    return reduce(add, chunks)


def test_langchain_chat(server: RunningServer) -> None:
    r = chat_model(server, CHAT_TOKENS, extra_body=NO_EOS).invoke(CHAT_PROMPT)
    assert isinstance(r, AIMessage)
    assert isinstance(r.content, str) and r.content
    assert r.response_metadata["finish_reason"] == "length"
    assert r.response_metadata["model_name"] == DEFAULT_MODEL
    usage = r.usage_metadata
    assert usage is not None
    assert usage["input_tokens"] > 0 and 0 < usage["output_tokens"] <= CHAT_TOKENS
    assert usage["total_tokens"] == usage["input_tokens"] + usage["output_tokens"]


def test_langchain_stream(server: RunningServer) -> None:
    llm = chat_model(server, CHAT_TOKENS, extra_body=NO_EOS, stream_usage=True)
    chunks = list(llm.stream(CHAT_PROMPT))
    assert len([c for c in chunks if c.content]) >= 3
    whole = joined(chunks)
    assert isinstance(whole.content, str) and whole.content
    assert whole.response_metadata["finish_reason"] == "length"
    assert whole.usage_metadata is not None
    assert 0 < whole.usage_metadata["output_tokens"] <= CHAT_TOKENS


def test_langchain_structured_output_json_schema(server: RunningServer) -> None:
    structured = chat_model(server, JSON_TOKENS).with_structured_output(
        Pet, method="json_schema", include_raw=True
    )
    r = structured.invoke(PET_PROMPT)
    assert r["parsing_error"] is None
    assert isinstance(r["parsed"], Pet)
    assert r["raw"].response_metadata["finish_reason"] == "stop"


@pytest.mark.parametrize("strict", [None, True])
def test_langchain_structured_output_function_calling(
    server: RunningServer, strict: bool | None
) -> None:
    structured = chat_model(server, JSON_TOKENS).with_structured_output(
        Pet, method="function_calling", strict=strict, include_raw=True
    )
    r = structured.invoke(PET_PROMPT)
    assert r["parsing_error"] is None
    assert isinstance(r["parsed"], Pet)
    raw = r["raw"]
    assert raw.response_metadata["finish_reason"] == "tool_calls"
    assert [c["name"] for c in raw.tool_calls] == ["Pet"]


def test_langchain_bind_tools_stream(server: RunningServer) -> None:
    llm = chat_model(server, JSON_TOKENS).bind_tools([Pet], tool_choice="Pet")
    chunks = list(llm.stream(PET_PROMPT))
    whole = joined(chunks)
    assert whole.invalid_tool_calls == []
    [call] = whole.tool_calls
    assert call["name"] == "Pet" and call["id"]
    Pet.model_validate(call["args"])
    assert whole.response_metadata["finish_reason"] == "tool_calls"


def test_langchain_tool_result_round_trip(server: RunningServer) -> None:
    history = [
        HumanMessage(TOOL_QUESTION),
        AIMessage(
            content="",
            tool_calls=[{"name": "pet_age", "args": {"name": "Rex"}, "id": PET_AGE_CALL_ID}],
        ),
        ToolMessage("3", tool_call_id=PET_AGE_CALL_ID),
    ]
    r = chat_model(server, CHAT_TOKENS).bind_tools([PET_AGE_TOOL]).invoke(history)
    assert isinstance(r, AIMessage)
    assert r.response_metadata["finish_reason"] in {"stop", "length", "tool_calls"}
    assert r.content or r.tool_calls
    assert r.usage_metadata is not None and r.usage_metadata["output_tokens"] > 0
