"""Function calling: tools into the prompt, tool calls out of the model's text.

Templates that know tools (they mention `tools`) get them as the `tools` variable; for
the others a generic system prompt describes them. Either way the model is asked to
answer a call as `<tool_call>{"name": …, "arguments": {…}}</tool_call>` (the Hermes
convention most tool-aware templates use). `required` and a named tool_choice constrain
the output with a grammar so the arguments always fit the function's parameters.
"""

from __future__ import annotations

import json
import re
import uuid
from typing import Any

from .protocol import ChatCompletionRequest, NamedToolChoice, Tool, ToolCall

GENERIC_TOOL_PROMPT = (
    "You can call functions. The available functions, as JSON schemas:\n{tools}\n"
    "To call a function, answer with only\n"
    '<tool_call>{{"name": "<function name>", "arguments": {{<arguments as JSON>}}}}'
    "</tool_call>\n"
    "Otherwise answer normally."
)

_TAGGED = re.compile(r"<tool_call>\s*(.*?)\s*(?:</tool_call>|$)", re.DOTALL)


def active_tools(req: ChatCompletionRequest) -> list[Tool]:
    """The tools the model may call under tool_choice."""
    if not req.tools or req.tool_choice == "none":
        return []
    if isinstance(req.tool_choice, NamedToolChoice):
        name = req.tool_choice.function.get("name")
        return [t for t in req.tools if t.function.name == name]
    return list(req.tools)


def tool_specs(tools: list[Tool]) -> list[dict[str, Any]]:
    return [t.model_dump(exclude_none=True) for t in tools]


def generic_prompt(tools: list[Tool]) -> str:
    listing = "\n".join(json.dumps(spec["function"]) for spec in tool_specs(tools))
    return GENERIC_TOOL_PROMPT.format(tools=listing)


def call_schema(tools: list[Tool]) -> dict[str, Any]:
    """JSON schema of one call to any of the tools, for grammar-constrained calls."""
    options = [
        {
            "type": "object",
            "properties": {
                "name": {"const": t.function.name},
                "arguments": t.function.parameters or {"type": "object"},
            },
            "required": ["name", "arguments"],
        }
        for t in tools
    ]
    return options[0] if len(options) == 1 else {"anyOf": options}


def parse_tool_calls(text: str, tools: list[Tool]) -> tuple[str | None, list[dict[str, Any]]]:
    """(remaining content, tool_calls) found in the model's answer."""
    names = {t.function.name for t in tools}
    calls: list[dict[str, Any]] = []
    candidates = _TAGGED.findall(text)
    if not candidates and text.strip().startswith("{"):
        candidates = [text.strip()]
    for raw in candidates:
        call = _as_call(raw, names)
        if call is not None:
            calls.append(call)
    if not calls:
        return text, []
    rest = _TAGGED.sub("", text).strip() if "<tool_call>" in text else ""
    return (rest or None), calls


def _as_call(raw: str, names: set[str]) -> dict[str, Any] | None:
    try:
        data = json.loads(raw)
    except (ValueError, RecursionError):  # the model may write anything, nesting included
        return None
    if not isinstance(data, dict) or data.get("name") not in names:
        return None
    arguments = data.get("arguments", data.get("parameters", {}))
    if isinstance(arguments, str):
        arguments_text = arguments
    else:
        arguments_text = json.dumps(arguments, ensure_ascii=False)
    return {
        "id": f"call_{uuid.uuid4().hex[:24]}",
        "type": "function",
        "function": {"name": data["name"], "arguments": arguments_text},
    }


def history_text(tool_calls: list[ToolCall]) -> str:
    """An earlier assistant turn's calls, as text, for templates that know no tools."""
    parts = []
    for call in tool_calls:
        arguments = call.function.parsed_arguments()
        parts.append(
            "<tool_call>"
            + json.dumps({"name": call.function.name, "arguments": arguments})
            + "</tool_call>"
        )
    return "\n".join(parts)
