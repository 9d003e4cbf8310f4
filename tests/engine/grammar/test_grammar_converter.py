"""The schema-to-grammar converter's bounds checked directly, without the server: every
repetition count and the grammar's size stay within what llama.cpp parses safely."""

from __future__ import annotations

import contextlib
import json
import math
import re
import subprocess
import sys
from typing import Any

import pytest
from conftest import ROOT
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from edge_server.engine.grammar import limits as limits
from edge_server.engine.grammar.json_grammar import compile_schema, grammar_for_schema
from edge_server.engine.grammar.limits import SchemaError, check_grammar

STRING, INTEGERS = {"type": "string"}, {"type": "array", "items": {"type": "integer"}}


def wrap(value: dict[str, Any]) -> dict[str, Any]:
    return {"type": "object", "properties": {"v": value}, "required": ["v"]}


_QUANTIFIER = re.compile(r"\{(\d+)(,(\d*))?\}")
_LITERALS = re.compile(r'"(?:[^"\\]|\\.)*"|\[(?:[^\]\\]|\\.)*\]')


def assert_bounded(grammar: str) -> None:
    """Every {n,m} outside literals and character classes has n <= m <= the limit."""
    assert len(grammar) <= limits.MAX_GRAMMAR_CHARS
    for m in _QUANTIFIER.finditer(_LITERALS.sub('""', grammar)):
        lo = int(m.group(1))
        hi = lo if m.group(2) is None else (int(m.group(3)) if m.group(3) else None)
        assert lo <= limits.MAX_GBNF_REPEAT, m.group(0)
        assert hi is None or lo <= hi <= limits.MAX_GBNF_REPEAT, m.group(0)
    depth = deepest = 0
    for c in _LITERALS.sub('""', grammar):
        depth += (c == "(") - (c == ")")
        deepest = max(deepest, depth)
    assert deepest <= limits.MAX_GROUP_NESTING


L = limits
AT_LIMIT = {
    "string": {"type": "string", "minLength": 3, "maxLength": L.MAX_STRING_LENGTH},
    "string_exact": {"type": "string", "minLength": L.MAX_STRING_LENGTH, "maxLength": 16384},
    "array": {**INTEGERS, "minItems": L.MAX_ARRAY_ITEMS - 1, "maxItems": L.MAX_ARRAY_ITEMS},
    "pattern": {"type": "string", "pattern": f"^[a-z]{{0,{L.MAX_PATTERN_REPEAT}}}$"},
    "pattern_nested": {"type": "string", "pattern": "^([0-9]{1,10}[.]){1,100}$"},
    "integer": {"type": "integer", "minimum": -L.MAX_NUMERIC_BOUND, "maximum": 10**15 - 1},
    "number": {"type": "number", "exclusiveMinimum": L.MAX_NUMERIC_BOUND},
    "enum": {"enum": [f"v{i}" for i in range(L.MAX_ENUM_VALUES)]},
    "properties": {
        "type": "object",
        "properties": {f"p{i}": {"type": "string", "maxLength": 16384} for i in range(256)},
    },
}


@pytest.mark.parametrize("name", sorted(AT_LIMIT))
def test_schemas_at_the_limits_compile_to_bounded_grammars(name: str) -> None:
    assert_bounded(grammar_for_schema(AT_LIMIT[name], strict=True))


OVER_LIMIT = [
    ({"type": "string", "maxLength": limits.MAX_STRING_LENGTH + 1}, "maxLength"),
    ({"type": "string", "minLength": limits.MAX_STRING_LENGTH + 1}, "minLength"),
    ({"type": "array", "maxItems": limits.MAX_ARRAY_ITEMS + 1}, "maxItems"),
    ({"type": "array", "minItems": limits.MAX_ARRAY_ITEMS + 1}, "minItems"),
    ({"type": "string", "pattern": f"^a{{{limits.MAX_PATTERN_REPEAT + 1}}}$"}, "pattern"),
    ({"type": "string", "pattern": "^(a{1,100}){1,11}$"}, "pattern"),
    ({"type": "string", "pattern": "^" + "(" * 101 + "a" + ")" * 101 + "$"}, "pattern"),
    ({"type": "integer", "maximum": -(10**15)}, "maximum"),
    ({"type": "number", "exclusiveMaximum": 1e300}, "exclusiveMaximum"),
]


@pytest.mark.parametrize(("schema", "keyword"), OVER_LIMIT)
def test_over_limit_names_keyword_and_limit_strict_or_not(schema: dict[str, Any],
                                                          keyword: str) -> None:
    for strict in (True, False):
        with pytest.raises(SchemaError, match=keyword):
            compile_schema(wrap(schema), strict=strict)


ALWAYS_REFUSED = [
    *({"type": "object", key: value} for key, value in [("properties", ["a"]), ("required", "a")]),
    *({"type": "number", key: value} for key, value in [("minimum", "5"), ("maximum", math.nan)]),
    *({"type": "string", "maxLength": n} for n in (-1, 1.5, True)),
    {"type": "string", "minLength": 5, "maxLength": 2},
    {"const": math.inf},
    {"type": "array", "items": 3},
    *({"$ref": ref} for ref in ("#/$defs/nowhere", "https://example.com/s.json", "#", 5)),
    {"$ref": "#/properties/a/maxLength", "properties": {"a": {"maxLength": 3}}},
    {"type": "object", "default": {"$ref": 5}},
    *({"type": t} for t in ("strnig", [], [["string"]])),
    {"anyOf": []},
    {"allOf": [3]},
    {"enum": "abc"},
    {"type": "object", "properties": {"a": False}},
    {"type": "object", "properties": {f"p{i}": {} for i in range(L.MAX_PROPERTIES + 1)}},
    {"enum": list(range(L.MAX_ENUM_VALUES + 1))},
    {"anyOf": [{"type": "integer"}] * (L.MAX_ALTERNATIVES + 1)},
    {"type": "string", "pattern": 5},
]


@pytest.mark.parametrize("schema", ALWAYS_REFUSED, ids=lambda s: json.dumps(s)[:40])
@pytest.mark.parametrize("strict", [True, False])
def test_malformed_or_oversized_schema_is_a_schema_error(schema: Any, strict: bool) -> None:
    with pytest.raises(SchemaError):
        compile_schema(schema, strict=strict)


def test_deep_nesting_is_refused() -> None:
    schema: dict[str, Any] = {"type": "integer"}
    for _ in range(limits.MAX_SCHEMA_DEPTH + 1):
        schema = {"type": "array", "items": schema}
    with pytest.raises(SchemaError, match="deep"):
        compile_schema(schema, strict=False)
    document: Any = 1
    for _ in range(limits.MAX_DOCUMENT_DEPTH + 1):
        document = [document]
    with pytest.raises(SchemaError, match="deep"):
        compile_schema({"type": "integer", "default": document}, strict=False)


@pytest.mark.parametrize(
    ("pattern", "why"),
    [
        ("^(a?){0,10}$", "empty"),
        ("^(a|){2}$", "empty"),
        ("^(a*)+$", "empty"),
        ("^(a{0,3}){2}$", "empty"),
        ("^*$", "nothing"),
        ("^a{3,1}$", "below"),
        ("abc", "anchored"),
        ("^(?=a)b$", "(?"),
    ],
)
def test_pattern_that_cannot_be_enforced_is_ignored_unless_strict(pattern: str, why: str) -> None:
    with pytest.raises(SchemaError, match=re.escape(why)):
        compile_schema({"type": "string", "pattern": pattern}, strict=True)
    compiled = compile_schema({"type": "string", "pattern": pattern}, strict=False)
    assert compiled.relaxed and "char*" in compiled.grammar


@pytest.mark.parametrize(
    "gbnf",
    [
        "root ::= [0-9]{16,15}",
        'root ::= "a"{0,5000}',
        'root ::= "a"{5000}',
        "root ::= " + "(" * (limits.MAX_GROUP_NESTING + 1) + '"a"' + ")" * limits.MAX_GROUP_NESTING,
        'root ::= "' + "a" * limits.MAX_GRAMMAR_CHARS + '"',
        'root ::= ("a"{0,100}){0,100}',
    ],
    ids=["reversed", "huge_max", "huge_min", "nesting", "size", "nested_repeats"],
)
def test_final_check_refuses_dangerous_gbnf(gbnf: str) -> None:
    with pytest.raises(SchemaError):
        check_grammar(gbnf)


# Generated schemas with random (often huge) counts: the result is a bounded grammar or
# a SchemaError, never anything else.

counts = st.one_of(
    st.integers(0, 20),
    st.integers(0, 10**9),
    st.sampled_from([999, 1000, 1001, 2000, 2001, 4096, 4097, 16384, 16385]),
)
bounds = st.one_of(
    st.integers(-(10**20), 10**20),
    st.floats(allow_nan=False, allow_infinity=False),
    st.sampled_from([10**15 - 1, 10**15, -(10**15), 1e15, 999999999999999.5]),
)
quantifiers = st.one_of(
    st.sampled_from(["", "*", "+", "?"]),
    counts.map(lambda n: f"{{{n}}}"),
    counts.map(lambda n: f"{{{n},}}"),
    st.tuples(counts, counts).map(lambda t: f"{{{min(t)},{max(t)}}}"),
)
atoms = st.sampled_from(["a", "[0-9]", "(ab)", ".", "x?", "\\d", '"', "[^a-c]"])
pieces = st.lists(st.tuples(atoms, quantifiers).map("".join), min_size=1, max_size=4)
patterns = st.recursive(
    pieces.map("".join),
    lambda inner: st.tuples(inner, quantifiers).map(lambda t: f"({t[0]}){t[1]}"),
    max_leaves=4,
).map(lambda p: f"^{p}$")


def optional(**fields: st.SearchStrategy[Any]) -> st.SearchStrategy[dict[str, Any]]:
    return st.fixed_dictionaries({}, optional=fields)


leaves = st.one_of(
    st.tuples(st.just({"type": "string"}), optional(minLength=counts, maxLength=counts)),
    st.tuples(st.just({"type": "string"}), optional(pattern=patterns, maxLength=counts)),
    st.tuples(
        st.sampled_from([{"type": "integer"}, {"type": "number"}]),
        optional(minimum=bounds, maximum=bounds, exclusiveMinimum=bounds),
    ),
).map(lambda t: {**t[0], **t[1]})
schemas = st.recursive(
    leaves,
    lambda inner: st.one_of(
        st.tuples(inner, optional(minItems=counts, maxItems=counts)).map(
            lambda t: {"type": "array", "items": t[0], **t[1]}
        ),
        st.lists(inner, min_size=1, max_size=4).map(
            lambda subs: {"type": "object", "properties": {f"p{i}": s for i, s in enumerate(subs)}}
        ),
        st.lists(inner, min_size=1, max_size=3).map(lambda subs: {"anyOf": subs}),
        st.lists(inner, min_size=1, max_size=3).map(lambda subs: {"prefixItems": subs}),
    ),
    max_leaves=8,
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(schema=schemas, strict=st.booleans())
def test_generated_schemas_give_bounded_grammars(schema: dict[str, Any], strict: bool) -> None:
    try:
        grammar = grammar_for_schema(schema, strict=strict)
    except SchemaError:
        return
    assert_bounded(grammar)


@settings(max_examples=200, deadline=None)
@given(pattern=patterns)
def test_generated_patterns_are_relaxed_or_refused_at_a_limit(pattern: str) -> None:
    """Not strict: an unenforceable pattern is ignored; one past a size limit refused."""
    try:
        compiled = compile_schema({"type": "string", "pattern": pattern}, strict=False)
    except SchemaError as exc:
        assert "over the limit" in str(exc)
        return
    assert_bounded(compiled.grammar)


keywords = st.sampled_from(
    [
        "type", "properties", "required", "items", "prefixItems", "additionalProperties", "anyOf",
        "allOf", "enum", "const", "$ref", "$defs", "minLength", "maxLength", "minItems", "maxItems",
        "minimum", "maximum", "exclusiveMinimum", "pattern", "format",
    ]
)
json_scalars = st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=4)
json_scalars |= st.sampled_from(["string", "integer", "array", "#/$defs/a", "#/a", "^a{3}$"])
json_values = st.recursive(
    json_scalars,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(keywords, inner, max_size=4),
    max_leaves=20,
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(schema=st.dictionaries(keywords, json_values, max_size=5), strict=st.booleans())
def test_any_json_gives_a_grammar_or_a_schema_error(schema: dict[str, Any], strict: bool) -> None:
    with contextlib.suppress(SchemaError):  # anything else raised would be a 500
        compile_schema(schema, strict=strict)


# llama.cpp itself, in a child process (a crash must not take the test run with it),
# parsing the largest grammars the limits allow on a thread with an 8 MiB stack.
_PARSE = """
import ctypes, json, sys, threading
import llama_cpp as lc
from edge_server.catalogue.default_model import default_model_path
quiet = lc.llama_log_callback(lambda level, text, data: None)
lc.llama_log_set(quiet, ctypes.c_void_p())
params = lc.llama_model_default_params()
params.vocab_only = True
model = lc.llama_model_load_from_file(str(default_model_path()).encode(), params)
vocab = lc.llama_model_get_vocab(model)
grammars = json.load(sys.stdin)
results = {}
def parse():
    for name, gbnf in grammars.items():
        results[name] = bool(lc.llama_sampler_init_grammar(vocab, gbnf.encode(), b"root"))
threading.stack_size(8 * 1024 * 1024)
thread = threading.Thread(target=parse)
thread.start()
thread.join()
print(json.dumps(results))
"""


PATTERNS = [
    "^\\d{3}-\\d{4}$",
    "^[\\w.-]+@[\\w-]+\\.[a-z]{2,}$",
    '^a"b\\\\c\\.d\\n\\x41\\u00e9$',
    "^.{0,10}[^a-c\\]]+[ -~]*$",
    "^(\\+\\d{1,3} )?\\(\\d{3}\\)\\s\\S*\\D?\\W?$",
]


@pytest.mark.parametrize("pattern", PATTERNS)
def test_pattern_escapes_become_grammar_llama_cpp_reads(pattern: str) -> None:
    # The converter alone copies \d or \. into GBNF, where llama.cpp refuses them.
    grammar = grammar_for_schema({"type": "string", "pattern": pattern}, strict=True)
    for part in _LITERALS.findall(grammar):
        assert set(re.findall(r"\\(.)", part)) <= set('xuUtrn\\"[]'), part


def test_llama_cpp_parses_grammars_at_the_limits_on_a_small_stack() -> None:
    grammars = {name: grammar_for_schema(s, strict=True) for name, s in AT_LIMIT.items()}
    for i, pattern in enumerate(PATTERNS):
        grammars[f"pattern{i}"] = grammar_for_schema({"type": "string", "pattern": pattern})
    done = subprocess.run(
        [sys.executable, "-c", _PARSE],
        input=json.dumps(grammars),
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert json.loads(done.stdout.strip().splitlines()[-1]) == dict.fromkeys(grammars, True)
