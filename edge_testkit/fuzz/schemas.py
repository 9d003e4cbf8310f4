"""The JSON schemas' raw material for the fuzz generators: keyword values the server's
grammar builder reads, the part of the meta-schema hypothesis-jsonschema generates leaf
schemas from, and hostile shapes no random walk finds quickly (self-references, huge
alternations, deep nesting)."""

from __future__ import annotations

from typing import Any

PATTERNS = ["^[a-z]+$", "^[0-9]{3}$", "[a-z]", "^(a|b)*$", "^[$", "^(((a)))$", "^a{100000}$",
            "^.{0,99999}$", "^\\d+$", "^(?=a)$", "^\\p{L}$", "^a{2,1}$", "^[^\"]*$", "^$"]
FORMATS = ["date", "time", "date-time", "uuid", "email", "uri", "ipv4", "bogus", ""]
REFS = ["#/$defs/a", "#/definitions/a", "#", "#/$defs/missing", "#/properties/x",
        "https://127.0.0.1:1/s.json", "a", ""]
KEYWORDS = ["multipleOf", "not", "if", "uniqueItems", "patternProperties", "minProperties",
            "contains", "propertyNames", "unevaluatedProperties", "$schema", "title"]

# The part of the JSON Schema meta-schema the server's grammar builder reads, as a schema
# itself: hypothesis-jsonschema generates leaf schemas as instances of it.
_COUNT = {"type": "integer", "minimum": -1, "maximum": 2**40}
META_SUBSET: dict[str, Any] = {"type": "object", "additionalProperties": False, "properties": {
    "type": {"enum": ["string", "integer", "number", "boolean", "null", "object", "array"]},
    **dict.fromkeys(["minLength", "maxLength", "minItems", "maxItems"], _COUNT),
    "minimum": {"type": "number"}, "maximum": {"type": "number"},
    "exclusiveMinimum": {"type": ["number", "boolean"]},
    "exclusiveMaximum": {"type": ["number", "boolean"]},
    "enum": {"type": "array", "maxItems": 4,
             "items": {"type": ["string", "integer", "number", "boolean", "null"]}},
    "const": {"type": ["string", "integer", "boolean", "null"]},
    "pattern": {"enum": PATTERNS},
    "format": {"enum": FORMATS},
    "required": {"type": "array", "maxItems": 3, "items": {"type": "string"}},
    "additionalProperties": {"type": "boolean"},
}}

# Shapes no random walk finds quickly: self-references, huge alternations, deep nesting.
_deep: dict[str, Any] = {"type": "integer"}
for _ in range(60):
    _deep = {"type": "array", "items": _deep}
HOSTILE_SCHEMAS: list[Any] = [
    {"$defs": {"a": {"$ref": "#/$defs/a"}}, "$ref": "#/$defs/a"},
    {"$defs": {"a": {"type": "object", "properties": {"x": {"$ref": "#/$defs/a"}},
                     "required": ["x"]}}, "$ref": "#/$defs/a"},
    {"enum": [f"value-{i}" for i in range(3000)]},
    {"anyOf": [{"const": i} for i in range(500)]},
    {"type": "object", "properties": {f"k{i}": {"type": "string"} for i in range(400)},
     "required": [f"k{i}" for i in range(400)]},
    {"type": "array", "minItems": 100000, "items": {"type": "integer"}},
    {"type": "array", "minItems": 2**31, "maxItems": 2**63},
    {"type": "string", "minLength": 10**9},
    {"type": "string", "maxLength": 2**63},
    {"type": "integer", "minimum": -(2**63), "maximum": 2**63},
    {"type": "number", "minimum": -1e308, "maximum": 1e308},
    {"type": "integer", "exclusiveMinimum": 5, "exclusiveMaximum": 5},
    {"type": "string", "pattern": "^(a+)+(b+)+(c+)+$"},
    _deep,
]
