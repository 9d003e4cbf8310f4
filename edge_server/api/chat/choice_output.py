"""One choice's generated text as the client sees it: reasoning, content, tool calls.

Streamed and non-streamed answers both go through ChoiceOutput: a stream pushes each new
piece and sends the deltas it gets back; a whole answer is pushed at once and read back
as a message. Either way the same splitter and the same tool-call parser decide.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ...engine import FinishReason
from .control_text import ControlTexts
from .protocol import ChatFinishReason, ChatResponseMessage
from .reasoning import ReasoningSplitter
from .tool_parsers import (
    CallArguments,
    CallStart,
    Content,
    Event,
    ToolCallFormat,
    ToolCallParser,
)


@dataclass(frozen=True)
class ToolMode:
    """How a request's answer is read for calls."""

    names: tuple[str, ...]
    fmt: ToolCallFormat
    forced: bool  # the grammar makes the answer one call
    max_calls: int | None  # None: as many as the model writes
    legacy: bool  # answer as `function_call` (the request sent `functions`)


@dataclass
class _Call:
    id: str
    name: str
    arguments: list[str] = field(default_factory=list)


class ChoiceOutput:
    def __init__(self, *, split_reasoning: bool, reasoning_opened: bool, tools: ToolMode | None,
                 controls: ControlTexts | None = None):
        """`controls`: the model's control-token texts, where the engine renders them in
        this choice's text (GenerationRequest.render_control); they are never shown."""
        self._splitter = (
            ReasoningSplitter(starts_inside=reasoning_opened) if split_reasoning else None
        )
        self._tools = tools
        self._parser = (
            ToolCallParser(tools.names, tools.fmt, forced=tools.forced, max_calls=tools.max_calls)
            if tools
            else None
        )
        self._hidden = controls.hider() if controls is not None else None
        self._reasoning: list[str] = []
        self._content: list[str] = []
        self._calls: list[_Call] = []

    def push(self, text: str) -> list[dict[str, Any]]:
        """Deltas (OpenAI `delta` objects) that the new text makes known."""
        reasoning, content = self._splitter.push(text) if self._splitter else ("", text)
        events: list[Event] = self._parser.feed(content) if self._parser else [Content(content)]
        if self._hidden is not None:
            reasoning, events = self._hidden.shown(reasoning, events)
        return self._deltas(reasoning, events)

    def finish(self) -> list[dict[str, Any]]:
        """Deltas of what was held back until the end."""
        reasoning, content = self._splitter.finish() if self._splitter else ("", "")
        events: list[Event] = []
        if self._parser:
            events = self._parser.feed(content) + self._parser.finish()
        elif content:
            events = [Content(content)]
        if self._hidden is not None:
            reasoning, events = self._hidden.shown(reasoning, events, final=True)
        return self._deltas(reasoning, events)

    def finish_reason(self, engine_reason: FinishReason | None) -> ChatFinishReason | None:
        """Calls end the answer with `tool_calls` (`function_call`), unless it was cut
        off: then `length`, as OpenAI answers a call cut off by max_tokens."""
        if not self._calls or engine_reason == "length":
            return engine_reason
        return "function_call" if self._legacy else "tool_calls"

    def message(self) -> ChatResponseMessage:
        content: str | None = "".join(self._content)
        reasoning = "".join(self._reasoning) or None
        if not self._calls:
            return ChatResponseMessage(content=content, reasoning_content=reasoning)
        content = (content or "").strip() or None
        calls: list[dict[str, Any]] = [
            {
                "id": call.id,
                "type": "function",
                "function": {"name": call.name, "arguments": "".join(call.arguments)},
            }
            for call in self._calls
        ]
        if self._legacy:
            return ChatResponseMessage(
                content=content, reasoning_content=reasoning, function_call=calls[0]["function"]
            )
        return ChatResponseMessage(content=content, reasoning_content=reasoning, tool_calls=calls)

    @property
    def _legacy(self) -> bool:
        return bool(self._tools and self._tools.legacy)

    def _deltas(self, reasoning: str, events: list[Event]) -> list[dict[str, Any]]:
        deltas: list[dict[str, Any]] = []
        if reasoning:
            self._reasoning.append(reasoning)
            deltas.append({"reasoning_content": reasoning})
        for event in events:
            if isinstance(event, Content):
                if not event.text:
                    continue
                self._content.append(event.text)
                if deltas and set(deltas[-1]) == {"reasoning_content"}:
                    deltas[-1]["content"] = event.text
                else:
                    deltas.append({"content": event.text})
            elif isinstance(event, CallStart):
                self._calls.append(_Call(event.id, event.name))
                deltas.append(self._call_delta(event.index, event.id, event.name))
            elif isinstance(event, CallArguments):
                self._calls[event.index].arguments.append(event.text)
                deltas.append(self._call_delta(event.index, arguments=event.text))
        return deltas

    def _call_delta(
        self, index: int, id: str | None = None, name: str | None = None, arguments: str = ""
    ) -> dict[str, Any]:
        function: dict[str, str] = {"arguments": arguments}
        if name is not None:
            function = {"name": name, "arguments": ""}
        if self._legacy:
            return {"function_call": function}
        call: dict[str, Any] = {"index": index, "function": function}
        if id is not None:
            call = {"index": index, "id": id, "type": "function", "function": function}
        return {"tool_calls": [call]}
