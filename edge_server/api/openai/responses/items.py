"""Items as the store keeps them and GET /v1/responses/{id}/input_items lists them:
each with an `id` (and a `status`), message content as a list of parts, as OpenAI
lists them."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel

from edge_server.api.http.errors import invalid
from edge_server.api.openai.responses.protocol import MessageItem, ResponsesRequest
from edge_server.api.openai.responses.streaming import item_id

_ID_PREFIX = {"message": "msg", "function_call": "fc", "function_call_output": "fco",
              "reasoning": "rs"}
_WITH_STATUS = ("message", "function_call", "function_call_output")


def stored_input(req: ResponsesRequest) -> list[dict[str, Any]]:
    """The request's `input` as items to store: a string is one user message."""
    items: list[BaseModel] = [MessageItem(role="user", content=req.input)] \
        if isinstance(req.input, str) else list(req.input)
    return [_stored(item) for item in items]


def _stored(item: BaseModel) -> dict[str, Any]:
    data = item.model_dump(mode="json", exclude_none=True)
    kind = data.setdefault("type", "message")
    if kind == "message" and isinstance(data.get("content"), str):
        part = "output_text" if data.get("role") == "assistant" else "input_text"
        data["content"] = [{"type": part, "text": data["content"]}]
    if kind == "message":
        for part in data["content"]:
            if part.get("type") == "output_text":  # as the API lists it (none are kept)
                part.setdefault("annotations", [])
                part.setdefault("logprobs", [])
    if not isinstance(data.get("id"), str):
        data["id"] = item_id(_ID_PREFIX.get(kind, "item"))
    if kind in _WITH_STATUS:
        data.setdefault("status", "completed")
    return data


def input_items(turns: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """What a response was given, oldest first: the earlier turns of its conversation
    (inputs and outputs) and its own input."""
    items: list[dict[str, Any]] = []
    for turn in turns[:-1]:
        items += turn["input"] + turn["output"]
    return items + turns[-1]["input"]


def page(items: list[dict[str, Any]], *, after: str | None, limit: int,
         order: Literal["asc", "desc"]) -> dict[str, Any]:
    """One page of a list, OpenAI's way: `after` an item id, `order` by position."""
    ordered = items if order == "asc" else items[::-1]
    start = 0
    if after is not None:
        ids = [item.get("id") for item in ordered]
        if after not in ids:
            raise invalid("after", f"no item {after[:64]!r} in this response's input")
        start = ids.index(after) + 1
    data = ordered[start:start + limit]
    return {"object": "list", "data": data,
            "first_id": data[0]["id"] if data else None,
            "last_id": data[-1]["id"] if data else None,
            "has_more": start + limit < len(ordered)}
