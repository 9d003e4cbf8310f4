"""Output items of a response, built from the chat layer's deltas.

A chat ChoiceOutput reads the generated text (reasoning split, tool-call parser) and
tells what became known as chat `delta` objects; OutputItems turns those into Responses
output items and the events that build them. A stream sends the events as they come; a
whole answer is pushed at once and only its items are kept, so both come out the same.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator
from typing import Any

from edge_server.api.http.errors import APIError


def item_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


Event = dict[str, Any]


class OutputItems:
    def __init__(self) -> None:
        self.items: list[dict[str, Any]] = []
        self._open: dict[str, Any] | None = None  # the item being written
        self._text: list[str] = []  # text of the open message or reasoning item
        self._calls: dict[int, dict[str, Any]] = {}  # the parser's call index -> item
        # Fragments of each call's arguments (by item id), joined when it closes: adding
        # each to a string copies all before it, O(n^2) in a long argument.
        self._arguments: dict[str, list[str]] = {}
        self._indices: dict[str, int] = {}  # item id -> output index
        self._blank = ""  # whitespace not yet known to start a message

    @property
    def output_text(self) -> str:
        return "".join(
            part["text"]
            for item in self.items if item["type"] == "message"
            for part in item["content"] if part["type"] == "output_text"
        )

    def push(self, deltas: list[dict[str, Any]]) -> list[Event]:
        events: list[Event] = []
        for delta in deltas:
            if delta.get("reasoning_content"):
                events += self._write("reasoning", delta["reasoning_content"])
            if delta.get("content"):
                events += self._content(delta["content"])
            for call in delta.get("tool_calls") or ():
                events += self._call(call)
        return events

    def finish(self, *, incomplete: bool) -> list[Event]:
        """Closes the open item (`incomplete` where the answer was cut off); an answer
        with no item at all is one empty message, as the API answers it."""
        events: list[Event] = []
        if not self.items and self._open is None:
            events += self._open_item("message")
            events += self._delta(self._blank)
        events += self._close("incomplete" if incomplete else "completed")
        for item in self._calls.values():  # fragments of a call closed before its last
            item["arguments"] = "".join(self._arguments[item["id"]])
        return events

    # Items ------------------------------------------------------------------------------

    def _content(self, text: str) -> list[Event]:
        if self._open is None or self._open["type"] != "message":
            if not text.strip():
                # Whitespace before a call is no message of its own.
                self._blank += text
                return []
            text, self._blank = self._blank + text, ""
        return self._write("message", text)

    def _write(self, kind: str, text: str) -> list[Event]:
        events: list[Event] = []
        if self._open is None or self._open["type"] != kind:
            events += self._close("completed")
            events += self._open_item(kind)
        return events + self._delta(text)

    def _call(self, call: dict[str, Any]) -> list[Event]:
        function = call.get("function") or {}
        index = call["index"]
        events: list[Event] = []
        if "id" in call:
            events += self._close("completed")
            self._blank = ""
            item = {
                "type": "function_call", "id": item_id("fc"), "call_id": call["id"],
                "name": function.get("name", ""), "arguments": "", "status": "in_progress",
            }
            self._calls[index] = item
            self._arguments[item["id"]] = []
            events += self._add(item)
        item = self._calls[index]
        fragment = function.get("arguments") or ""
        if fragment:
            self._arguments[item["id"]].append(fragment)
            events.append({"type": "response.function_call_arguments.delta",
                           "item_id": item["id"], "output_index": self._index(item),
                           "delta": fragment})
        return events

    def _open_item(self, kind: str) -> list[Event]:
        self._text = []
        if kind == "message":
            item: dict[str, Any] = {"type": "message", "id": item_id("msg"),
                                    "status": "in_progress", "role": "assistant", "content": []}
            # Every key the schema's OutputTextContent requires (no logprobs are kept).
            part: dict[str, Any] = {"type": "output_text", "text": "", "annotations": [],
                                    "logprobs": []}
        else:
            item = {"type": "reasoning", "id": item_id("rs"), "status": "in_progress",
                    "summary": [], "content": []}
            part = {"type": "reasoning_text", "text": ""}
        events = self._add(item)
        events.append({"type": "response.content_part.added", **self._where(item),
                       "part": dict(part)})
        item["content"].append(part)
        return events

    def _add(self, item: dict[str, Any]) -> list[Event]:
        self._open = item
        self._indices[item["id"]] = len(self.items)
        self.items.append(item)
        return [{"type": "response.output_item.added", "output_index": len(self.items) - 1,
                 "item": _copy(item)}]

    def _delta(self, text: str) -> list[Event]:
        if not text:
            return []
        assert self._open is not None
        self._text.append(text)
        if self._open["type"] == "message":
            return [{"type": "response.output_text.delta", **self._where(self._open),
                     "delta": text, "logprobs": []}]
        return [{"type": "response.reasoning_text.delta", **self._where(self._open),
                 "delta": text}]

    def _close(self, status: str) -> list[Event]:
        item, self._open = self._open, None
        if item is None:
            return []
        item["status"] = status
        events: list[Event] = []
        where = {"item_id": item["id"], "output_index": self._index(item)}
        if item["type"] == "function_call":
            item["arguments"] = "".join(self._arguments[item["id"]])
            events.append({"type": "response.function_call_arguments.done", **where,
                           "name": item["name"], "arguments": item["arguments"]})
        else:
            text = "".join(self._text)
            part = item["content"][0]
            part["text"] = text
            kind = "output_text" if item["type"] == "message" else "reasoning_text"
            done: Event = {"type": f"response.{kind}.done", **where, "content_index": 0,
                           "text": text}
            if kind == "output_text":
                done["logprobs"] = []
            events.append(done)
            events.append({"type": "response.content_part.done", **where, "content_index": 0,
                           "part": dict(part)})
        events.append({"type": "response.output_item.done", "output_index": where["output_index"],
                       "item": _copy(item)})
        return events

    def _where(self, item: dict[str, Any]) -> dict[str, Any]:
        return {"item_id": item["id"], "output_index": self._index(item), "content_index": 0}

    def _index(self, item: dict[str, Any]) -> int:
        return self._indices[item["id"]]


def _copy(item: dict[str, Any]) -> dict[str, Any]:
    return json.loads(json.dumps(item))


class EventWriter:
    """Server-sent events of the Responses API: `event: <type>` plus the JSON with its
    `type` and a `sequence_number` counting every event of the stream."""

    def __init__(self) -> None:
        self._seq = 0

    def __call__(self, event: Event) -> str:
        payload = {**event, "sequence_number": self._seq}
        self._seq += 1
        data = json.dumps(payload, ensure_ascii=False, separators=(",", ":"))
        return f"event: {event['type']}\ndata: {data}\n\n"


async def with_error_event(events: AsyncIterator[str], write: EventWriter) -> AsyncIterator[str]:
    """An error after the stream began travels as an `error` event, and the stream ends."""
    try:
        async for event in events:
            yield event
    except APIError as exc:
        yield write({"type": "error", "code": exc.code or exc.type, "message": exc.message,
                     "param": exc.param})
