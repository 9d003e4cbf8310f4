"""A chat answer's deltas (from ChoiceOutput: reasoning, content, tool calls) as Anthropic
content blocks and the stream events that build them.

Streamed and whole answers both go through Blocks, so both give the same content.
"""

from __future__ import annotations

import json
import uuid
from typing import Any

from edge_server.api.http.errors import APIError
from edge_server.api.http.limits import MAX_JSON_DEPTH, nesting_depth

Event = tuple[str, dict[str, Any]]  # (event type, payload)


def tool_use_id() -> str:
    return f"toolu_{uuid.uuid4().hex[:24]}"


class Blocks:
    def __init__(self) -> None:
        self.blocks: list[dict[str, Any]] = []
        self._open: str | None = None  # type of the last block while it is open
        self._arguments: list[list[str]] = []  # per block: a tool_use's JSON fragments

    def feed(self, deltas: list[dict[str, Any]]) -> list[Event]:
        events: list[Event] = []
        for delta in deltas:
            if delta.get("reasoning_content"):
                events += self._append("thinking", delta["reasoning_content"])
            if delta.get("content"):
                events += self._append("text", delta["content"])
            for call in delta.get("tool_calls") or ():
                function = call.get("function", {})
                if "id" in call:
                    events += self._start({"type": "tool_use", "id": tool_use_id(),
                                           "name": function["name"], "input": {}})
                if function.get("arguments"):
                    events += self._append("tool_use", function["arguments"])
        return events

    def close(self, *, parse_inputs: bool = True) -> list[Event]:
        """Ends the open block; every tool_use block gets its input parsed (a stream
        sent the input as JSON text already and needs no parse: `parse_inputs` False)."""
        events = self._stop()
        if not parse_inputs:
            return events
        for block, fragments in zip(self.blocks, self._arguments, strict=True):
            if block["type"] == "tool_use":
                block["input"] = _object("".join(fragments), block["name"])
        return events

    def check_open_input(self) -> None:
        """The 400 of a too-deep tool input (see _object) as soon as the open tool_use
        block's input nests that deep: generating the rest would be work for nothing."""
        if self._open == "tool_use":
            _check_depth("".join(self._arguments[-1]), self.blocks[-1]["name"])

    def _append(self, kind: str, text: str) -> list[Event]:
        events: list[Event] = []
        if kind == "tool_use" and self._open != kind:
            return []  # arguments only ever follow their call's start
        if self._open != kind:
            if kind == "text" and not text.strip():
                return []  # whitespace between blocks is no block of its own
            if kind == "text":
                text = text.lstrip()
            start: dict[str, Any] = (
                {"type": "text", "text": ""} if kind == "text"
                else {"type": "thinking", "thinking": "", "signature": ""})
            events += self._start(start)
        index = len(self.blocks) - 1
        block = self.blocks[index]
        if kind == "tool_use":
            self._arguments[index].append(text)
            delta = {"type": "input_json_delta", "partial_json": text}
        else:
            block[kind] += text
            delta = {"type": f"{kind}_delta", kind: text}
        events.append(("content_block_delta",
                       {"type": "content_block_delta", "index": index, "delta": delta}))
        return events

    def _start(self, block: dict[str, Any]) -> list[Event]:
        events = self._stop()
        self.blocks.append(block)
        self._arguments.append([])
        self._open = block["type"]
        events.append(("content_block_start", {"type": "content_block_start",
                                               "index": len(self.blocks) - 1,
                                               "content_block": dict(block)}))
        return events

    def _stop(self) -> list[Event]:
        if self._open is None:
            return []
        self._open = None
        index = len(self.blocks) - 1
        return [("content_block_stop", {"type": "content_block_stop", "index": index})]


def _object(arguments: str, name: str) -> dict[str, Any]:
    """A call's input; {} where the arguments were cut off (stop_reason max_tokens).
    Python's parser recurses per level: input nested deeper than a request body may be
    (which is also how it would come back in the conversation) is a 400, never a
    RecursionError."""
    _check_depth(arguments, name)
    try:
        value = json.loads(arguments) if arguments.strip() else {}
    except (ValueError, RecursionError):
        return {}
    return value if isinstance(value, dict) else {}


def _check_depth(arguments: str, name: str) -> None:
    if nesting_depth(arguments) > MAX_JSON_DEPTH:
        raise APIError(400, f"The model's call to the tool {name!r} has an input nested "
                       f"deeper than {MAX_JSON_DEPTH} levels, which this server does not "
                       "return; ask for a flatter input_schema, or stream the answer "
                       "(its input arrives as JSON text).",
                       param="tools", code="tool_input_too_deep")
