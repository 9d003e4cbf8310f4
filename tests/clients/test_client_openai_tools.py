"""The official openai client's function calling against the real server: forced tools
with a pydantic model, tool calls streamed, cut by max_tokens, and the legacy `functions`
(see test_client_compat)."""

from __future__ import annotations

import json
from typing import Any

import openai
from conftest import DEFAULT_MODEL
from test_client_compat import (
    CHAT_TOKENS,
    JSON_TOKENS,
    PET_AGE_ARGUMENTS,
    PET_AGE_TOOL,
    TOOL_QUESTION,
    Pet,
    accumulate_tool_calls,
    assert_usage,
    named,
    pet_messages,
)


def test_openai_forced_tool(client: openai.OpenAI) -> None:
    r = client.chat.completions.parse(
        model=DEFAULT_MODEL,
        messages=pet_messages(),
        tools=[openai.pydantic_function_tool(Pet)],
        tool_choice=named("Pet"),
        max_tokens=JSON_TOKENS,
        temperature=0,
    )
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls"
    [call] = choice.message.tool_calls
    assert call.type == "function" and call.id
    assert call.function.name == "Pet"
    assert isinstance(call.function.parsed_arguments, Pet)
    assert_usage(r.usage, JSON_TOKENS)


def test_openai_forced_tool_stream(client: openai.OpenAI) -> None:
    """The stream helper joins the tool call deltas and parses the arguments; the raw
    chunks it passes on join into the same call."""
    with client.chat.completions.stream(
        model=DEFAULT_MODEL,
        messages=pet_messages(),
        tools=[openai.pydantic_function_tool(Pet)],
        tool_choice=named("Pet"),
        max_tokens=JSON_TOKENS,
        temperature=0,
    ) as stream:
        events = list(stream)
        final = stream.get_final_completion()
    calls = accumulate_tool_calls([e.chunk for e in events if e.type == "chunk"])
    assert list(calls) == [0]
    assert calls[0]["id"] and calls[0]["name"] == "Pet"
    Pet.model_validate_json(calls[0]["arguments"])
    done = [e for e in events if e.type == "tool_calls.function.arguments.done"]
    assert [e.name for e in done] == ["Pet"]
    assert isinstance(done[0].parsed_arguments, Pet)
    assert final.choices[0].finish_reason == "tool_calls"
    [call] = final.choices[0].message.tool_calls
    assert call.id == calls[0]["id"]
    assert isinstance(call.function.parsed_arguments, Pet)


def test_openai_tool_arguments_stream_in_several_deltas(client: openai.OpenAI) -> None:
    """Tool call arguments are streamed as they are generated, the call's id and name once,
    first (a flat schema, so that only the streaming is under test)."""
    chunks = list(
        client.chat.completions.create(
            model=DEFAULT_MODEL,
            messages=[{"role": "user", "content": TOOL_QUESTION}],
            tools=[PET_AGE_TOOL],
            tool_choice=named("pet_age"),
            max_tokens=JSON_TOKENS,
            temperature=0,
            stream=True,
        )
    )
    deltas = [d for c in chunks if c.choices for d in c.choices[0].delta.tool_calls or []]
    assert deltas[0].id and deltas[0].function.name == "pet_age"
    assert all(d.index == 0 and d.id is None for d in deltas[1:])
    assert all(d.function is None or d.function.name is None for d in deltas[1:])
    assert len([d for d in deltas if d.function and d.function.arguments]) >= 2
    arguments = json.loads(accumulate_tool_calls(chunks)[0]["arguments"])
    assert isinstance(arguments["name"], str)


def test_openai_tool_call_cut_by_length(client: openai.OpenAI) -> None:
    """A forced call cut by max_tokens comes back as a partial tool call, finish `length`."""
    args: dict[str, Any] = dict(
        model=DEFAULT_MODEL,
        messages=[{"role": "user", "content": TOOL_QUESTION}],
        tools=[PET_AGE_TOOL],
        tool_choice=named("pet_age"),
        temperature=0,
    )
    whole = client.chat.completions.create(**args, max_tokens=JSON_TOKENS)
    assert whole.choices[0].finish_reason == "tool_calls"
    # Two tokens short: inside the arguments' closing, past the call's name.
    r = client.chat.completions.create(**args, max_tokens=whole.usage.completion_tokens - 2)
    choice = r.choices[0]
    assert choice.finish_reason == "length"
    [call] = choice.message.tool_calls
    assert call.id and call.function.name == "pet_age"
    assert call.function.arguments.lstrip().startswith("{")


def test_openai_tool_call_cut_before_its_name_is_still_the_call(client: openai.OpenAI) -> None:
    """Cut within the family's call markers (a handful of tokens), the forced call still
    comes back as the named tool's call, never as the markers in `content`, plain and
    streamed."""
    args: dict[str, Any] = dict(
        model=DEFAULT_MODEL,
        messages=[{"role": "user", "content": TOOL_QUESTION}],
        tools=[PET_AGE_TOOL],
        tool_choice=named("pet_age"),
        temperature=0,
    )
    for max_tokens in (1, 2, 3, 5):
        choice = client.chat.completions.create(**args, max_tokens=max_tokens).choices[0]
        assert choice.finish_reason == "length"
        assert choice.message.content is None, (max_tokens, choice.message.content)
        [call] = choice.message.tool_calls
        assert call.id and call.function.name == "pet_age"
        chunks = list(client.chat.completions.create(**args, max_tokens=max_tokens,
                                                     stream=True))
        assert not any(c.choices and c.choices[0].delta.content for c in chunks), max_tokens
        calls = accumulate_tool_calls(chunks)
        assert [c["name"] for c in calls.values()] == ["pet_age"], max_tokens


def legacy_function() -> dict[str, Any]:
    return dict(PET_AGE_TOOL["function"])


def test_openai_legacy_functions(client: openai.OpenAI) -> None:
    r = client.chat.completions.create(
        model=DEFAULT_MODEL,
        messages=[{"role": "user", "content": TOOL_QUESTION}],
        functions=[legacy_function()],
        function_call={"name": "pet_age"},
        max_tokens=JSON_TOKENS,
        temperature=0,
    )
    choice = r.choices[0]
    assert choice.finish_reason == "function_call"
    assert choice.message.tool_calls is None
    assert choice.message.function_call.name == "pet_age"
    assert isinstance(json.loads(choice.message.function_call.arguments)["name"], str)


def test_openai_legacy_functions_stream(client: openai.OpenAI) -> None:
    chunks = list(
        client.chat.completions.create(
            model=DEFAULT_MODEL,
            messages=[{"role": "user", "content": TOOL_QUESTION}],
            functions=[legacy_function()],
            function_call={"name": "pet_age"},
            max_tokens=JSON_TOKENS,
            temperature=0,
            stream=True,
        )
    )
    calls = [c.choices[0].delta.function_call for c in chunks if c.choices]
    assert "".join(f.name or "" for f in calls if f is not None) == "pet_age"
    arguments = "".join(f.arguments or "" for f in calls if f is not None)
    assert isinstance(json.loads(arguments)["name"], str)
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "function_call"


def test_openai_legacy_function_result_round_trip(client: openai.OpenAI) -> None:
    r = client.chat.completions.create(
        model=DEFAULT_MODEL,
        messages=[
            {"role": "user", "content": TOOL_QUESTION},
            {
                "role": "assistant",
                "content": None,
                "function_call": {"name": "pet_age", "arguments": PET_AGE_ARGUMENTS},
            },
            {"role": "function", "name": "pet_age", "content": "3"},
        ],
        functions=[legacy_function()],
        max_tokens=CHAT_TOKENS,
        temperature=0,
    )
    choice = r.choices[0]
    assert choice.finish_reason in {"stop", "length", "function_call"}
    assert choice.message.content is not None or choice.message.function_call is not None
