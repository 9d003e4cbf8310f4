"""Function calling: which tools a request offers, and how the prompt presents them.

Templates that know tools (they mention `tools`) get them as the `tools` variable; for
the others a generic system prompt describes them and asks for a call as
`<tool_call>{"name": …, "arguments": {…}}</tool_call>` (the Hermes convention most
tool-aware templates use). `required` and a named tool_choice constrain the output with a
grammar (tool_schema) so the arguments always fit the function's parameters; that grammar
allows exactly one call, whatever parallel_tool_calls says (small models given room for
a list tend to fill it). Calls are read out of the answer by tool_parsers, in the
convention the template teaches; `parallel_tool_calls: false` keeps only the first.

Older clients send `functions` / `function_call` instead of `tools` / `tool_choice`;
those become tools here, and the answer goes back in the legacy shape.
"""

from __future__ import annotations

import json
from typing import Any

from edge_server.api.http.errors import invalid
from edge_server.api.openai.chat.protocol import (
    ChatCompletionRequest,
    FunctionName,
    NamedToolChoice,
    Tool,
    ToolCall,
)

GENERIC_TOOL_PROMPT = (
    "You can call functions. The available functions, as JSON schemas:\n{tools}\n"
    "To call a function, answer with only\n"
    '<tool_call>{{"name": "<function name>", "arguments": {{<arguments as JSON>}}}}'
    "</tool_call>\n"
    "Otherwise answer normally."
)

def apply_legacy_functions(req: ChatCompletionRequest) -> bool:
    """`functions` / `function_call` as `tools` / `tool_choice`; True if the request used
    them (the answer then carries `function_call`). Mixing the two styles is a 400."""
    if req.functions is None and req.function_call is None:
        return False
    if req.functions is not None and req.tools is not None:
        raise invalid("functions", "give either `functions` or `tools`, not both")
    if req.function_call is not None and req.tool_choice is not None:
        raise invalid("function_call", "give either `function_call` or `tool_choice`, not both")
    if req.functions is None:
        raise invalid("function_call", "function_call needs `functions`")
    req.tools = [Tool(function=f) for f in req.functions]
    choice = req.function_call
    if isinstance(choice, FunctionName):
        if choice.name not in {f.name for f in req.functions}:
            raise invalid("function_call", f"no function named {choice.name!r} in `functions`")
        req.tool_choice = NamedToolChoice(function={"name": choice.name})
    else:
        req.tool_choice = choice
    return True


def active_tools(req: ChatCompletionRequest) -> list[Tool]:
    """The tools the model may call under tool_choice."""
    if not req.tools or req.tool_choice == "none":
        return []
    if isinstance(req.tool_choice, NamedToolChoice):
        name = req.tool_choice.function.get("name")
        return [t for t in req.tools if t.function.name == name]
    return list(req.tools)


def tool_specs(tools: list[Tool]) -> list[dict[str, Any]]:
    """The tools as the caller sent them: no key added (a default), none dropped but
    nulls (templates test for a key, not for null)."""
    return [{"type": t.type, "function": {
        k: v for k, v in t.function.model_dump(exclude_unset=True).items() if v is not None}}
        for t in tools]


def generic_prompt(tools: list[Tool]) -> str:
    listing = "\n".join(json.dumps(spec["function"]) for spec in tool_specs(tools))
    return GENERIC_TOOL_PROMPT.format(tools=listing)


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
