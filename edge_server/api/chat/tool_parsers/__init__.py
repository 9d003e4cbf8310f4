"""Incremental tool-call parsers: one parser, several conventions (formats)."""

from .events import CallArguments, CallStart, Content, Event
from .formats import (
    FORCED,
    HERMES,
    LLAMA3,
    MISTRAL,
    TOOL_CALL_TOKEN,
    ToolCallFormat,
    format_for_template,
)
from .parser import ToolCallParser

__all__ = [
    "FORCED",
    "HERMES",
    "LLAMA3",
    "MISTRAL",
    "TOOL_CALL_TOKEN",
    "CallArguments",
    "CallStart",
    "Content",
    "Event",
    "ToolCallFormat",
    "ToolCallParser",
    "format_for_template",
]
