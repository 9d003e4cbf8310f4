"""Client compatibility: the real server through client libraries, as users run them.

This module holds what the test_client_* modules share (a pydantic model with an Enum
field and a nested model, prompts, token budgets) and the official `openai` client's
chat, streaming, structured output and tool-result checks; test_client_openai_tools
holds its function calling, and the other modules drive langchain-openai, instructor,
pydantic-ai and openai-agents the same way. Only the protocol is checked: shapes, finish
reasons, usage, and that grammar-forced output parses into the model, never the words
the model writes.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Any

import openai
import pytest
from conftest import DEFAULT_MODEL
from pydantic import BaseModel, Field


class Species(StrEnum):
    cat = "cat"
    dog = "dog"
    bird = "bird"


class Owner(BaseModel):
    name: str = Field(max_length=12)
    age: int = Field(ge=0, le=120)


class Pet(BaseModel):
    """A pet and its owner."""

    species: Species
    owner: Owner


PET_PROMPT = "Describe a pet and its owner."
CHAT_PROMPT = "Name a colour."
TOOL_QUESTION = "How old is Rex?"
# Enough for the grammar-forced Pet (and a tool call around it) to close.
JSON_TOKENS = 160
# Plain answers: a few tokens, and never an early end, so that a stream has several chunks
# whatever the model would say.
CHAT_TOKENS = 8
NO_EOS = {"ignore_eos": True}

# A flat tool for the round trips: they check the tool-message protocol, not schemas.
PET_AGE_TOOL: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "pet_age",
        "description": "The age of a pet, in years.",
        "parameters": {
            "type": "object",
            "properties": {"name": {"type": "string"}},
            "required": ["name"],
        },
    },
}
PET_AGE_CALL_ID = "call_pet_age_1"
PET_AGE_ARGUMENTS = '{"name": "Rex"}'
TOOL_HISTORY: list[dict[str, Any]] = [
    {"role": "user", "content": TOOL_QUESTION},
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": PET_AGE_CALL_ID,
                "type": "function",
                "function": {"name": "pet_age", "arguments": PET_AGE_ARGUMENTS},
            }
        ],
    },
    {"role": "tool", "tool_call_id": PET_AGE_CALL_ID, "content": "3"},
]


def pet_messages() -> list[dict[str, Any]]:
    return [{"role": "user", "content": PET_PROMPT}]


def named(name: str) -> dict[str, Any]:
    return {"type": "function", "function": {"name": name}}


def assert_usage(usage: Any, max_completion: int) -> None:
    assert usage is not None
    assert usage.prompt_tokens > 0
    assert 0 < usage.completion_tokens <= max_completion
    assert usage.total_tokens == usage.prompt_tokens + usage.completion_tokens


def accumulate_tool_calls(chunks: list[Any]) -> dict[int, dict[str, str]]:
    """Tool call deltas of a stream joined by index, as clients join them."""
    calls: dict[int, dict[str, str]] = {}
    for chunk in chunks:
        for choice in chunk.choices:
            for delta in choice.delta.tool_calls or []:
                call = calls.setdefault(delta.index, {"id": "", "name": "", "arguments": ""})
                call["id"] += delta.id or ""
                if delta.function is not None:
                    call["name"] += delta.function.name or ""
                    call["arguments"] += delta.function.arguments or ""
    return calls


def test_openai_models_retrieve(client: openai.OpenAI) -> None:
    model = client.models.retrieve(DEFAULT_MODEL)
    assert model.id == DEFAULT_MODEL
    assert model.object == "model"
    assert isinstance(model.created, int)
    assert isinstance(model.owned_by, str)


def test_openai_chat(client: openai.OpenAI) -> None:
    r = client.chat.completions.create(
        model=DEFAULT_MODEL,
        messages=[{"role": "user", "content": CHAT_PROMPT}],
        max_tokens=CHAT_TOKENS,
        temperature=0,
        extra_body=NO_EOS,
    )
    assert isinstance(r.choices[0].message.content, str) and r.choices[0].message.content
    assert r.choices[0].finish_reason == "length"
    assert_usage(r.usage, CHAT_TOKENS)


def test_openai_chat_stream(client: openai.OpenAI) -> None:
    chunks = list(
        client.chat.completions.create(
            model=DEFAULT_MODEL,
            messages=[{"role": "user", "content": CHAT_PROMPT}],
            max_tokens=CHAT_TOKENS,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
            extra_body=NO_EOS,
        )
    )
    texts = [c.choices[0].delta.content for c in chunks if c.choices and c.choices[0].delta.content]
    assert len(texts) >= 3
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices]
    assert finishes[-1] == "length" and not any(finishes[:-1])
    assert_usage(chunks[-1].usage, CHAT_TOKENS)


def test_openai_parse_response_format(client: openai.OpenAI) -> None:
    r = client.chat.completions.parse(
        model=DEFAULT_MODEL,
        messages=pet_messages(),
        response_format=Pet,
        max_tokens=JSON_TOKENS,
        temperature=0,
    )
    message = r.choices[0].message
    assert r.choices[0].finish_reason == "stop"
    assert isinstance(message.parsed, Pet)
    assert Pet.model_validate_json(message.content) == message.parsed
    assert_usage(r.usage, JSON_TOKENS)


def test_openai_stream_response_format(client: openai.OpenAI) -> None:
    with client.chat.completions.stream(
        model=DEFAULT_MODEL,
        messages=pet_messages(),
        response_format=Pet,
        max_tokens=JSON_TOKENS,
        temperature=0,
    ) as stream:
        deltas = [e for e in stream if e.type == "content.delta"]
        final = stream.get_final_completion()
    assert len(deltas) >= 3
    assert final.choices[0].finish_reason == "stop"
    assert isinstance(final.choices[0].message.parsed, Pet)


def test_openai_parse_refuses_a_cut_answer(client: openai.OpenAI) -> None:
    """An answer cut by max_tokens is a LengthFinishReasonError, not a parse error."""
    with pytest.raises(openai.LengthFinishReasonError):
        client.chat.completions.parse(
            model=DEFAULT_MODEL,
            messages=pet_messages(),
            response_format=Pet,
            max_tokens=4,
            temperature=0,
        )


def test_openai_tool_result_round_trip(client: openai.OpenAI) -> None:
    r = client.chat.completions.create(
        model=DEFAULT_MODEL,
        messages=TOOL_HISTORY,
        tools=[PET_AGE_TOOL],
        max_tokens=CHAT_TOKENS,
        temperature=0,
    )
    choice = r.choices[0]
    assert choice.message.role == "assistant"
    assert choice.finish_reason in {"stop", "length", "tool_calls"}
    assert choice.message.content is not None or choice.message.tool_calls
    assert_usage(r.usage, CHAT_TOKENS)
