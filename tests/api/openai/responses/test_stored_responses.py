"""Stored Responses through the official `openai` client against the real server:
previous_response_id continues a stored turn's tokens (the prefix cache covers it), the
store outlives a restart, retrieve / delete / input_items, `store: false`, and each API
key sees only its own responses."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from conftest import DEFAULT_MODEL, RunningServer, start_server, stop_server
from openai.types.responses import Response

KEYS = ("key-a", "key-b")


@pytest.fixture(scope="module")
def keyed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    tmp = tmp_path_factory.mktemp("stored")
    running = start_server(tmp, "--parallel", "2", "--ctx-size", "4096",
                           "--api-key", KEYS[0], "--api-key", KEYS[1],
                           "--state-dir", str(tmp / "state"))
    yield running
    stop_server(running)
    assert "Traceback" not in running.log_text(), running.log_text()


def client_for(server: RunningServer, key: str = KEYS[0]) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.v1, api_key=key, max_retries=0)


@pytest.fixture()
def client(keyed: RunningServer) -> Iterator[openai.OpenAI]:
    with client_for(keyed) as c:
        yield c


def create(client: openai.OpenAI, **kwargs: Any) -> Response:
    kwargs.setdefault("max_output_tokens", 12)
    return client.responses.create(model=DEFAULT_MODEL, temperature=0, **kwargs)


def check_continues(first: Response, second: Response) -> None:
    """The second turn's prompt began with everything the first evaluated: its own
    prompt and its output (the last output token was sampled, never evaluated)."""
    assert first.usage is not None and second.usage is not None
    covered = first.usage.input_tokens + first.usage.output_tokens - 1
    assert second.usage.input_tokens_details.cached_tokens >= covered
    assert second.usage.input_tokens > first.usage.input_tokens + first.usage.output_tokens


def test_chained_turn_reuses_the_first_turns_tokens(client: openai.OpenAI) -> None:
    first = create(client, input="Name a colour.", instructions="Answer briefly.")
    assert first.store is True and first.previous_response_id is None
    second = create(client, input="Name another one.", instructions="Answer briefly.",
                    previous_response_id=first.id)
    assert second.previous_response_id == first.id and second.store is True
    assert second.status in ("completed", "incomplete") and second.output
    check_continues(first, second)
    third = create(client, input="And a third?", instructions="Answer briefly.",
                   previous_response_id=second.id)
    check_continues(second, third)


def test_streamed_turn_is_stored_before_it_completes(client: openai.OpenAI) -> None:
    with client.responses.stream(model=DEFAULT_MODEL, input="Name a fruit.",
                                 max_output_tokens=12, temperature=0) as stream:
        events = list(stream)
    first = events[-1].response  # type: ignore[union-attr]
    assert first.store is True
    # Chained at once: the stream's last event went out after the response was stored.
    second = create(client, input="Another?", previous_response_id=first.id)
    check_continues(first, second)


def test_retrieve_input_items_and_delete(client: openai.OpenAI) -> None:
    first = create(client, input="Say hi.")
    second = create(client, input=[{"role": "user", "content": "Say bye."}],
                    previous_response_id=first.id, metadata={"k": "v"})
    got = client.responses.retrieve(second.id)
    assert got.model_dump() == second.model_dump()
    # The second response was given the first turn (its input and output) and its own.
    items = client.responses.input_items.list(second.id, order="asc")
    kinds = [(item.type, getattr(item, "role", None)) for item in items.data]
    assert kinds == [("message", "user"), ("message", "assistant"), ("message", "user")]
    assert [item.id for item in items.data][1] == first.output[0].id
    assert items.data[0].content[0].text == "Say hi."  # type: ignore[union-attr]
    newest = client.responses.input_items.list(second.id, limit=1)
    assert newest.has_more and newest.data[0].id == items.data[2].id
    rest = client.responses.input_items.list(second.id, limit=5, after=newest.data[0].id)
    assert [i.id for i in rest.data] == [items.data[1].id, items.data[0].id]
    assert not rest.has_more
    client.responses.delete(first.id)
    for call in (lambda: client.responses.retrieve(first.id),
                 lambda: create(client, input="Again.", previous_response_id=first.id),
                 lambda: client.responses.delete(first.id)):
        with pytest.raises(openai.NotFoundError):
            call()
    assert client.responses.retrieve(second.id).id == second.id  # kept its own copy


def test_store_false_is_not_kept(client: openai.OpenAI) -> None:
    r = create(client, input="Say hi.", store=False)
    assert r.store is False
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(r.id)
    with pytest.raises(openai.NotFoundError) as caught:
        create(client, input="More.", previous_response_id=r.id)
    error = caught.value.body
    assert isinstance(error, dict) and error["param"] == "previous_response_id"


def test_another_keys_responses_are_unknown(keyed: RunningServer,
                                            client: openai.OpenAI) -> None:
    mine = create(client, input="Say hi.")
    with client_for(keyed, KEYS[1]) as other:
        for call in (lambda: other.responses.retrieve(mine.id),
                     lambda: other.responses.input_items.list(mine.id),
                     lambda: other.responses.delete(mine.id),
                     lambda: create(other, input="More.", previous_response_id=mine.id)):
            with pytest.raises(openai.NotFoundError):
                call()
    assert client.responses.retrieve(mine.id).id == mine.id  # untouched by the other key


@pytest.mark.parametrize(("query", "param"), [
    ({"limit": "0"}, "limit"), ({"limit": "101"}, "limit"), ({"limit": "x"}, "limit"),
    ({"limit": "9" * 5000}, "limit"), ({"order": "sideways"}, "order"),
    ({"after": "msg_nope"}, "after"),
])
def test_bad_input_items_query_is_400(keyed: RunningServer, client: openai.OpenAI,
                                      query: dict[str, str], param: str) -> None:
    r = create(client, input="Say hi.")
    answer = httpx.get(f"{keyed.v1}/responses/{r.id}/input_items", params=query,
                       headers={"Authorization": f"Bearer {KEYS[0]}"}, timeout=30)
    assert answer.status_code == 400, answer.text
    assert answer.json()["error"]["param"] == param


def test_unknown_ids_are_404_in_openai_shape(keyed: RunningServer) -> None:
    headers = {"Authorization": f"Bearer {KEYS[0]}"}
    for method, path in (("GET", "/responses/resp_nope"), ("DELETE", "/responses/resp_nope"),
                         ("GET", "/responses/resp_nope/input_items"),
                         ("GET", "/responses/" + "x" * 3000)):
        r = httpx.request(method, keyed.v1 + path, headers=headers, timeout=30)
        assert r.status_code == 404, r.text
        error = r.json()["error"]
        assert error["code"] == "not_found" and len(error["message"]) < 300
    r = httpx.post(f"{keyed.v1}/responses", headers=headers, timeout=30, json={
        "model": DEFAULT_MODEL, "input": "hi", "previous_response_id": "x" * 300})
    assert r.status_code == 400 and r.json()["error"]["param"] == "previous_response_id"


def test_chain_survives_a_restart(tmp_path: Path) -> None:
    """Same --state-dir: a response stored before the restart is continued after it.
    With --response-store-count 2, a third response evicts the least recently used."""
    args = ("--parallel", "1", "--ctx-size", "2048", "--state-dir", str(tmp_path / "state"),
            "--response-store-count", "2")
    before = start_server(tmp_path, *args, name="before")
    try:
        with client_for(before) as c:
            first = create(c, input="Name a colour.")
            kept = create(c, input="Name a fruit.")
    finally:
        stop_server(before)
    after = start_server(tmp_path, *args, name="after")
    try:
        with client_for(after) as c:
            second = create(c, input="Another?", previous_response_id=kept.id)
            assert second.previous_response_id == kept.id and second.output
            # Stored: `second`, and `kept` (used just now); `first` was evicted.
            with pytest.raises(openai.NotFoundError):
                c.responses.retrieve(first.id)
            assert c.responses.retrieve(kept.id).id == kept.id
    finally:
        stop_server(after)
    assert "Traceback" not in before.log_text() + after.log_text()


def test_without_a_store_stateful_fields_are_refused(tmp_path: Path) -> None:
    server = start_server(tmp_path, "--parallel", "1", "--ctx-size", "2048",
                          "--response-store-mb", "0")
    try:
        with client_for(server) as c:
            r = create(c, input="Say hi.", max_output_tokens=2)
            assert r.store is False
            for fields in ({"store": True}, {"previous_response_id": r.id}):
                with pytest.raises(openai.BadRequestError) as caught:
                    create(c, input="hi", **fields)
                assert caught.value.body["param"] == next(iter(fields))  # type: ignore[index]
            with pytest.raises(openai.NotFoundError):
                c.responses.retrieve(r.id)
    finally:
        stop_server(server)
