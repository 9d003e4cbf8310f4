"""One choice's generated text as the client sees it: reasoning, content, tool calls.

Streamed and non-streamed answers both go through ChoiceOutput: a stream pushes each new
piece and sends the deltas it gets back; a whole answer is pushed at once and read back
as a message. Either way the same splitter and the same tool-call parser decide.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from edge_server.api.openai.chat.control_text import ControlTexts
from edge_server.api.openai.chat.protocol import ChatFinishReason, ChatResponseMessage
from edge_server.api.openai.chat.reasoning import CLOSE, OPEN, ReasoningSplitter
from edge_server.api.openai.chat.tool_parsers import (
    CallArguments,
    CallStart,
    Content,
    Event,
    ToolCallFormat,
    call_parser,
)
from edge_server.engine import FinishReason


@dataclass(frozen=True)
class ToolMode:
    """How a request's answer is read for calls."""

    names: tuple[str, ...]
    fmt: ToolCallFormat
    forced: bool  # the grammar makes the answer one call
    max_calls: int | None  # None: as many as the model writes
    legacy: bool  # answer as `function_call` (the request sent `functions`)
    schemas: dict[str, Any] = field(default_factory=dict)  # name -> parameters' schema


@dataclass
class _Reasoning:
    text: str


@dataclass
class _Call:
    id: str
    name: str
    arguments: list[str] = field(default_factory=list)


class ChoiceOutput:
    def __init__(
        self,
        *,
        split_reasoning: bool,
        reasoning_opened: bool,
        tools: ToolMode | None,
        think: tuple[str, str] | None = None,
        controls: ControlTexts | None = None,
    ):
        """`controls`: the model's control-token texts, where the engine renders them in
        this choice's text (GenerationRequest.render_control); they are never shown."""
        self._splitter = (
            ReasoningSplitter(starts_inside=reasoning_opened, markers=think or (OPEN, CLOSE))
            if split_reasoning
            else None
        )
        self._tools = tools
        self._parser = (
            call_parser(tools.names, tools.fmt, forced=tools.forced,
                        max_calls=tools.max_calls, schemas=tools.schemas)
            if tools
            else None
        )
        self._hidden = controls.hider((Content, _Reasoning)) if controls is not None else None
        self._reasoning: list[str] = []
        self._content: list[str] = []
        self._calls: list[_Call] = []

    def push(self, text: str) -> list[dict[str, Any]]:
        """Deltas (OpenAI `delta` objects) that the new text makes known."""
        return self._deltas(self._parser.feed(text) if self._parser else [Content(text)])

    def finish(self) -> list[dict[str, Any]]:
        """Deltas of what was held back until the end."""
        events = self._parser.finish() if self._parser else []
        tools = self._tools
        if tools is not None and tools.forced and not self._calls and len(tools.names) == 1 \
                and not any(isinstance(e, CallStart) for e in events):
            # A forced call cut off before its name was read is still that tool's call,
            # with the arguments it got (none), as OpenAI answers one cut by max_tokens.
            events.append(CallStart(0, tools.fmt.new_id(), tools.names[0]))
        return self._deltas(events, end=True)

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

    def _split(self, events: list[Event], end: bool) -> list[Event | _Reasoning]:
        """The content split into reasoning and answer. Calls are read first: the
        family's call markers may hold its reasoning markers (harmony's
        `to=functions.f<|channel|>analysis<|message|>`), and a call written before the
        reasoning closed is still a call."""
        if self._splitter is None:
            return list(events)
        out: list[Event | _Reasoning] = []
        pieces = [(e, self._splitter.push(e.text)) if isinstance(e, Content) else (e, None)
                  for e in events]
        if end:
            pieces.append((Content(""), self._splitter.finish()))
        for event, split in pieces:
            if split is None:
                out.append(event)
                continue
            reasoning, content = split
            if reasoning:
                out.append(_Reasoning(reasoning))
            if content:
                out.append(Content(content))
        return out

    def _deltas(self, events: list[Event], end: bool = False) -> list[dict[str, Any]]:
        deltas: list[dict[str, Any]] = []
        split = self._split(events, end)
        for event in self._hidden.shown(split, final=end) if self._hidden else split:
            if isinstance(event, _Reasoning):
                self._reasoning.append(event.text)
                deltas.append({"reasoning_content": event.text})
            elif isinstance(event, Content):
                # A forced answer is one call (its grammar has no room for text): what
                # the parser gives back as text is the envelope of a call cut off before
                # it could be read, never content.
                if not event.text or (self._tools is not None and self._tools.forced):
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
