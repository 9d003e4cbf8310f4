"""How models write tool calls, and which convention a chat template teaches its model.

Control tokens are not part of the generated text (the engine renders pieces without
them), so a marker that is a control token in its model (`[TOOL_CALLS]`,
`<|python_tag|>`) may never be seen: formats whose markers can vanish also accept a call
written at the very start of the answer without one ("bare").
"""

from __future__ import annotations

import secrets
import string
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field


def openai_call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


def mistral_call_id() -> str:
    # Mistral templates refuse history whose call ids are not 9 letters or digits.
    return "".join(secrets.choice(string.ascii_letters + string.digits) for _ in range(9))


@dataclass(frozen=True)
class ToolCallFormat:
    name: str
    starts: tuple[str, ...] = ()  # markers that open a block of calls
    ends: tuple[str, ...] = ()  # markers that may close a block
    bare: bool = True  # a call (object or array of them) opening the answer counts
    separators: str = ""  # between calls of one block, besides an array's commas
    named: bool = False  # `name[ARGS]{…}` or `name{…}` also opens a call (Mistral v11+)
    new_id: Callable[[], str] = field(default=openai_call_id)


# `<tool_call>{"name": …, "arguments": …}</tool_call>`: Hermes, Qwen 2.5/3, and what the
# generic tool prompt asks any other model for.
HERMES = ToolCallFormat("hermes", starts=("<tool_call>",), ends=("</tool_call>",))
# `<|python_tag|>{"name": …, "parameters": …}`, several joined by `;`.
LLAMA3 = ToolCallFormat("llama3", starts=("<|python_tag|>",), separators=";")
# `[TOOL_CALLS][{"name": …, "arguments": …}, …]`, or `[TOOL_CALLS]name[ARGS]{…}`.
MISTRAL = ToolCallFormat(
    "mistral", starts=("[TOOL_CALLS]",), named=True, new_id=mistral_call_id
)
# `<|tool_call|>[{"name": …, "arguments": …}]`: Granite 3; Phi-4-mini closes the block.
TOOL_CALL_TOKEN = ToolCallFormat(
    "tool_call_token", starts=("<|tool_call|>",), ends=("<|/tool_call|>",)
)
# A grammar-constrained call: exactly one bare `{"name": …, "arguments": …}`.
FORCED = ToolCallFormat("forced")

_BY_MARKER = (
    ("[TOOL_CALLS]", MISTRAL),
    ("<tool_call>", HERMES),
    ("<|tool_call|>", TOOL_CALL_TOKEN),
    ("<|python_tag|>", LLAMA3),
    ("<|start_header_id|>ipython", LLAMA3),
)


def format_for_template(source: str, renders_tools: bool) -> ToolCallFormat:
    """The convention the template's own tool instructions use; Hermes for templates
    that know no tools (the generic tool prompt asks for it) or name no marker."""
    if renders_tools:
        for marker, fmt in _BY_MARKER:
            if marker in source:
                return fmt
    return HERMES
