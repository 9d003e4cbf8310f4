"""The grammar of a forced call written the way the model's family writes calls: the
family's markers around the call (`<tool_call>…</tool_call>`, `[TOOL_CALLS][…]`), or its
layout (`<function=name><parameter=k>…</parameter></function>`, `name[ARGS]{…}`),
with the arguments (or each parameter's value) still held to the tool's schema.

Each schema's grammar comes from the same converter as any response_format schema; its
rules are renamed with a prefix of their own so that several sit in one grammar.
"""

from __future__ import annotations

import json
import re
from typing import Any

from edge_server.api.common.grammars import schema_grammar
from edge_server.api.openai.chat.protocol import Tool
from edge_server.api.openai.chat.tool_parsers import ToolCallFormat
from edge_server.api.openai.chat.tool_parsers.values import wants_string

# A rule name in GBNF; string literals and character classes are skipped around it.
_TOKEN = re.compile(r'"(?:[^"\\]|\\.)*"|\[(?:[^\]\\]|\\.)*\]|[A-Za-z][A-Za-z0-9-]*|.', re.S)
# A parameter value written as text: anything up to the next tag.
_TEXT_VALUE = "[^<]*"


def family_call_grammar(tools: list[Tool], fmt: ToolCallFormat, call_object: str) -> str | None:
    """The grammar, or None where the family has no forced form this server writes (or
    the parameters use `$ref`s that only resolve in the whole schema): then the call is
    a bare call object. `call_object`: the grammar of one call object (tool_schema)."""
    if not fmt.forced:
        return None
    if fmt.layout is None:
        before, _, after = fmt.forced.partition("{call}")
        rules = renamed(call_object, "call-")
        return f"root ::= {literal(before)} call-root {literal(after)}\n{rules}"
    calls: list[str] = []
    parts: list[str] = []
    for i, tool in enumerate(tools):
        parameters: Any = tool.function.parameters or {"type": "object"}
        strict = bool(tool.function.strict)
        call = _call_rule(f"t{i}-", tool.function.name, parameters, fmt, strict, parts)
        if call is None:
            return None
        calls.append(call)
    before, _, after = fmt.forced.partition("{calls}")
    body = " | ".join(f"( {c} )" for c in calls)
    return f"root ::= {literal(before)} ( {body} ) {literal(after)}\n" + "\n".join(parts)


def _call_rule(prefix: str, name: str, parameters: Any, fmt: ToolCallFormat, strict: bool,
               rules: list[str]) -> str | None:
    template = fmt.forced_call.replace("{name}", name)
    if "{args}" in template:
        before, _, after = template.partition("{args}")
        rules.append(renamed(schema_grammar(parameters, strict=strict, param="tools"), prefix))
        return f"{literal(before)} {prefix}root {literal(after)}"
    before, _, after = template.partition("{params}")
    if not isinstance(parameters, dict) or "$ref" in json.dumps(parameters):
        return None
    properties = parameters.get("properties") or {}
    required = set(parameters.get("required") or [])
    pieces = []
    for j, (key, schema) in enumerate(properties.items()):
        value = f"{prefix}p{j}-value"
        if wants_string(schema):
            # Written as bare text: an enum's choices, else any text up to the next tag
            # (other string constraints are not held here).
            choices = schema.get("enum") if isinstance(schema, dict) else None
            text = " | ".join(literal(c) for c in choices) if choices else _TEXT_VALUE
            rules.append(f"{value} ::= {text}")
        else:
            grammar = schema_grammar(schema if isinstance(schema, dict) else {}, strict=strict,
                                     param="tools")
            rules.append(renamed(grammar, f"{prefix}p{j}-"))
            value = f"{prefix}p{j}-root"
        p_before, _, p_after = fmt.forced_param.replace("{key}", key).partition("{value}")
        piece = f"{literal(p_before)} {value} {literal(p_after)}"
        pieces.append(piece if key in required else f"( {piece} )?")
    return f"{literal(before)} {' '.join(pieces)} {literal(after)}"


def renamed(grammar: str, prefix: str) -> str:
    """The grammar with every rule name prefixed (literals and classes untouched)."""
    out = []
    for m in _TOKEN.finditer(grammar):
        token = m.group()
        out.append(prefix + token if token[0].isalpha() else token)
    return "".join(out)


def literal(text: str) -> str:
    """The text as a GBNF string literal ("" for none)."""
    if not text:
        return ""
    escaped = (text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
               .replace("\r", "\\r").replace("\t", "\\t"))
    return f'"{escaped}"'
