"""The grammar of a forced tool call: one `{"name": …, "arguments": …}` for any of the
tools, each tool's `parameters` placed under `arguments`.

A `$ref` is a JSON pointer from the root of the schema it was written in, and pydantic
writes one for every Enum and nested model (`#/$defs/Color`). Once the parameters sit
inside the call's schema their refs would resolve against the wrong root, so each tool's
`$defs` (and draft-07 `definitions`) move to the root of the call schema, renamed per tool
(`add.Color`) so that two tools' definitions never clash, and every ref is rewritten to
match. The names stay plain (letters, digits, `_.-`): the grammar converter does not
unescape pointers. It names each ref's rule itself (json_grammar), so these names never
need to be GBNF names.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import unquote

from edge_server.api.common.grammars import schema_grammar
from edge_server.api.http.errors import APIError
from edge_server.api.openai.chat.protocol import Tool
from edge_server.engine.grammar.schema_check import pointer

_DEFINITION_KEYWORDS = ("$defs", "definitions")
_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]")
_HOISTED_PATH = re.compile(r"#/\$defs/([A-Za-z0-9_.-]+)")


@dataclass
class CallSchema:
    schema: dict[str, Any]
    # hoisted definition name -> where the client wrote it, for error messages
    origins: dict[str, str] = field(default_factory=dict)


def call_schema(tools: list[Tool]) -> CallSchema:
    """JSON schema of one call to any of the tools (see the module's docstring)."""
    definitions: dict[str, Any] = {}
    origins: dict[str, str] = {}
    options = []
    for i, tool in enumerate(tools):
        name = tool.function.name
        parameters: Any = tool.function.parameters or {"type": "object"}
        where = "#/properties/arguments" if len(tools) == 1 else f"#/anyOf/{i}/properties/arguments"
        renames: dict[tuple[str, str], str] = {}
        if isinstance(parameters, dict):
            parameters = dict(parameters)
            for keyword in _DEFINITION_KEYWORDS:
                if not isinstance(parameters.get(keyword), dict):
                    continue  # left in place: the schema check names what is wrong
                for original, sub in parameters.pop(keyword).items():
                    hoisted = _unique(f"{name}.{_UNSAFE.sub('_', original)}", definitions)
                    definitions[hoisted] = sub
                    renames[(keyword, original)] = hoisted
                    origins[hoisted] = pointer(f"{name}.parameters#", keyword, original)
        for hoisted in renames.values():
            definitions[hoisted] = _with_refs(definitions[hoisted], renames, where)
        options.append(
            {
                "type": "object",
                "properties": {
                    "name": {"const": name},
                    "arguments": _with_refs(parameters, renames, where),
                },
                "required": ["name", "arguments"],
            }
        )
    schema: dict[str, Any] = options[0] if len(options) == 1 else {"anyOf": options}
    if definitions:
        schema = {**schema, "$defs": definitions}
    return CallSchema(schema, origins)


def call_grammar(tools: list[Tool]) -> str:
    """The grammar of a forced call; the grammar limits apply as to any schema, and an
    error names the function (and definition) the client wrote."""
    built = call_schema(tools)
    # A function marked strict gets its limits enforced, not relaxed.
    strict = any(t.function.strict for t in tools)
    try:
        return schema_grammar(built.schema, strict=strict, param="tools")
    except APIError as exc:
        exc.message = _HOISTED_PATH.sub(
            lambda m: built.origins.get(m.group(1), m.group(0)), exc.message
        )
        raise


def _unique(name: str, taken: dict[str, Any]) -> str:
    candidate, k = name, 2
    while candidate in taken:
        candidate, k = f"{name}-{k}", k + 1
    return candidate


def _with_refs(node: Any, renames: dict[tuple[str, str], str], where: str) -> Any:
    """A copy of the schema with its local refs made to point into the call schema.
    Refs inside `const` or `default` are rewritten too: the converter resolves those."""
    if isinstance(node, list):
        return [_with_refs(item, renames, where) for item in node]
    if not isinstance(node, dict):
        return node
    out = {key: _with_refs(value, renames, where) for key, value in node.items()}
    if isinstance(out.get("$ref"), str):
        out["$ref"] = _moved_ref(out["$ref"], renames, where)
    return out


def _moved_ref(ref: str, renames: dict[tuple[str, str], str], where: str) -> str:
    if ref == "#":
        return where
    if not ref.startswith("#/"):
        return ref  # not local: the schema check refuses it by name
    parts = [unquote(p).replace("~1", "/").replace("~0", "~") for p in ref[2:].split("/")]
    if len(parts) >= 2 and (parts[0], parts[1]) in renames:
        return pointer("#/$defs", renames[(parts[0], parts[1])], *parts[2:])
    return where + ref[1:]
