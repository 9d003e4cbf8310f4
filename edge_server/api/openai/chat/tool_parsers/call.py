"""The call a tool-call parser is reading, and the keys and characters that tell one."""

from __future__ import annotations

from dataclasses import dataclass, field

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
