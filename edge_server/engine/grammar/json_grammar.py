"""JSON schema -> GBNF grammar, on top of llama-cpp-python's converter.

The schema is first checked and, unless strict, relaxed to the bounds of
grammar/limits.py (schema_check); the finished grammar is checked once more
(limits.check_grammar) before llama.cpp may see it.

The shipped converter ignores numeric bounds; this subclass enforces `minimum`,
`maximum` and their exclusive forms for integers (exactly) and for numbers (integer part
ranges plus fractions that stay inside the bounds). String lengths and array sizes are
written as compact `{n,m}` repetitions (the shipped converter nests one group per
optional copy, which is what overflows llama.cpp's parser).
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from typing import Any

from llama_cpp.llama_grammar import (
    INVALID_RULE_CHARS_RE,
    JSON_GBNF,
    PRIMITIVE_RULES,
    RESERVED_NAMES,
    BuiltinRule,
    SchemaConverter,
)

from edge_server.engine.grammar.limits import MAX_GBNF_REPEAT, SchemaError, check_grammar
from edge_server.engine.grammar.schema_cache import (
    CACHE_BYTES,
    ByteBoundedCache,
    canonical_text,
    schema_key,
)
from edge_server.engine.grammar.schema_check import ENFORCED_FORMATS, normalize, unenforced

__all__ = [
    "ANY_JSON_OBJECT",
    "CompiledSchema",
    "SchemaError",
    "compile_schema",
    "grammar_cache_bytes",
    "grammar_for_schema",
    "integer_range_rule",
    "name_tool_paths",
    "unenforced",
]

ANY_JSON_OBJECT = JSON_GBNF

_MAX_DIGITS = 15
# Long repetitions are written as blocks of this many copies, so that no single
# `{n,m}` exceeds MAX_GBNF_REPEAT.
_BLOCK = 64
# Keywords the shipped converter acts on before it looks at a type's own keywords.
_PRECEDENCE = {"$ref", "anyOf", "oneOf", "const", "enum"}


@dataclass(frozen=True)
class CompiledSchema:
    grammar: str
    # What the grammar does not hold the output to: relaxed limits, ignored keywords.
    relaxed: tuple[str, ...] = ()


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
            # Longer numbers, up to the 16 digits an unbounded JSON integer gets here;
            # `{16,15}` would send llama.cpp into an endless loop.
            if width <= _MAX_DIGITS:
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


def _bounds(schema: dict[str, Any]) -> tuple[float | None, float | None, bool, bool]:
    """(low, high, low exclusive, high exclusive): the tighter bound of each side wins;
    draft-4 style `exclusiveMinimum: true` makes `minimum` exclusive."""
    lo, hi = schema.get("minimum"), schema.get("maximum")
    ex_lo, ex_hi = schema.get("exclusiveMinimum"), schema.get("exclusiveMaximum")
    lo_open = ex_lo is True and lo is not None
    hi_open = ex_hi is True and hi is not None
    if _is_number(ex_lo) and (lo is None or ex_lo >= lo):
        lo, lo_open = ex_lo, True
    if _is_number(ex_hi) and (hi is None or ex_hi <= hi):
        hi, hi_open = ex_hi, True
    return lo, hi, lo_open, hi_open


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


# JSON forbids raw control characters in strings; the shipped rule lets them through.
_JSON_CHAR = BuiltinRule(r'[^"\\\x7F\x00-\x1F] | "\\" (["\\/bfnrt] | "u" [0-9a-fA-F]{4})', [])


class _BoundedConverter(SchemaConverter):
    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._ref_rules: dict[str, str] = {}  # resolved ref -> the rule that holds it

    def _resolve_ref(self, ref: str) -> str:
        # The shipped version names a ref's rule after the ref's last segment as written:
        # `tool.Node` or `tree_node` is no GBNF name where a ref recurses, and a definition
        # named `space` or after a property resolved to that rule instead. Each ref gets a
        # valid name of its own here, reserved before its schema is visited, so a ref
        # inside that schema (recursion) names the rule being built.
        known = self._ref_rules.get(ref)
        if known is not None:
            return known
        base = "ref-" + INVALID_RULE_CHARS_RE.sub("-", ref.rsplit("/", 1)[-1]).strip("-")
        name, k = base, 2
        taken = self._rules.keys() | set(self._ref_rules.values())
        while name in taken:
            name, k = f"{base}-{k}", k + 1
        self._ref_rules[ref] = name
        built = self.visit(self._refs[ref], name)
        if built != name:  # a shared rule (a sized string), or one named like another
            if name in self._rules:
                raise ValueError(f"the rule name {name} was taken while {ref} was built")
            self._rules[name] = built
        return name

    def _add_primitive(self, name: str, rule: BuiltinRule) -> str:
        if name == "char":
            rule = _JSON_CHAR
        return super()._add_primitive(name, rule)

    def _format_literal(self, literal: str) -> str:
        # The literal is JSON text (a const, a key): its backslashes are characters to
        # produce, not GBNF escapes; the shipped version passes them through.
        escaped = literal.replace("\\", "\\\\").replace('"', '\\"')
        return '"' + escaped.replace("\n", "\\n").replace("\r", "\\r") + '"'

    def _generate_constant_rule(self, value: Any) -> str:
        # Non-ASCII text as itself: shorter than \u escapes, and no surrogate pairs.
        return self._format_literal(json.dumps(value, ensure_ascii=False))

    def visit(self, schema: Any, name: str) -> str:
        # A property named like a built-in rule ("string", "char") must not replace it.
        rule_name = name + "-" if name in RESERVED_NAMES else name or "root"
        if isinstance(schema, dict) and isinstance(schema.get("type"), list):
            # The shipped converter drops every other keyword of a type list
            # (maxLength, minimum, ...): keep them on each branch.
            branches = [{**schema, "type": t} for t in schema["type"]]
            return self._add_rule(rule_name, self._generate_union_rule(name, branches))
        if not isinstance(schema, dict) or _PRECEDENCE & schema.keys():
            return super().visit(schema, name)
        kind = schema.get("type")
        if kind in ("integer", "number") and any(
            k in schema for k in ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum")
        ):
            return self._add_rule(rule_name, self._bounded_number(schema) + " space")
        if (
            kind == "string"
            and ("minLength" in schema or "maxLength" in schema)
            and "pattern" not in schema
            and schema.get("format") not in ENFORCED_FORMATS
        ):
            return self._sized_string(schema, rule_name)
        if self._is_sized_array(schema):
            return self._add_rule(rule_name, self._array(schema, name))
        return super().visit(schema, name)

    def _sized_string(self, schema: dict[str, Any], rule_name: str) -> str:
        # One rule per pair of bounds, shared by every string that has them: llama.cpp
        # expands each repetition it reads, so a copy per property would multiply rules.
        lo, hi = schema.get("minLength", 0), schema.get("maxLength")
        char = self._add_primitive("char", PRIMITIVE_RULES["char"])
        body = self._repeat(char, lo, hi)
        shared = self._add_rule(f"string-{lo}-{hi}", rf'"\"" {body} "\"" space')
        return shared if rule_name != "root" else self._add_rule("root", shared)

    @staticmethod
    def _is_sized_array(schema: dict[str, Any]) -> bool:
        """Arrays of one item schema, which the shipped converter would expand."""
        kind = schema.get("type")
        if kind not in (None, "array") or "prefixItems" in schema:
            return False
        if kind is None and (
            "properties" in schema
            or schema.get("additionalProperties", True) is not True
            or "allOf" in schema
        ):
            return False  # the shipped converter reads these as objects first
        if isinstance(schema.get("items"), dict):
            return True
        return kind == "array" and ("minItems" in schema or "maxItems" in schema)

    def _array(self, schema: dict[str, Any], name: str) -> str:
        items = schema.get("items") or {}
        prefix = f"{name}{'-' if name else ''}"
        if items:
            item = self.visit(items, f"{prefix}item")
        else:
            item = self._add_primitive("value", PRIMITIVE_RULES["value"])
        lo, hi = schema.get("minItems", 0), schema.get("maxItems")
        body = ""
        if hi != 0:
            following = self._add_rule(f"{prefix}next", f'"," space {item}')
            rest = self._repeat(following, max(lo - 1, 0), None if hi is None else hi - 1)
            body = f"{item} {rest}".strip()
            body = f"({body})? " if lo == 0 else f"{body} "
        return f'"[" space {body}"]" space'

    def _repeat(self, unit: str, lo: int, hi: int | None) -> str:
        """GBNF for lo to hi (None: any number of) copies of the rule `unit`."""
        if hi is not None and hi <= MAX_GBNF_REPEAT:
            return "" if hi == 0 else f"{unit}{{{lo},{hi}}}"
        if hi is None and lo <= MAX_GBNF_REPEAT:
            return f"{unit}{{{lo},}}" if lo else f"{unit}*"
        head = self._exactly(unit, lo)
        tail = f"{unit}*" if hi is None else self._up_to(unit, hi - lo)
        return f"{head} {tail}".strip()

    def _exactly(self, unit: str, n: int) -> str:
        if n <= MAX_GBNF_REPEAT:
            return f"{unit}{{{n}}}" if n else ""
        blocks, rest = divmod(n, _BLOCK)
        return f"{self._block(unit)}{{{blocks}}} {self._exactly(unit, rest)}".strip()

    def _up_to(self, unit: str, n: int) -> str:
        if n <= MAX_GBNF_REPEAT:
            return f"{unit}{{0,{n}}}" if n else ""
        # Either all full blocks plus what is left, or fewer blocks plus a partial one:
        # the two alternatives never overlap, so llama.cpp tracks few states at once.
        blocks, rest = divmod(n, _BLOCK)
        block = self._block(unit)
        full = f"{block}{{{blocks}}}" + (f" {unit}{{0,{rest}}}" if rest else "")
        return f"({full} | {block}{{0,{blocks - 1}}} {unit}{{0,{_BLOCK - 1}}})"

    def _block(self, unit: str) -> str:
        return self._add_rule(f"{unit}-x{_BLOCK}", f"{unit}{{{_BLOCK}}}")

    def _bounded_number(self, schema: dict[str, Any]) -> str:
        lo, hi, lo_open, hi_open = _bounds(schema)
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


def _compile(schema_text: str, strict: bool) -> CompiledSchema:
    schema = json.loads(schema_text)
    relaxed = normalize(schema, strict=strict)
    gaps = unenforced(schema)
    if gaps and strict:
        raise SchemaError(
            f"strict schemas may not use keywords this server cannot enforce: {', '.join(gaps)}"
        )
    converter = _BoundedConverter(prop_order={}, allow_fetch=False, dotall=False, raw_pattern=False)
    try:
        schema = converter.resolve_refs(schema, "request")
        converter.visit(schema, "")
    except (
        AssertionError,
        AttributeError,
        IndexError,
        KeyError,
        OverflowError,
        RecursionError,
        TypeError,
        ValueError,
    ) as exc:
        raise SchemaError(f"the schema cannot be turned into a grammar: {exc}") from exc
    grammar = str(converter.format_grammar())
    check_grammar(grammar)
    return CompiledSchema(grammar, (*relaxed, *(f"{gap} not enforced" for gap in gaps)))


def compile_schema(schema: Any, *, strict: bool = False) -> CompiledSchema:
    """The grammar for a JSON schema, checked against the limits; each (schema, strict)
    pair is converted once (cached in bytes, keyed without annotations). Raises
    SchemaError."""
    if not isinstance(schema, dict):
        raise SchemaError("a JSON schema must be an object")
    try:
        # Annotations never change the grammar: converted and cached without them.
        text = canonical_text(schema)
    except (ValueError, TypeError, RecursionError) as exc:
        raise SchemaError(f"the schema is not valid JSON: {exc}") from exc
    return _CACHE.get_or_make(schema_key(text, strict), lambda: _compile(text, strict))


def _compiled_size(compiled: CompiledSchema) -> int:
    return 256 + len(compiled.grammar) + sum(len(r) for r in compiled.relaxed)


# Converted schemas by digest, within CACHE_BYTES (a grammar is at most 512 KiB).
_CACHE = ByteBoundedCache(CACHE_BYTES, _compiled_size)


def grammar_cache_bytes() -> int:
    """Memory the grammar cache holds (for the memory account)."""
    return _CACHE.used_bytes


def grammar_for_schema(schema: Any, *, strict: bool = False) -> str:
    """GBNF for a JSON schema (see compile_schema)."""
    return compile_schema(schema, strict=strict).grammar


_CALL_ARGUMENTS = re.compile(r"#(?:/anyOf/(\d+))?/properties/arguments\b")


def name_tool_paths(message: str, call_schema: dict[str, Any]) -> str:
    """Paths into the schema of a tool call ({"name": const, "arguments": parameters},
    one per tool under anyOf) rewritten as paths into the named function's parameters."""

    def named(m: re.Match[str]) -> str:
        try:
            option = call_schema["anyOf"][int(m.group(1))] if m.group(1) else call_schema
            return f"{option['properties']['name']['const']}.parameters#"
        except (KeyError, IndexError, TypeError):
            return m.group(0)

    return _CALL_ARGUMENTS.sub(named, message)
