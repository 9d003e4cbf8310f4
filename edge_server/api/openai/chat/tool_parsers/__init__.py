"""Incremental tool-call parsers: one convention (format) per model family."""

from collections.abc import Collection, Mapping
from typing import Any

from edge_server.api.openai.chat.tool_parsers.events import CallArguments, CallStart, Content, Event
from edge_server.api.openai.chat.tool_parsers.families import format_for_template, think_markers
from edge_server.api.openai.chat.tool_parsers.formats import (
    FORCED,
    HERMES,
    LLAMA3,
    MISTRAL,
    TOOL_CALL_TOKEN,
    ToolCallFormat,
)
from edge_server.api.openai.chat.tool_parsers.marked import LayoutParser
from edge_server.api.openai.chat.tool_parsers.parser import ToolCallParser

CallParser = ToolCallParser | LayoutParser


def call_parser(
    names: Collection[str],
    fmt: ToolCallFormat,
    *,
    forced: bool = False,
    max_calls: int | None = None,
    schemas: Mapping[str, Mapping[str, Any]] | None = None,
) -> CallParser:
    """The parser for the format: JSON call objects, or the format's layout."""
    if fmt.layout is not None:
        return LayoutParser(names, fmt, max_calls=max_calls, schemas=schemas)
    return ToolCallParser(names, fmt, forced=forced, max_calls=max_calls)


__all__ = [
    "FORCED",
    "HERMES",
    "LLAMA3",
    "MISTRAL",
    "TOOL_CALL_TOKEN",
    "CallArguments",
    "CallParser",
    "CallStart",
    "Content",
    "Event",
    "LayoutParser",
    "ToolCallFormat",
    "ToolCallParser",
    "call_parser",
    "format_for_template",
    "think_markers",
]
