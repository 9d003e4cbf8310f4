"""Checks a JSON schema before conversion: malformed parts are refused by name, counts
past the limits of grammar/limits.py are refused (strict) or relaxed in place (otherwise).

Paths in messages are JSON pointers into the schema (`#/properties/tags/maxItems`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from edge_server.engine.grammar.limits import (
    MAX_ALTERNATIVES,
    MAX_ARRAY_ITEMS,
    MAX_DOCUMENT_DEPTH,
    MAX_ENUM_VALUES,
    MAX_NUMERIC_BOUND,
    MAX_PROPERTIES,
    MAX_SCHEMA_DEPTH,
    MAX_SCHEMA_NODES,
    MAX_STRING_LENGTH,
    MAX_TUPLE_ITEMS,
    SchemaError,
)
from edge_server.engine.grammar.pattern_check import PatternProblem, check_pattern

_TYPES = {"string", "number", "integer", "boolean", "object", "array", "null"}
_COUNTS = (("minLength", "maxLength", MAX_STRING_LENGTH), ("minItems", "maxItems", MAX_ARRAY_ITEMS))
_BOUNDS = ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum")
_SCHEMA_LISTS = ("anyOf", "oneOf", "allOf")
_SCHEMA_MAPS = ("properties", "$defs", "definitions")
# Keywords no grammar here enforces: with strict these are refused, otherwise ignored.
_UNENFORCED_KEYWORDS = {
    "multipleOf",
    "not",
    "if",
    "then",
    "else",
    "uniqueItems",
    "patternProperties",
    "dependentRequired",
    "dependentSchemas",
    "minProperties",
    "maxProperties",
    "contains",
    "minContains",
    "maxContains",
    "propertyNames",
    "unevaluatedProperties",
    "unevaluatedItems",
}
# Formats the converter has rules for.
ENFORCED_FORMATS = {"date", "time", "date-time", "uuid", *(f"uuid{i}" for i in range(1, 6))}


def pointer(path: str, *keys: str | int) -> str:
    """path extended by keys, escaped as JSON pointer segments."""
    for key in keys:
        path += "/" + str(key).replace("~", "~0").replace("/", "~1")
    return path


def normalize(schema: dict[str, Any], *, strict: bool) -> list[str]:
    """Validates the schema, relaxing it in place where allowed; returns what was relaxed."""
    _scan_document(schema)
    walk = _Walk(schema, strict)
    walk.schema(schema, "#", 0)
    return walk.notes


def unenforced(schema: Any, path: str = "#") -> list[str]:
    """Where a (checked) schema uses keywords that the grammar would not enforce."""
    if not isinstance(schema, dict):
        return []
    found = [pointer(path, key) for key in schema if key in _UNENFORCED_KEYWORDS]
    fmt = schema.get("format")
    if fmt is not None and fmt not in ENFORCED_FORMATS and schema.get("type") in (None, "string"):
        found.append(f"{pointer(path, 'format')}={fmt}")
    for key in _SCHEMA_MAPS:
        for name, sub in (schema.get(key) or {}).items():
            found += unenforced(sub, pointer(path, key, name))
    for key in ("items", "additionalProperties"):
        if isinstance(schema.get(key), dict):
            found += unenforced(schema[key], pointer(path, key))
    for key in ("prefixItems", "items", *_SCHEMA_LISTS):
        if isinstance(schema.get(key), list):
            for i, sub in enumerate(schema[key]):
                found += unenforced(sub, pointer(path, key, i))
    return found


def _scan_document(schema: Any) -> None:
    """Whole-document checks: nesting depth, finite numbers, well-formed $refs anywhere
    (the converter resolves a `$ref` in any object, even inside `const` or `default`)."""
    todo: list[tuple[Any, str, int]] = [(schema, "#", 0)]
    while todo:
        value, path, depth = todo.pop()
        if isinstance(value, float) and not math.isfinite(value):
            raise SchemaError(f"{path} is {value}; JSON numbers must be finite")
        if isinstance(value, dict | list):
            if depth >= MAX_DOCUMENT_DEPTH:
                raise SchemaError(
                    f"{path} nests JSON more than {MAX_DOCUMENT_DEPTH} levels deep"
                )
            items = value.items() if isinstance(value, dict) else enumerate(value)
            todo.extend((v, pointer(path, k), depth + 1) for k, v in items)
        if isinstance(value, dict) and "$ref" in value:
            resolve_ref(schema, value["$ref"], pointer(path, "$ref"))


def resolve_ref(root: dict[str, Any], ref: Any, path: str) -> dict[str, Any]:
    """The subschema a local $ref points to, looked up the way the converter does."""
    if not isinstance(ref, str) or not ref.startswith("#/"):
        raise SchemaError(f"{path} must be a local reference such as #/$defs/name")
    target: Any = root
    for key in ref[2:].split("/"):
        if not isinstance(target, dict) or key not in target:
            raise SchemaError(f"{path} points to nothing: {ref}")
        target = target[key]
    if not isinstance(target, dict):
        raise SchemaError(f"{path} must point to a schema object: {ref}")
    return target


@dataclass
class _Walk:
    root: dict[str, Any]
    strict: bool
    notes: list[str] = field(default_factory=list)
    seen: set[int] = field(default_factory=set)  # ids of the subschemas checked

    def schema(self, s: Any, path: str, depth: int, *, may_be_false: bool = False) -> Any:
        """Checks one subschema; returns what should stand in its place."""
        if s is True:
            return {}
        if s is False and may_be_false:
            return s
        if s is False:
            raise SchemaError(f"{path} is `false`, which matches nothing")
        if not isinstance(s, dict):
            raise SchemaError(f"{path} must be a schema (an object or a boolean)")
        if id(s) in self.seen:
            return s  # a $ref target checked already
        self.seen.add(id(s))
        if depth > MAX_SCHEMA_DEPTH:
            raise SchemaError(f"{path} nests subschemas more than {MAX_SCHEMA_DEPTH} deep")
        if len(self.seen) > MAX_SCHEMA_NODES:
            raise SchemaError(f"the schema has more than {MAX_SCHEMA_NODES} subschemas")
        self._type(s, path)
        self._children(s, path, depth)
        self._counts(s, path)
        self._bounds(s, path)
        self._pattern(s, path)
        if "format" in s and not isinstance(s["format"], str):
            raise SchemaError(f"{pointer(path, 'format')} must be a string")
        if "$ref" in s:
            target = resolve_ref(self.root, s["$ref"], pointer(path, "$ref"))
            self.schema(target, s["$ref"], depth + 1)
        return s

    def _type(self, s: dict[str, Any], path: str) -> None:
        if "type" not in s:
            return
        names = s["type"] if isinstance(s["type"], list) else [s["type"]]
        valid = all(isinstance(n, str) and n in _TYPES for n in names)
        if not names or len(names) > len(_TYPES) or not valid:
            raise SchemaError(
                f"{pointer(path, 'type')} must be one of {', '.join(sorted(_TYPES))}, or a "
                "non-empty list of them"
            )

    def _children(self, s: dict[str, Any], path: str, depth: int) -> None:
        for key in _SCHEMA_MAPS:
            if key not in s:
                continue
            subs = s[key]
            if not isinstance(subs, dict):
                raise SchemaError(f"{pointer(path, key)} must be an object of schemas")
            if key == "properties" and len(subs) > MAX_PROPERTIES:
                raise SchemaError(
                    f"{pointer(path, key)} has {len(subs)} properties, over the limit of "
                    f"{MAX_PROPERTIES}"
                )
            for name in list(subs):
                subs[name] = self.schema(subs[name], pointer(path, key, name), depth + 1)
        if "required" in s and not (
            isinstance(s["required"], list) and all(isinstance(r, str) for r in s["required"])
        ):
            raise SchemaError(f"{pointer(path, 'required')} must be a list of property names")
        if "additionalProperties" in s:
            s["additionalProperties"] = self.schema(
                s["additionalProperties"],
                pointer(path, "additionalProperties"),
                depth + 1,
                may_be_false=True,
            )
        if "items" in s and not isinstance(s["items"], list):
            # `items: false` only makes sense after a tuple's prefixItems.
            s["items"] = self.schema(
                s["items"], pointer(path, "items"), depth + 1, may_be_false="prefixItems" in s
            )
        for key in ("prefixItems", "items", *_SCHEMA_LISTS):
            if key not in s or (key == "items" and not isinstance(s[key], list)):
                continue
            subs = s[key]
            limit = MAX_ALTERNATIVES if key in _SCHEMA_LISTS else MAX_TUPLE_ITEMS
            if not isinstance(subs, list) or not subs:
                raise SchemaError(f"{pointer(path, key)} must be a non-empty list of schemas")
            if len(subs) > limit:
                raise SchemaError(
                    f"{pointer(path, key)} has {len(subs)} entries, over the limit of {limit}"
                )
            for i, sub in enumerate(subs):
                subs[i] = self.schema(sub, pointer(path, key, i), depth + 1)
        if "enum" in s:
            if not isinstance(s["enum"], list) or not s["enum"]:
                raise SchemaError(f"{pointer(path, 'enum')} must be a non-empty list")
            if len(s["enum"]) > MAX_ENUM_VALUES:
                raise SchemaError(
                    f"{pointer(path, 'enum')} has {len(s['enum'])} values, over the limit of "
                    f"{MAX_ENUM_VALUES}"
                )

    def _counts(self, s: dict[str, Any], path: str) -> None:
        for low_key, high_key, limit in _COUNTS:
            low, high = _count(s, low_key, path), _count(s, high_key, path)
            if low is not None and high is not None and low > high:
                raise SchemaError(
                    f"{pointer(path, low_key)} is {low}, above {high_key} {high}: nothing matches"
                )
            if high is not None and high > limit:
                over = f"over the limit of {limit}"
                self._over(path, high_key, high, over, f"lowered to {limit}")
                s[high_key] = limit
            if low is not None and low > limit:
                self._over(path, low_key, low, f"over the limit of {limit}", "dropped")
                del s[low_key]

    def _bounds(self, s: dict[str, Any], path: str) -> None:
        for key in _BOUNDS:
            if key not in s:
                continue
            value = s[key]
            if isinstance(value, bool) and key.startswith("exclusive"):
                continue  # draft-4 style: makes minimum/maximum exclusive
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise SchemaError(f"{pointer(path, key)} must be a number")
            if abs(value) > MAX_NUMERIC_BOUND:
                clamped = MAX_NUMERIC_BOUND if value > 0 else -MAX_NUMERIC_BOUND
                limit = f"outside the supported range of ±{MAX_NUMERIC_BOUND}"
                self._over(path, key, value, limit, f"clamped to {clamped}")
                s[key] = clamped

    def _pattern(self, s: dict[str, Any], path: str) -> None:
        if "pattern" not in s:
            return
        if not isinstance(s["pattern"], str):
            raise SchemaError(f"{pointer(path, 'pattern')} must be a string")
        try:
            s["pattern"] = check_pattern(s["pattern"])
        except PatternProblem as problem:
            if self.strict or problem.over_limit:
                raise SchemaError(f"pattern at {path} {problem}") from None
            self.notes.append(f"pattern at {path} ignored: it {problem}")
            del s["pattern"]

    def _over(self, path: str, keyword: str, value: Any, limit: str, relaxed: str) -> None:
        """A count past its limit: always refused. The limits keep llama.cpp safe; a
        schema silently changed to fit them would not be the schema the client sent."""
        del relaxed
        raise SchemaError(f"{keyword} {value} at {path} is {limit}")


def _count(s: dict[str, Any], key: str, path: str) -> int | None:
    if key not in s:
        return None
    value = s[key]
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise SchemaError(f"{pointer(path, key)} must be a non-negative integer")
    s[key] = value
    return value
