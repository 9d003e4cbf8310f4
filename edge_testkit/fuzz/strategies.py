"""Mutated requests for fuzzing the server over HTTP, shared by tests/fuzz/test_fuzz.py and
scripts/soak/fuzz.py, and `judge()`: the one place that says which answers are failures.

A case is raw bytes, not a dict, so that bodies no Python object serialises to (numbers
like 1e400, NaN, lone surrogates, truncated or deeply nested JSON, invalid UTF-8) reach
the server exactly as a hostile client would send them.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from functools import cache
from typing import Any

from hypothesis import strategies as st

from edge_testkit.fuzz.schemas import (
    FORMATS,
    HOSTILE_SCHEMAS,
    KEYWORDS,
    META_SUBSET,
    PATTERNS,
    REFS,
)

MODEL = "smollm2-135m-instruct"
COMPLETIONS = "/v1/completions"
CHAT = "/v1/chat/completions"
RESPONSES = "/v1/responses"
MESSAGES = "/v1/messages"
EMBEDDINGS = "/v1/embeddings"
NATIVE = "/completion"  # llama-server's native completion
ENDPOINTS = (COMPLETIONS, CHAT, RESPONSES, MESSAGES, EMBEDDINGS, NATIVE)
TIMEOUT_S = 20.0  # every answer, streams included, must be complete within this (the
# longest legitimate answer, a 256-token slot generated on one thread, takes about 12 s)


@dataclass(frozen=True)
class Raw:
    """JSON text written as is."""

    text: str

    def __repr__(self) -> str:
        return f"Raw({self.text[:20]!r}{'...' if len(self.text) > 20 else ''})"


@dataclass(frozen=True)
class Case:
    path: str
    body: bytes
    kind: str  # which generator made it, for the figures
    method: str = "POST"
    route: str = ""  # the route's pattern where the path holds an id ("": the path)

    @property
    def label(self) -> str:
        """The route as the figures count it and the judge reads it."""
        route = self.route or self.path
        return route if self.method == "POST" else f"{self.method} {route}"

    def excerpt(self, limit: int = 600) -> str:
        return repr(self.body[:limit]) + (f" ... ({len(self.body)} bytes)"
                                          if len(self.body) > limit else "")

    def __repr__(self) -> str:
        return f"Case({self.path!r}, {self.excerpt()}, {self.kind!r})"


def dumps(value: Any) -> str:
    """JSON text of `value`; Raw nodes go in verbatim, NaN and infinities as Python's json
    module reads them."""
    if isinstance(value, Raw):
        return value.text
    if isinstance(value, float) and not math.isfinite(value):
        return "NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity")
    if isinstance(value, dict):
        return "{" + ",".join(f"{json.dumps(str(k))}:{dumps(v)}" for k, v in value.items()) + "}"
    if isinstance(value, list | tuple):
        return "[" + ",".join(dumps(v) for v in value) + "]"
    return json.dumps(value)


# --- values ---------------------------------------------------------------------------

HUGE_INTS = [2**31 - 1, 2**31, 2**32, 2**53 + 1, 2**63 - 1, 2**63, -(2**63), -(2**63) - 1,
             2**64, 10**30, -1, 0]
RAW_NUMBERS = [Raw(t) for t in ("1e400", "-1e400", "NaN", "Infinity", "-Infinity", "1e308",
                                "-0.0", "5e-324", "1" + "0" * 5000, "0.1e-400", "1E+2")]
RAW_STRINGS = [Raw(t) for t in ('"\\ud800"', '"a\\udfffb"', '"\\u0000"', '"\\ud83d"')]
SPECIAL_TEXT = ["<|im_start|>", "<|im_end|>", "<|endoftext|>", "<think>", "</think>",
                "<tool_call>", "{{ raise_exception('x') }}", "{% for %}", "\x00", "\u202e",
                "\ufffd", "🦙" * 3]

small_text = st.one_of(st.text(max_size=24), st.sampled_from(SPECIAL_TEXT),
                       st.sampled_from([300, 3000, 100_000]).map(lambda n: "ab " * n))
scalars = st.one_of(
    st.none(), st.booleans(), st.integers(-5, 5), st.sampled_from(HUGE_INTS),
    st.floats(allow_nan=True, allow_infinity=True), st.sampled_from(RAW_NUMBERS),
    st.sampled_from(RAW_STRINGS), small_text,
)
weird = st.recursive(
    scalars,
    lambda kids: st.lists(kids, max_size=3)
    | st.dictionaries(st.text(max_size=6), kids, max_size=3),
    max_leaves=6,
)


counts = st.one_of(st.integers(0, 5), st.sampled_from([64, 128, 129, 10**6, 2**31, 2**63]))
bounds = st.one_of(st.integers(-10, 10), st.floats(-1e6, 1e6),
                   st.sampled_from([2**63, -(2**63), 1e308, -1e308, 0.5, *RAW_NUMBERS[:3]]))
valid_ids = st.integers(0, 49151)
token_ids = st.one_of(valid_ids, valid_ids, valid_ids,
                      st.sampled_from([-1, 49152, 99999999, 2**31, 2**63]))

# --- JSON schemas (keyword values, hostile shapes: edge_testkit.fuzz.schemas) --------------


@cache
def meta_leaves() -> st.SearchStrategy[dict[str, Any]]:
    from hypothesis_jsonschema import from_schema

    # Keyword by keyword: hypothesis-jsonschema's object generator does not work with
    # every hypothesis release, its scalar and array generators do.
    return st.fixed_dictionaries({}, optional={
        key: from_schema(sub) for key, sub in META_SUBSET["properties"].items()})


def _leaf_schemas() -> st.SearchStrategy[Any]:
    string = st.fixed_dictionaries({"type": st.just("string")}, optional={
        "minLength": counts, "maxLength": counts, "pattern": st.sampled_from(PATTERNS),
        "format": st.sampled_from(FORMATS)})
    number = st.fixed_dictionaries({"type": st.sampled_from(["integer", "number"])}, optional={
        "minimum": bounds, "maximum": bounds, "exclusiveMinimum": bounds,
        "exclusiveMaximum": bounds})
    return st.one_of(
        string, number, st.fixed_dictionaries({"type": st.sampled_from(["boolean", "null"])}),
        st.builds(lambda v: {"enum": v}, st.lists(scalars, max_size=4)),
        st.builds(lambda v: {"const": v}, weird),
        st.builds(lambda r: {"$ref": r}, st.sampled_from(REFS)),
        st.builds(lambda k, v: {k: v}, st.sampled_from(KEYWORDS), weird),
        st.just({}), st.booleans(), meta_leaves(), weird,
    )


def _extend(kids: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    names = st.text(max_size=8)
    obj = st.fixed_dictionaries({"type": st.just("object")}, optional={
        "properties": st.dictionaries(names, kids, max_size=4),
        "required": st.lists(names, max_size=3),
        "additionalProperties": st.one_of(st.booleans(), kids)})
    arr = st.fixed_dictionaries({"type": st.just("array")}, optional={
        "items": kids, "prefixItems": st.lists(kids, max_size=3), "minItems": counts,
        "maxItems": counts})
    return st.one_of(
        obj, arr,
        st.builds(lambda k, v: {k: v}, st.sampled_from(["anyOf", "oneOf", "allOf"]),
                  st.lists(kids, max_size=3)),
        st.builds(lambda d, r: {"$defs": {"a": d}, "$ref": r}, kids, st.sampled_from(REFS)),
        st.builds(lambda t, s: {**s, "type": t} if isinstance(s, dict) else s,
                  st.lists(st.sampled_from(["string", "integer", "null", "array"]), max_size=3),
                  kids),
    )


schemas = st.one_of(st.recursive(_leaf_schemas(), _extend, max_leaves=6),
                    st.integers(0, len(HOSTILE_SCHEMAS) - 1).map(HOSTILE_SCHEMAS.__getitem__))

# --- request fields ---------------------------------------------------------------------
# A body starts valid, or nearly (field values a client might plausibly send), and then
# takes a few mutations: a field replaced by a hostile value, deleted, or an unknown one.

stops = st.one_of(small_text, st.lists(small_text, max_size=4))
logit_bias = st.dictionaries(valid_ids.map(str), st.floats(-100, 100), max_size=4)
prompts = st.one_of(small_text, st.lists(small_text, min_size=1, max_size=3),
                    st.lists(valid_ids, min_size=1, max_size=8),
                    st.lists(st.lists(valid_ids, min_size=1, max_size=4), min_size=1,
                             max_size=3))
part_types = st.sampled_from(["text", "image_url", "video_url", "input_audio", "file", "x"])
content_parts = st.fixed_dictionaries({"type": part_types}, optional={
    "text": small_text, "image_url": st.fixed_dictionaries({"url": small_text}),
    "input_audio": weird})
tool_calls = st.lists(st.fixed_dictionaries({
    "id": small_text, "type": st.just("function"),
    "function": st.fixed_dictionaries({"name": small_text, "arguments": st.one_of(
        schemas.map(dumps), small_text)})}), max_size=2)
roles = st.sampled_from(["system", "developer", "user", "assistant", "tool"])
message = st.fixed_dictionaries({
    "role": roles,
    "content": st.one_of(small_text, small_text, st.lists(content_parts, max_size=3))},
    optional={"name": st.sampled_from(["Alice", "a_b-9", "bad name!", ""]),
              "tool_calls": tool_calls, "tool_call_id": small_text})
function_names = st.one_of(st.sampled_from(["f", "get_weather", "a-b_1"]), small_text)
tools = st.lists(st.fixed_dictionaries({
    "type": st.just("function"),
    "function": st.fixed_dictionaries({"name": function_names}, optional={
        "description": small_text, "parameters": schemas, "strict": st.booleans()})}),
    min_size=1, max_size=3)
tool_choices = st.one_of(
    st.sampled_from(["none", "auto", "required"]),
    st.fixed_dictionaries({"type": st.just("function"),
                           "function": st.fixed_dictionaries({"name": function_names})}))
response_formats = st.one_of(
    st.fixed_dictionaries({"type": st.sampled_from(["text", "json_object"])}),
    st.fixed_dictionaries({"type": st.just("json_object"), "schema": schemas}),
    st.fixed_dictionaries({"type": st.just("json_schema"), "json_schema": st.fixed_dictionaries(
        {"name": st.just("out"), "schema": schemas}, optional={"strict": st.booleans()})}))

BOOLEAN = st.booleans()
COMMON_FIELDS: dict[str, st.SearchStrategy[Any]] = {
    **dict.fromkeys(["stream", "include_stop_str_in_output", "ignore_eos"], BOOLEAN),
    **dict.fromkeys(["frequency_penalty", "presence_penalty"], st.floats(-2, 2)),
    "stream_options": st.fixed_dictionaries({"include_usage": BOOLEAN}),
    "n": st.integers(1, 3), "seed": st.integers(-(2**64), 2**64),
    "temperature": st.floats(0, 2), "top_p": st.floats(0.01, 1), "top_k": st.integers(1, 100),
    "min_p": st.floats(0, 1), "repetition_penalty": st.floats(0.1, 1.9),
    "mirostat_target": st.floats(0.01, 10), "mirostat_lr": st.floats(0.01, 1),
    "logit_bias": logit_bias, "stop": stops, "user": small_text,
    "context_length_exceeded_behavior": st.sampled_from(["truncate", "error"]),
}
COMPLETION_FIELDS: dict[str, st.SearchStrategy[Any]] = {
    **COMMON_FIELDS, "echo": BOOLEAN, "logprobs": st.integers(0, 5),
    "best_of": st.integers(1, 4)}
CHAT_FIELDS: dict[str, st.SearchStrategy[Any]] = {
    **COMMON_FIELDS,
    **dict.fromkeys(["logprobs", "parallel_tool_calls", "separate_reasoning",
                     "enable_thinking"], BOOLEAN),
    "top_logprobs": st.integers(0, 20), "tools": tools, "tool_choice": tool_choices,
    "response_format": response_formats,
    "prediction": st.fixed_dictionaries({"type": st.sampled_from(["content", "x"]), "content":
                                         st.one_of(small_text, st.lists(content_parts))}),
    "chat_template_kwargs": st.dictionaries(st.one_of(small_text, st.sampled_from(
        ["enable_thinking", "messages", "tools", "note"])), weird, max_size=4),
    "reasoning_effort": st.sampled_from(["none", "low", "xhigh", "x"])}
NATIVE_FIELDS: dict[str, st.SearchStrategy[Any]] = {
    **COMMON_FIELDS, "n_predict": st.integers(-2, 4), "n_probs": st.integers(0, 21),
    "return_tokens": BOOLEAN, "top_k": st.integers(-2, 50)}
input_parts = st.fixed_dictionaries(
    {"type": st.sampled_from(["input_text", "output_text", "input_image", "input_file", "x"])},
    optional={"text": small_text, "image_url": small_text})
input_items = st.one_of(
    st.fixed_dictionaries({"role": st.sampled_from(["user", "system", "developer", "assistant",
                                                    "tool"]),
                           "content": st.one_of(small_text, st.lists(input_parts, max_size=3))},
                          optional={"type": st.just("message")}),
    st.fixed_dictionaries({"type": st.just("function_call"), "call_id": small_text,
                           "name": function_names, "arguments": small_text}),
    st.fixed_dictionaries({"type": st.just("function_call_output"), "call_id": small_text,
                           "output": st.one_of(small_text, st.lists(input_parts, max_size=2))}),
    st.fixed_dictionaries({"type": st.sampled_from(["reasoning", "item_reference", "x"])}))
response_tools = st.lists(st.fixed_dictionaries(
    {"type": st.sampled_from(["function", "function", "web_search"]), "name": function_names},
    optional={"description": small_text, "parameters": schemas, "strict": st.booleans()}),
    min_size=1, max_size=3)
text_formats = st.one_of(
    st.fixed_dictionaries({"type": st.sampled_from(["text", "json_object"])}),
    st.fixed_dictionaries({"type": st.just("json_schema"), "name": st.just("out"),
                           "schema": schemas}, optional={"strict": st.booleans()}))
RESPONSES_FIELDS: dict[str, st.SearchStrategy[Any]] = {
    **dict.fromkeys(["stream", "parallel_tool_calls", "store"], BOOLEAN),
    "temperature": st.floats(0, 2), "top_p": st.floats(0.01, 1), "user": small_text,
    "instructions": small_text, "tools": response_tools,
    "tool_choice": st.one_of(st.sampled_from(["none", "auto", "required"]),
                             st.fixed_dictionaries({"type": st.just("function"),
                                                    "name": function_names})),
    "text": st.fixed_dictionaries({"format": text_formats}),
    "metadata": st.dictionaries(small_text, small_text, max_size=3),
    "reasoning": st.fixed_dictionaries({"effort": st.sampled_from(["none", "low", "high"])}),
    "include": st.lists(small_text, max_size=2), "previous_response_id": small_text}
anthropic_blocks = st.fixed_dictionaries(
    {"type": st.sampled_from(["text", "image", "tool_use", "tool_result", "thinking", "x"])},
    optional={"text": small_text, "id": small_text, "name": function_names,
              "input": st.just({"a": 1}), "tool_use_id": small_text, "content": small_text,
              "is_error": BOOLEAN, "cache_control": st.just({"type": "ephemeral"})})
anthropic_messages = st.lists(st.fixed_dictionaries(
    {"role": st.sampled_from(["user", "assistant", "system"]),
     "content": st.one_of(small_text, st.lists(anthropic_blocks, max_size=3))}),
    min_size=1, max_size=4)
MESSAGES_FIELDS: dict[str, st.SearchStrategy[Any]] = {
    "stream": BOOLEAN, "temperature": st.floats(0, 1), "top_p": st.floats(0.01, 1),
    "top_k": st.integers(1, 100), "stop_sequences": st.lists(small_text, max_size=5),
    "system": st.one_of(small_text, st.lists(st.fixed_dictionaries(
        {"type": st.just("text"), "text": small_text}), max_size=2)),
    "tools": st.lists(st.fixed_dictionaries(
        {"name": function_names, "input_schema": schemas},
        optional={"description": small_text, "type": st.sampled_from(["custom", "bash_1"])}),
        min_size=1, max_size=3),
    "tool_choice": st.fixed_dictionaries(
        {"type": st.sampled_from(["auto", "any", "tool", "none", "x"])},
        optional={"name": function_names, "disable_parallel_tool_use": BOOLEAN}),
    "thinking": st.fixed_dictionaries(
        {"type": st.sampled_from(["enabled", "adaptive", "disabled"])},
        optional={"budget_tokens": st.integers(0, 5000)}),
    "metadata": st.fixed_dictionaries({}, optional={"user_id": small_text}),
    "output_config": st.fixed_dictionaries({"format": st.fixed_dictionaries(
        {"type": st.just("json_schema"), "schema": schemas})})}
EMBEDDING_FIELDS: dict[str, st.SearchStrategy[Any]] = {
    "encoding_format": st.sampled_from(["float", "base64", "x"]),
    "dimensions": st.sampled_from([0, 1, 576, 577, 2**63]), "user": small_text}
# Hostile values for particular fields; every field also gets `weird` ones.
MUTANTS: dict[str, st.SearchStrategy[Any]] = {
    "model": st.one_of(st.just("default"), small_text),
    "max_tokens": st.sampled_from([0, -1, 5, 1.5, "4", *HUGE_INTS, *RAW_NUMBERS]),
    "prompt": st.one_of(st.lists(token_ids, max_size=8), st.lists(st.lists(token_ids)),
                        st.just([7] * 5000), st.just(""), st.just([])),
    "messages": st.one_of(st.just([]), st.lists(st.fixed_dictionaries(
        {"role": weird}, optional={"content": weird, "tool_calls": weird}), max_size=2)),
    "logit_bias": st.dictionaries(
        st.one_of(token_ids.map(str), small_text, st.sampled_from(
            ["1e3", " 5", "٣", "-0", "+7", "00012"])),
        st.one_of(st.sampled_from([-101, 101, *RAW_NUMBERS[:5]]), weird), max_size=4),
    "stop": st.lists(small_text, min_size=5, max_size=6),
    "n": counts,
    "best_of": counts,
    "logprobs": st.sampled_from([-1, 6, 21, 2**63, True]),
    "top_logprobs": st.sampled_from([-1, 21, 2**63]),
    "suffix": small_text,
    "images": st.lists(small_text, max_size=2),
    "max_completion_tokens": st.sampled_from([0, 5, *HUGE_INTS]),
    "max_output_tokens": st.sampled_from([0, -1, 5, 1.5, *HUGE_INTS, *RAW_NUMBERS]),
    "input": st.one_of(st.just([]), st.just(""), st.lists(st.fixed_dictionaries(
        {"type": weird}, optional={"role": weird, "content": weird}), max_size=2)),
    "tool_choice": st.one_of(st.just("any"), st.fixed_dictionaries({"function": weird})),
}


@st.composite
def bodies(draw: st.DrawFn, path: str) -> dict[str, Any]:
    fields = {COMPLETIONS: COMPLETION_FIELDS, CHAT: CHAT_FIELDS,
              RESPONSES: RESPONSES_FIELDS, MESSAGES: MESSAGES_FIELDS,
              EMBEDDINGS: EMBEDDING_FIELDS, NATIVE: NATIVE_FIELDS}[path]
    body: dict[str, Any] = {"model": MODEL, "max_tokens": draw(st.integers(1, 4))}
    if path == EMBEDDINGS:
        del body["max_tokens"]
        body["input"] = draw(st.one_of(small_text, st.lists(small_text, max_size=4),
                                       st.lists(token_ids, max_size=8),
                                       st.lists(st.lists(token_ids, max_size=8), max_size=3)))
    elif path in (COMPLETIONS, NATIVE):
        body["prompt"] = draw(prompts)
    elif path == RESPONSES:
        body["max_output_tokens"] = body.pop("max_tokens")
        body["input"] = draw(st.one_of(small_text, st.lists(input_items, min_size=1,
                                                             max_size=4)))
    elif path == MESSAGES:
        body["messages"] = draw(anthropic_messages)
    else:
        body["messages"] = draw(st.lists(message, min_size=1, max_size=4))
    for name in draw(st.lists(st.sampled_from(sorted(fields)), max_size=5, unique=True)):
        body[name] = draw(fields[name])
    keys = sorted({*body, *fields, *MUTANTS})
    for _ in range(draw(st.integers(0, 3))):
        how = draw(st.sampled_from(["replace", "replace", "replace", "delete", "unknown"]))
        key = draw(st.sampled_from(keys))
        if how == "delete":
            body.pop(key, None)
        elif how == "unknown":
            body[draw(st.text(max_size=10))] = draw(weird)
        else:
            body[key] = draw(st.one_of(MUTANTS.get(key, weird), weird))
    return body


def request_cases(path: str) -> st.SearchStrategy[Case]:
    return bodies(path).map(lambda b: Case(path, dumps(b).encode("utf-8", "surrogatepass"),
                                            "mutated"))
