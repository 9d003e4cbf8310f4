"""The call a tool-call parser is reading, and the keys and characters that tell one."""

from __future__ import annotations

import json
from collections.abc import Collection
from dataclasses import dataclass, field

from edge_server.api.openai.chat.tool_parsers.json_scan import loads

# Keys a call object may have; any other key before the name means it is not a call.
NAME_KEYS = {"name", "tool_name"}  # Command R writes `tool_name`
ARGUMENT_KEYS = {"arguments", "parameters"}
CALL_KEYS = NAME_KEYS | ARGUMENT_KEYS | {"type", "id", "function", "tool_call_id"}
NAME_CHARS = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_-.")
ARGS_MARKERS = ("[ARGS]", "[CALL_ID]")


@dataclass
class Call:
    name: str | None = None
    index: int = -1  # set once started
    silent: bool = False  # beyond max_calls: read, never told
    arguments_key: str | None = None  # the key its arguments came under, once read
    arguments_done: bool = False
    # Arguments read before the name, or of a JSON string (told decoded, at its end):
    # pieces, joined once (a long argument arrives in thousands).
    pending: list[str] = field(default_factory=list)
    string_arguments: bool = False  # arguments written as a JSON string

    def take_pending(self) -> str:
        text = "".join(self.pending)
        self.pending = []
        return text

    def decode_string_arguments(self) -> None:
        """Arguments written as a JSON string, read to its end: kept as the text it holds
        (as written, where it was not a string after all)."""
        raw = self.take_pending()
        decoded = loads(raw)
        self.pending = [decoded if isinstance(decoded, str) else raw]
        self.string_arguments = False


def nested_call(text: str, names: Collection[str]) -> tuple[str, str] | None:
    """`{"name": …, "arguments": …}` under a call's `function` key: its name and its
    arguments as JSON text, where the name is a listed tool's."""
    value = loads(text)
    name = value.get("name") if isinstance(value, dict) else None
    if not isinstance(name, str) or name not in names:
        return None
    assert isinstance(value, dict)
    arguments = value.get("arguments", value.get("parameters", {}))
    if not isinstance(arguments, str):
        arguments = json.dumps(arguments, ensure_ascii=False)
    return name, arguments


def past_args_marker(buf: str) -> int | None:
    """The length of an `[ARGS]` (or `[CALL_ID]id[ARGS]`) marker at the start of `buf`,
    after which a named call's arguments begin; 0: none there; None: more text needed."""
    for marker in ARGS_MARKERS:
        if buf.startswith(marker):
            # `[CALL_ID]id[ARGS]`: the model's own id is read past, ours is used.
            rest = buf[len(marker) :]
            if marker == "[CALL_ID]":
                at = rest.find("[ARGS]")
                if at < 0:
                    return None
                rest = rest[at + len("[ARGS]") :]
            return len(buf) - len(rest)
        if marker.startswith(buf):
            return None
    return 0


def name_length(buf: str) -> int:
    """How many of `buf`'s first characters may belong to a tool's name."""
    end = 0
    while end < len(buf) and buf[end] in NAME_CHARS:
        end += 1
    return end
