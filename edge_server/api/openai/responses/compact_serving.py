"""POST /v1/responses/compact: a conversation shrunk to its user messages and one
compaction item, the model's summary of everything else (compaction.py).

The conversation is the one a Responses request with the same `input`,
`previous_response_id` and `instructions` would render; the model is asked after it for
a summary (greedy, at most SUMMARY_TOKENS), and nothing is stored. A later request that
sends the output as its input gets the summary as an assistant turn.
"""

from __future__ import annotations

from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from edge_server.api.common.serving import cancel_on_disconnect, collect, now, submit
from edge_server.api.http.dependencies import off_loop
from edge_server.api.http.errors import APIError, unsupported
from edge_server.api.openai.chat.protocol import ChatCompletionRequest, ChatMessage
from edge_server.api.openai.chat.serving import PreparedChat, prepare
from edge_server.api.openai.responses.chain_bound import check_chain
from edge_server.api.openai.responses.compaction import INSTRUCTION, seal
from edge_server.api.openai.responses.conversation import chat_messages
from edge_server.api.openai.responses.items import stored_input
from edge_server.api.openai.responses.protocol import CompactedResponse, ResponsesRequest, Usage
from edge_server.api.openai.responses.serving import renamed
from edge_server.api.openai.responses.store import StoredResponse
from edge_server.api.openai.responses.store_codec import dumps
from edge_server.api.openai.responses.streaming import item_id
from edge_server.engine import Engine

SUMMARY_TOKENS = 1024
# The fields of OpenAI's compact request (beside `model`) this server serves.
COMPACT_FIELDS = frozenset({"model", "input", "instructions", "previous_response_id",
                            "prompt_cache_key", "prompt_cache_retention", "service_tier"})


def check_compact_fields(req: ResponsesRequest) -> None:
    for name in sorted(req.model_fields_set - COMPACT_FIELDS):
        raise unsupported(name, "is not a field of /v1/responses/compact")


def user_items(turns: list[dict[str, Any]], latest: list[dict[str, Any]]
               ) -> list[dict[str, Any]]:
    """Every user message of the conversation, oldest first, as output items."""
    items = [item for turn in turns for item in turn["input"]] + latest
    out = []
    for item in items:
        if item.get("type", "message") != "message" or item.get("role") != "user":
            continue
        content = item["content"]
        if isinstance(content, str):
            content = [{"type": "input_text", "text": content}]
        out.append({"id": item.get("id") or item_id("msg"), "type": "message",
                    "status": "completed", "role": "user", "content": content})
    return out


def _prepared(req: ResponsesRequest, engine: Engine, previous: StoredResponse | None
              ) -> tuple[PreparedChat, list[dict[str, Any]]]:
    turns = previous.turns if previous else []
    latest = stored_input(req)
    check_chain(engine, previous.chain_bytes if previous else 0, len(dumps(latest)),
                chained=previous is not None)
    try:
        messages = chat_messages(req, turns, engine.modalities)
        messages.append(ChatMessage(role="user", content=INSTRUCTION))
        chat = ChatCompletionRequest(model=req.model, messages=messages, temperature=0.0,
                                     separate_reasoning=True, truncation="disabled")
        prepared = prepare(chat, engine)
    except APIError as exc:
        raise renamed(exc) from exc
    prepared.request.max_tokens = min(prepared.request.max_tokens, SUMMARY_TOKENS)
    return prepared, user_items(turns, latest)


async def compact(req: ResponsesRequest, engine: Engine, http: Request,
                  previous: StoredResponse | None) -> Response:
    prepared, users = await off_loop(_prepared, req, engine, previous)
    handle = submit(engine, prepared.request, http)
    async with cancel_on_disconnect(http, [handle]):
        [result] = await collect(handle, 1)
    output = prepared.plan.outputs(1)[0]
    output.push(result.text)
    output.finish()
    summary = (output.message().content or "").strip()
    usage = handle.usage
    body = CompactedResponse(
        id=item_id("resp"), created_at=now(),
        output=[*users, {"id": item_id("cmp"), "type": "compaction",
                         "encrypted_content": seal(summary)}],
        usage=Usage(input_tokens=usage.prompt_tokens,
                    input_tokens_details={"cached_tokens": usage.cached_tokens},
                    output_tokens=usage.completion_tokens,
                    output_tokens_details={"reasoning_tokens": 0},
                    total_tokens=usage.prompt_tokens + usage.completion_tokens))
    return JSONResponse(body.model_dump())
