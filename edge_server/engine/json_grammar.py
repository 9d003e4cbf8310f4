"""JSON schema -> GBNF grammar, on top of llama-cpp-python's converter.

The shipped converter ignores numeric bounds; this subclass enforces `minimum`,
`maximum` and their exclusive forms for integers (exactly) and for numbers (integer part
ranges plus fractions that stay inside the bounds). `unenforced()` lists the keywords a
grammar cannot enforce, so strict requests can be refused by name.
"""

from __future__ import annotations

import json
import math
from functools import lru_cache
from typing import Any

from llama_cpp.llama_grammar import JSON_GBNF, BuiltinRule, SchemaConverter

ANY_JSON_OBJECT = JSON_GBNF

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
_ENFORCED_FORMATS = {
    "date",
    "time",
    "date-time",
    "uuid",
    "uuid1",
    "uuid2",
    "uuid3",
    "uuid4",
    "uuid5",
}
_MAX_DIGITS = 15


class SchemaError(ValueError):
    """The schema is not one this server can turn into a grammar."""


def unenforced(schema: Any, path: str = "") -> list[str]:
    """Where the schema uses keywords that the grammar would not enforce."""
    if not isinstance(schema, dict):
        return []
    found = [f"{path}/{key}" for key in schema if key in _UNENFORCED_KEYWORDS]
    fmt = schema.get("format")
    if (
        isinstance(fmt, str)
        and fmt not in _ENFORCED_FORMATS
        and schema.get("type") in (None, "string")
    ):
        found.append(f"{path}/format={fmt}")
    pattern = schema.get("pattern")
    if pattern is not None and not (
        isinstance(pattern, str) and pattern.startswith("^") and pattern.endswith("$")
    ):
        found.append(f"{path}/pattern")  # the converter understands anchored patterns only
    for key in ("properties", "$defs", "definitions"):
        for name, sub in (schema.get(key) or {}).items():
            found += unenforced(sub, f"{path}/{key}/{name}")
    for key in ("items", "additionalProperties"):
        if isinstance(schema.get(key), dict):
            found += unenforced(schema[key], f"{path}/{key}")
    for key in ("anyOf", "oneOf", "allOf", "prefixItems"):
        for i, sub in enumerate(schema.get(key) or []):
            found += unenforced(sub, f"{path}/{key}/{i}")
    return found


def _digits_between(lo: str, hi: str) -> list[str]:
    """GBNF alternatives for digit strings of equal length from lo to hi (lo <= hi)."""
    if lo == hi:
        return [f'"{lo}"']
    if len(lo) == 1:
        return [f"[{lo}-{hi}]"]
    if set(lo) == {"0"} and set(hi) == {"9"}:
        return [" ".join(["[0-9]"] * len(lo))]
    if lo[0] == hi[0]:
        return [f'"{lo[0]}" (' + " | ".join(_digits_between(lo[1:], hi[1:])) + ")"]
    rest = len(lo) - 1
    alts = [f'"{lo[0]}" (' + " | ".join(_digits_between(lo[1:], "9" * rest)) + ")"]
    if int(lo[0]) + 1 <= int(hi[0]) - 1:
        alts.append(f"[{int(lo[0]) + 1}-{int(hi[0]) - 1}] " + " ".join(["[0-9]"] * rest))
    alts.append(f'"{hi[0]}" (' + " | ".join(_digits_between("0" * rest, hi[1:])) + ")")
    return alts


def _natural_range(lo: int, hi: int | None) -> list[str]:
    """Alternatives for decimal naturals in [lo, hi] (hi None: unbounded), lo >= 0."""
    alts: list[str] = []
    while hi is None or lo <= hi:
        width = len(str(lo))
        top = 10**width - 1
        if hi is not None and hi <= top:
            alts += _digits_between(str(lo), str(hi))
            break
        alts += _digits_between(str(lo), str(top))
        lo = top + 1
        if hi is None:
            alts.append(f"[1-9] [0-9]{{{width},{_MAX_DIGITS}}}")
            break
    return alts


def integer_range_rule(lo: int | None, hi: int | None) -> str:
    """GBNF body matching the JSON integers in [lo, hi]; None is an open end."""
    alts: list[str] = []
    # Negative part: "-" followed by magnitudes.
    if lo is None or lo < 0:
        top_mag = None if lo is None else -lo
        low_mag = 1 if hi is None or hi >= 0 else -hi
        if top_mag is None or low_mag <= top_mag:
            alts.append('"-" (' + " | ".join(_natural_range(low_mag, top_mag)) + ")")
    if hi is None or hi >= 0:
        alts += _natural_range(max(lo or 0, 0), hi)
    if not alts:
        raise SchemaError(f"no integer lies in [{lo}, {hi}]")
    return "(" + " | ".join(alts) + ")"


def _bounds(schema: dict[str, Any], integer: bool) -> tuple[float | None, float | None, bool, bool]:
    lo, hi = schema.get("minimum"), schema.get("maximum")
    lo_open = hi_open = False
    if isinstance(schema.get("exclusiveMinimum"), (int, float)) and not isinstance(
        schema.get("exclusiveMinimum"), bool
    ):
        lo, lo_open = schema["exclusiveMinimum"], True
    if isinstance(schema.get("exclusiveMaximum"), (int, float)) and not isinstance(
        schema.get("exclusiveMaximum"), bool
    ):
        hi, hi_open = schema["exclusiveMaximum"], True
    return lo, hi, lo_open, hi_open


# JSON forbids raw control characters in strings; the shipped rule lets them through.
_JSON_CHAR = BuiltinRule(r'[^"\\\x7F\x00-\x1F] | "\\" (["\\/bfnrt] | "u" [0-9a-fA-F]{4})', [])


class _BoundedConverter(SchemaConverter):
    def _add_primitive(self, name: str, rule: BuiltinRule) -> str:
        if name == "char":
            rule = _JSON_CHAR
        return super()._add_primitive(name, rule)  # type: ignore[no-any-return]

    def visit(self, schema: Any, name: str) -> str:
        if isinstance(schema, dict) and isinstance(schema.get("type"), list):
            # The shipped converter drops every other keyword of a type list
            # (maxLength, minimum, ...): keep them on each branch.
            branches = [{**schema, "type": t} for t in schema["type"]]
            return self._add_rule(name or "root", self._generate_union_rule(name, branches))
        if (
            isinstance(schema, dict)
            and schema.get("type") in ("integer", "number")
            and any(
                k in schema for k in ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum")
            )
        ):
            rule_name = name or "root"
            return self._add_rule(rule_name, self._bounded_number(schema) + " space")
        return super().visit(schema, name)  # type: ignore[no-any-return]

    def _bounded_number(self, schema: dict[str, Any]) -> str:
        lo, hi, lo_open, hi_open = _bounds(schema, schema["type"] == "integer")
        # Integers inside the bounds.
        int_lo = (
            None
            if lo is None
            else (math.floor(lo) + 1 if lo_open and float(lo).is_integer() else math.ceil(lo))
        )
        int_hi = (
            None
            if hi is None
            else (math.ceil(hi) - 1 if hi_open and float(hi).is_integer() else math.floor(hi))
        )
        whole = integer_range_rule(int_lo, int_hi)
        if schema["type"] == "integer":
            return whole
        # Numbers: k.ddd lies in [k, k+1) for k >= 0, so it needs k >= lo and k+1 <= hi.
        frac_lo = max(0, math.ceil(lo) if lo is not None else 0)
        frac_hi = None if hi is None else math.floor(hi) - 1
        if frac_hi is not None and frac_hi < frac_lo:
            return whole
        # A last digit of 1-9 keeps k.ddd strictly above k, for exclusive bounds too.
        fraction = integer_range_rule(frac_lo, frac_hi) + ' "." [0-9]{0,5} [1-9]'
        return f"({fraction} | {whole})"


@lru_cache(maxsize=256)
def _grammar_for_schema_text(schema_text: str) -> str:
    schema = json.loads(schema_text)
    converter = _BoundedConverter(prop_order={}, allow_fetch=False, dotall=False, raw_pattern=False)
    try:
        schema = converter.resolve_refs(schema, "request")
        converter.visit(schema, "")
    except (AssertionError, KeyError, ValueError, TypeError, RecursionError) as exc:
        raise SchemaError(f"the schema cannot be turned into a grammar: {exc}") from exc
    return str(converter.format_grammar())


def grammar_for_schema(schema: dict[str, Any]) -> str:
    """GBNF for a JSON schema; the same schema is converted once (cached)."""
    if not isinstance(schema, dict):
        raise SchemaError("a JSON schema must be an object")
    # Key order matters: properties are generated in the order the schema gives.
    return _grammar_for_schema_text(json.dumps(schema))
