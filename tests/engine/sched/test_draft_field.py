"""The `draft` request field: `false` turns lookup drafting off for one request (its
tokens then come from one-row decoding), on every door; and the decode step cost that
drafting decides with, measured once and kept beside the prompt caches. This module's
server drafts wherever a lookup has a guess (`--draft-min 1`)."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest
from conftest import DEFAULT_MODEL, RunningServer

from edge_server.api.anthropic.messages.protocol import MessagesRequest
from edge_server.api.anthropic.messages.translate import to_chat as messages_to_chat
from edge_server.api.openai.responses.protocol import ResponsesRequest
from edge_server.api.openai.responses.serving import to_chat as responses_to_chat

FORCED = 28  # a token id; logit_bias +100 makes it the only choice: lookups always hit
LOOP = {"max_tokens": 24, "temperature": 0, "logit_bias": {str(FORCED): 100}}



@pytest.fixture(scope="module")
def server(drafting: RunningServer) -> RunningServer:
    """This module's server drafts wherever a lookup has a guess (conftest.py), so what
    drafting keeps is tested whatever this machine's measured step cost says."""
    return drafting


def draft_counts(server: RunningServer) -> tuple[int, int]:
    stats = httpx.get(f"{server.base_url}/health").json()["models"][DEFAULT_MODEL]
    return stats["draft_tokens"], stats["draft_tokens_accepted"]


def post(server: RunningServer, path: str, body: dict[str, Any]) -> httpx.Response:
    return httpx.post(f"{server.v1}/{path}", timeout=120,
                      json={"model": DEFAULT_MODEL, **body})


def forced_loop(server: RunningServer, path: str, **extra: object) -> dict:
    body: dict[str, Any] = {**LOOP, **extra}
    if path == "completions":
        body["prompt"] = "Say it again and again:"
    else:
        body["messages"] = [{"role": "user", "content": "Say it again and again."}]
    r = post(server, path, body)
    assert r.status_code == 200, r.text
    return r.json()  # type: ignore[no-any-return]


@pytest.mark.parametrize("path", ["completions", "chat/completions"])
def test_draft_false_decodes_one_row_at_a_time(server: RunningServer, path: str) -> None:
    before = draft_counts(server)
    drafted = forced_loop(server, path)
    after_default = draft_counts(server)
    # The forced loop drafts by default: the field below is what turns it off.
    assert after_default[0] > before[0]
    plain = forced_loop(server, path, draft=False)
    assert draft_counts(server) == after_default
    assert plain["usage"]["completion_tokens"] == drafted["usage"]["completion_tokens"] == 24
    text = "text" if path == "completions" else "message"
    assert plain["choices"][0][text] == drafted["choices"][0][text]  # one forced token


def test_draft_false_streams_the_same_tokens(server: RunningServer) -> None:
    body = {"prompt": "Again:", "stream": True, "draft": False, **LOOP}
    before = draft_counts(server)
    pieces = []
    with httpx.stream("POST", f"{server.v1}/completions", timeout=120,
                      json={"model": DEFAULT_MODEL, **body}) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if line.startswith("data: {"):
                pieces += [c["text"] for c in json.loads(line[6:])["choices"] if c["text"]]
    assert len(pieces) == 24
    assert draft_counts(server) == before


def test_draft_false_greedy_repeats_itself(server: RunningServer) -> None:
    body = {"prompt": "red blue red blue red blue red blue red", "max_tokens": 24,
            "temperature": 0, "ignore_eos": True, "draft": False}
    first, second = (post(server, "completions", body).json() for _ in range(2))
    assert first["choices"][0]["text"] == second["choices"][0]["text"]


def test_anthropic_and_responses_doors_accept_it(server: RunningServer) -> None:
    before = draft_counts(server)
    r = httpx.post(f"{server.base_url}/v1/messages", timeout=120, json={
        "model": DEFAULT_MODEL, "max_tokens": 8, "draft": False,
        "messages": [{"role": "user", "content": "Name a colour."}]})
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["output_tokens"] >= 1
    r = post(server, "responses", {"input": "Name a colour.", "max_output_tokens": 8,
                                   "draft": False})
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["output_tokens"] >= 1
    assert draft_counts(server) == before


def test_the_doors_pass_it_on_to_the_chat_request() -> None:
    ask = [{"role": "user", "content": "Hi."}]
    messages = MessagesRequest.model_validate(
        {"model": "m", "max_tokens": 4, "messages": ask, "draft": False})
    assert messages_to_chat(messages).draft is False
    responses = ResponsesRequest.model_validate({"model": "m", "input": "Hi.", "draft": False})
    assert responses_to_chat(responses).draft is False
    assert responses_to_chat(ResponsesRequest(model="m", input="Hi.")).draft is not False


@pytest.mark.parametrize("path", ["completions", "chat/completions", "responses"])
def test_a_draft_that_is_not_a_boolean_is_400_naming_it(server: RunningServer,
                                                        path: str) -> None:
    body: dict[str, Any] = {"draft": "sometimes", "max_tokens": 4}
    if path == "completions":
        body["prompt"] = "Hi"
    elif path == "responses":
        body = {"draft": "sometimes", "input": "Hi"}
    else:
        body["messages"] = [{"role": "user", "content": "Hi"}]
    r = post(server, path, body)
    assert r.status_code == 400, r.text
    assert "draft" in r.text


def test_messages_door_refuses_a_bad_draft_in_its_own_shape(server: RunningServer) -> None:
    r = httpx.post(f"{server.base_url}/v1/messages", timeout=60, json={
        "model": DEFAULT_MODEL, "max_tokens": 4, "draft": [],
        "messages": [{"role": "user", "content": "Hi"}]})
    assert r.status_code == 400
    body = r.json()
    assert body["type"] == "error" and body["error"]["type"] == "invalid_request_error"
    assert "draft" in body["error"]["message"]


def test_step_cost_is_kept_beside_the_prompt_caches(server: RunningServer) -> None:
    """Measured at the first start on this machine (where it finishes in its time budget),
    then read from disk: the same numbers every start."""
    kept = list(server.log_path.parent.rglob("step-cost-*.json"))
    log = server.log_text()
    if not kept:  # too busy a machine: no drafting this run, and nothing is stored
        assert "decode step cost not measured" in log
        return
    assert len(kept) == 1 and kept[0].parent.name == "prompt-cache"
    cost = json.loads(kept[0].read_text())
    assert set(cost) == {"rows_per_sequence", "one", "several", "many", "widths"}
    rows = cost["rows_per_sequence"]
    assert rows[0] == 1 and rows == sorted(rows)
    for times in (cost["one"], cost["several"]):
        assert len(times) == len(rows) and times == sorted(times) and times[0] > 0
    assert 1 <= cost["many"] <= 8
    assert len(cost["widths"]) == cost["many"] and min(cost["widths"]) > 0
    assert "decode step cost measured" in log
