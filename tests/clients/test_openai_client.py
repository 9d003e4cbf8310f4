"""The official openai client against the real server: both endpoints, sync and async,
streaming and not."""

from __future__ import annotations

import asyncio

import pytest
from conftest import DEFAULT_MODEL

MESSAGES = [{"role": "user", "content": "Name a colour."}]
# Where a test needs some text back, the model may not end before max_tokens: whether it
# would stop at once is up to its words, not the server.
NO_EOS = {"ignore_eos": True}


def test_chat_completion(client) -> None:
    r = client.chat.completions.create(model=DEFAULT_MODEL, messages=MESSAGES, max_tokens=8,
                                       extra_body=NO_EOS)
    assert r.object == "chat.completion"
    assert r.id.startswith("chatcmpl-")
    assert r.model == DEFAULT_MODEL
    assert r.system_fingerprint and r.system_fingerprint.startswith("fp_")
    choice = r.choices[0]
    assert choice.message.role == "assistant"
    assert choice.message.content
    assert choice.finish_reason in {"stop", "length"}
    assert r.usage.prompt_tokens > 5
    assert 0 < r.usage.completion_tokens <= 8
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens


def test_completion(client) -> None:
    r = client.completions.create(model=DEFAULT_MODEL, prompt="The sky is", max_tokens=6,
                                  extra_body=NO_EOS)
    assert r.object == "text_completion"
    assert r.id.startswith("cmpl-")
    assert r.choices[0].text
    assert r.choices[0].finish_reason in {"stop", "length"}
    assert r.usage.completion_tokens <= 6


def test_completion_default_max_tokens_is_16(client) -> None:
    r = client.completions.create(
        model=DEFAULT_MODEL, prompt="Once upon a time", extra_body=NO_EOS
    )
    assert r.usage.completion_tokens == 16
    assert r.choices[0].finish_reason == "length"


def test_chat_stream(client) -> None:
    stream = client.chat.completions.create(
        model=DEFAULT_MODEL, messages=MESSAGES, max_tokens=8, stream=True, extra_body=NO_EOS
    )
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    assert all(c.object == "chat.completion.chunk" for c in chunks)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text
    assert chunks[-1].choices[0].finish_reason in {"stop", "length"}
    assert len({c.id for c in chunks}) == 1


def test_completion_stream_matches_non_stream(client) -> None:
    args = dict(model=DEFAULT_MODEL, prompt="Water boils at", max_tokens=10, temperature=0)
    whole = client.completions.create(**args).choices[0].text
    parts = [c.choices[0].text for c in client.completions.create(**args, stream=True) if c.choices]
    assert "".join(parts) == whole


def test_stream_include_usage(client) -> None:
    stream = client.chat.completions.create(
        model=DEFAULT_MODEL,
        messages=MESSAGES,
        max_tokens=5,
        stream=True,
        stream_options={"include_usage": True},
        extra_body=NO_EOS,
    )
    chunks = list(stream)
    assert chunks[-1].choices == []
    assert all(c.usage is None for c in chunks[:-1])
    usage = chunks[-1].usage
    assert usage.completion_tokens == 5
    assert usage.total_tokens == usage.prompt_tokens + usage.completion_tokens
    assert chunks[-2].choices[0].finish_reason == "length"


@pytest.mark.parametrize("stream", [False, True])
def test_async_client_both_endpoints(async_client, stream: bool) -> None:
    async def run() -> tuple[str, str]:
        chat = await async_client.chat.completions.create(
            model=DEFAULT_MODEL, messages=MESSAGES, max_tokens=6, stream=stream, temperature=0,
            extra_body=NO_EOS,
        )
        comp = await async_client.completions.create(
            model=DEFAULT_MODEL, prompt="One, two,", max_tokens=6, stream=stream, temperature=0,
            extra_body=NO_EOS,
        )
        if not stream:
            return chat.choices[0].message.content, comp.choices[0].text
        chat_text = "".join([c.choices[0].delta.content or "" async for c in chat if c.choices])
        comp_text = "".join([c.choices[0].text async for c in comp if c.choices])
        return chat_text, comp_text

    chat_text, comp_text = asyncio.run(run())
    assert chat_text and comp_text


def test_models_list(client) -> None:
    models = client.models.list()
    assert DEFAULT_MODEL in [m.id for m in models.data]


def test_alias_names_the_same_model(client) -> None:
    r = client.completions.create(model="default", prompt="Hi", max_tokens=2)
    assert r.model == DEFAULT_MODEL  # the served model's id, not the alias
    assert r.choices[0].text is not None
