"""instructor (over the openai client) against the real server (see test_client_compat)."""

from __future__ import annotations

from typing import Any

import instructor
import openai
import pytest
from conftest import DEFAULT_MODEL
from instructor.core import IncompleteOutputException
from test_client_compat import (
    CHAT_PROMPT,
    CHAT_TOKENS,
    JSON_TOKENS,
    NO_EOS,
    TOOL_HISTORY,
    Pet,
    pet_messages,
)


def patched(oai: openai.OpenAI, mode: instructor.Mode = instructor.Mode.TOOLS) -> Any:
    return instructor.from_openai(oai, mode=mode)


def structured(**kwargs: Any) -> dict[str, Any]:
    """Arguments of one structured call: no retries, so a failure shows at once."""
    return {
        "model": DEFAULT_MODEL,
        "messages": pet_messages(),
        "response_model": Pet,
        "max_tokens": JSON_TOKENS,
        "temperature": 0,
        "max_retries": 0,
        **kwargs,
    }


def test_instructor_plain_chat(client: openai.OpenAI) -> None:
    """response_model=None passes the completion through untouched."""
    r = patched(client).chat.completions.create(
        model=DEFAULT_MODEL,
        messages=[{"role": "user", "content": CHAT_PROMPT}],
        response_model=None,
        max_tokens=CHAT_TOKENS,
        temperature=0,
        extra_body=NO_EOS,
    )
    assert isinstance(r.choices[0].message.content, str) and r.choices[0].message.content
    assert r.choices[0].finish_reason == "length"
    assert r.usage is not None and 0 < r.usage.completion_tokens <= CHAT_TOKENS


def test_instructor_plain_stream(client: openai.OpenAI) -> None:
    chunks = list(
        patched(client).chat.completions.create(
            model=DEFAULT_MODEL,
            messages=[{"role": "user", "content": CHAT_PROMPT}],
            response_model=None,
            max_tokens=CHAT_TOKENS,
            temperature=0,
            stream=True,
            extra_body=NO_EOS,
        )
    )
    assert len([c for c in chunks if c.choices and c.choices[0].delta.content]) >= 3
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"


def test_instructor_json_schema_mode(client: openai.OpenAI) -> None:
    patched_client = patched(client, instructor.Mode.JSON_SCHEMA)
    pet, completion = patched_client.chat.completions.create_with_completion(**structured())
    assert isinstance(pet, Pet)
    assert completion.choices[0].finish_reason == "stop"
    assert completion.usage.completion_tokens > 0


def test_instructor_tools_mode(client: openai.OpenAI) -> None:
    pet, completion = patched(client).chat.completions.create_with_completion(**structured())
    assert isinstance(pet, Pet)
    assert completion.choices[0].finish_reason == "tool_calls"
    [call] = completion.choices[0].message.tool_calls
    assert call.function.name == "Pet"


def test_instructor_create_partial(client: openai.OpenAI) -> None:
    # strict=False: instructor validates the finished partial as a Python dict, where strict
    # validation refuses an Enum field's plain string whatever the server sent.
    partials = list(patched(client).chat.completions.create_partial(**structured(strict=False)))
    assert partials
    Pet.model_validate(partials[-1].model_dump())


def test_instructor_create_iterable(client: openai.OpenAI) -> None:
    """The model may go on listing pets until max_tokens (room for about two here):
    every item completed by then is a Pet."""
    pets = list(patched(client).chat.completions.create_iterable(**structured(max_tokens=80)))
    assert pets and all(isinstance(p, Pet) for p in pets)


def test_instructor_cut_answer_is_incomplete_output(client: openai.OpenAI) -> None:
    with pytest.raises(IncompleteOutputException):
        patched(client).chat.completions.create(**structured(max_tokens=6))


def test_instructor_tool_result_round_trip(client: openai.OpenAI) -> None:
    """A conversation that holds a tool call and its result, then a structured answer."""
    pet = patched(client, instructor.Mode.JSON_SCHEMA).chat.completions.create(
        **structured(messages=[*TOOL_HISTORY, *pet_messages()])
    )
    assert isinstance(pet, Pet)
