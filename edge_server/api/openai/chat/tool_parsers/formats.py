"""How models write tool calls: the conventions read as JSON call objects (parser.py),
and the shape every family's convention shares (ToolCallFormat). The families whose
calls have another layout, and the choice by template, are in families.py.

A parsed answer is generated with control tokens rendered as their text, so a marker
that is a control token in its model (`[TOOL_CALLS]`, `<|python_tag|>`) reaches the
parser; a model may still leave a marker out, so formats whose markers are often skipped
also accept a call written at the very start of the answer without one ("bare").
"""

from __future__ import annotations

import secrets
import string
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field

from edge_server.api.openai.chat.tool_parsers.layouts import Layout


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
    # Families whose calls are not JSON call objects: the layout of a block of calls and
    # the pattern that opens one (marked.py reads them).
    layout: Layout | None = None
    trigger: str = ""
    drops: tuple[str, ...] = ()  # markers around plain content, left out of it
    # A pattern tried at the answer's very start (whose marker the prompt wrote): an
    # empty match opens a block of calls there, a non-empty one is left out.
    opening: str = ""
    think: tuple[str, str] = ("<think>", "</think>")  # where reasoning opens and closes
    # A forced call written the family's way (tool_schema.py): `{call}` is one call
    # object; with a layout, `{calls}` is the call, written by `forced_call` ({name},
    # {args}: its JSON arguments, or {params}: each written by `forced_param` ({key},
    # {value})). Empty: forced calls are bare call objects (FORCED).
    forced: str = ""
    forced_call: str = ""
    forced_param: str = ""


# `<tool_call>{"name": …, "arguments": …}</tool_call>`: Hermes, Qwen 2.5/3, and what the
# generic tool prompt asks any other model for.
HERMES = ToolCallFormat(
    "hermes", starts=("<tool_call>",), ends=("</tool_call>",),
    forced="<tool_call>\n{call}\n</tool_call>",
)
# `<|python_tag|>{"name": …, "parameters": …}`, several joined by `;`.
LLAMA3 = ToolCallFormat(
    "llama3", starts=("<|python_tag|>",), separators=";", forced="<|python_tag|>{call}"
)
# `[TOOL_CALLS][{"name": …, "arguments": …}, …]`, or `[TOOL_CALLS]name[ARGS]{…}`.
MISTRAL = ToolCallFormat(
    "mistral", starts=("[TOOL_CALLS]",), named=True, new_id=mistral_call_id,
    think=("[THINK]", "[/THINK]"), forced="[TOOL_CALLS][{call}]",
)
# `<|tool_call|>[{"name": …, "arguments": …}]`: Granite 3; Phi-4-mini closes the block.
TOOL_CALL_TOKEN = ToolCallFormat(
    "tool_call_token", starts=("<|tool_call|>",), ends=("<|/tool_call|>",),
    forced="<|tool_call|>[{call}]",
)
# A grammar-constrained call: exactly one bare `{"name": …, "arguments": …}`.
FORCED = ToolCallFormat("forced", forced="{call}")
