"""A parameter written as text (XML-like layouts) as the JSON value its schema declares."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any


def typed_value(text: str, schema: Mapping[str, Any] | None) -> str:
    """The value as JSON text: a string where the schema allows one (or the text is no
    JSON), else the JSON the text holds (`1` for an integer parameter)."""
    # Layouts put the value on lines of its own: one newline either side is layout.
    if text.startswith("\n"):
        text = text[1:]
    if text.endswith("\n"):
        text = text[:-1]
    if not wants_string(schema):
        try:
            return json.dumps(json.loads(text), ensure_ascii=False)
        except (ValueError, RecursionError):
            pass
    return json.dumps(text, ensure_ascii=False)


def wants_string(schema: Mapping[str, Any] | None) -> bool:
    if not isinstance(schema, Mapping):
        return False
    kind = schema.get("type")
    if kind == "string" or (isinstance(kind, list) and kind == ["string"]):
        return True
    return "enum" in schema and all(isinstance(v, str) for v in schema["enum"])
