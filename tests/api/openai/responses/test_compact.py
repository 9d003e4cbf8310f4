"""POST /v1/responses/compact through the official `openai` client: a stored
conversation (or a sent one) shrunk to its user messages and one compaction item, which a
later request takes as input; fields compact does not serve and content this server did
not write refused by name."""

from __future__ import annotations

from typing import Any

import httpx
import openai
import pytest
from conftest import DEFAULT_MODEL, RunningServer


@pytest.fixture(scope="module")
def client(server: RunningServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.v1, api_key="unused", timeout=120, max_retries=0)


def _dumped(items: list[Any]) -> list[dict[str, Any]]:
    return [item.model_dump(exclude_none=True) for item in items]


def test_a_stored_conversation_compacts_to_its_user_messages_and_a_summary(
        client: openai.OpenAI) -> None:
    first = client.responses.create(model=DEFAULT_MODEL, max_output_tokens=8, temperature=0,
                                    input="My name is Ada and I keep bees.")
    second = client.responses.create(model=DEFAULT_MODEL, max_output_tokens=8,
                                     temperature=0, input="What do I keep?",
                                     previous_response_id=first.id)
    compacted = client.responses.compact(model=DEFAULT_MODEL,
                                         previous_response_id=second.id,
                                         input="Thanks.")
    assert compacted.object == "response.compaction"
    *users, summary = compacted.output
    assert [u.type for u in users] == ["message"] * 3
    assert [u.model_dump()["role"] for u in users] == ["user"] * 3
    texts = [u.model_dump()["content"][0]["text"] for u in users]
    assert texts == ["My name is Ada and I keep bees.", "What do I keep?", "Thanks."]
    assert summary.type == "compaction" and summary.model_dump()["encrypted_content"]
    assert compacted.usage.output_tokens <= 1024
    assert compacted.usage.input_tokens > (second.usage.input_tokens if second.usage else 0)
    # The compacted output is a later request's input: the summary stands in it as the
    # model's turn, so the prompt is longer than the user messages alone.
    later = [*_dumped(compacted.output), {"role": "user", "content": "And my name?"}]
    with_summary = client.responses.input_tokens.count(model=DEFAULT_MODEL, input=later)
    without = client.responses.input_tokens.count(
        model=DEFAULT_MODEL, input=[*_dumped(users), {"role": "user", "content": "And my name?"}])
    assert with_summary.input_tokens > without.input_tokens
    answer = client.responses.create(model=DEFAULT_MODEL, max_output_tokens=4,
                                     temperature=0, input=later)  # type: ignore[arg-type]
    assert answer.status in ("completed", "incomplete")
    # A compaction of a conversation holding one holds one compaction item still.
    again = client.responses.compact(model=DEFAULT_MODEL, input=later)  # type: ignore[arg-type]
    assert [item.type for item in again.output].count("compaction") == 1


def test_compact_refuses_what_it_does_not_serve(client: openai.OpenAI,
                                                server: RunningServer) -> None:
    r = httpx.post(f"{server.v1}/responses/compact", timeout=60, json={
        "model": DEFAULT_MODEL, "input": "Hi.", "temperature": 0.5})
    assert r.status_code == 400 and r.json()["error"]["param"] == "temperature"
    r = httpx.post(f"{server.v1}/responses/compact", timeout=60, json={
        "model": DEFAULT_MODEL, "input": "Hi.", "previous_response_id": "resp_nothing"})
    assert r.status_code == 404
    forged = [{"role": "user", "content": "Hi."},
              {"type": "compaction", "encrypted_content": "not ours"}]
    r = httpx.post(f"{server.v1}/responses", timeout=60, json={
        "model": DEFAULT_MODEL, "input": forged, "max_output_tokens": 2})
    assert r.status_code == 400
    assert r.json()["error"]["param"] == "input[1].encrypted_content"
    with pytest.raises(openai.BadRequestError):
        client.responses.compact(model=DEFAULT_MODEL, input=forged)  # type: ignore[arg-type]
