"""Whole fuzz cases beyond one door's mutated bodies: chat requests carrying generated
JSON schemas, bodies that are not (quite) JSON, and every kind at once (for
scripts/soak/fuzz.py)."""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st

from edge_testkit.fuzz.strategies import (
    CHAT,
    COMPLETIONS,
    EMBEDDINGS,
    ENDPOINTS,
    MESSAGES,
    MODEL,
    NATIVE,
    RESPONSES,
    Case,
    bodies,
    dumps,
    request_cases,
    schemas,
)


def schema_cases() -> st.SearchStrategy[Case]:
    """Chat requests whose response_format or forced tool carries a generated schema."""

    def build(schema: Any, as_tool: bool, strict: bool, stream: bool) -> Case:
        body: dict[str, Any] = {"model": MODEL, "max_tokens": 4, "stream": stream,
                                "messages": [{"role": "user", "content": "JSON please"}]}
        if as_tool:
            body["tools"] = [{"type": "function", "function": {"name": "f", "parameters": schema}}]
            body["tool_choice"] = "required"
        else:
            body["response_format"] = {"type": "json_schema", "json_schema": {
                "name": "out", "schema": schema, "strict": strict}}
        return Case(CHAT, dumps(body).encode("utf-8", "surrogatepass"), "schema")

    return st.builds(build, schemas, st.booleans(), st.booleans(), st.booleans())


@st.composite
def broken_json_cases(draw: st.DrawFn) -> Case:
    """Bodies that are not (quite) JSON objects."""
    path = draw(st.sampled_from(ENDPOINTS))
    valid = dumps(draw(bodies(path))).encode("utf-8", "surrogatepass")
    depth = draw(st.sampled_from([100, 1000, 5000, 100_000]))
    kind = draw(st.sampled_from(["truncated", "deep", "deep-field", "utf8", "garbage", "bignum"]))
    if kind == "truncated":
        body = valid[: draw(st.integers(0, max(0, len(valid) - 1)))]
    elif kind == "deep":
        body = draw(st.sampled_from([b"[" * depth + b"]" * depth,
                                     b'{"a":' * depth + b"1" + b"}" * depth, b"[" * depth]))
    elif kind == "deep-field":
        body = (f'{{"model":"{MODEL}","max_tokens":2,"prompt":'.encode()
                + b"[" * depth + b"1" + b"]" * depth + b"}")
    elif kind == "utf8":
        bad = draw(st.sampled_from([b"\xff", b"\xc3\x28", b"\xed\xa0\x80", b"\xf4\x90\x80\x80",
                                    b"\xe2\x82"]))
        body = (f'{{"model":"{MODEL}","max_tokens":2,"prompt":"a'.encode() + bad + b'b"}'
                if draw(st.booleans()) else b"\xef\xbb\xbf" + valid + bad)
    elif kind == "bignum":
        # seed takes any integer: the number's size is all that is tested
        body = (f'{{"model":"{MODEL}","prompt":"x","max_tokens":1,"seed":1'.encode()
                + b"0" * draw(st.sampled_from([30, 4299, 5000, 100_000])) + b"}")
    else:
        body = draw(st.sampled_from([b"", b"null", b"[]", b'"x"', b"{}", b"{", b"}", b"\x00",
                                     b" " * 10000, b'{"model":1,"model":2}', valid + b"garbage",
                                     valid.decode("utf-8", "replace").encode("utf-16")]))
    return Case(path, body, f"broken-{kind}")


def all_cases() -> st.SearchStrategy[Case]:
    return st.one_of(request_cases(COMPLETIONS), request_cases(CHAT), request_cases(RESPONSES),
                     request_cases(MESSAGES), request_cases(EMBEDDINGS),
                     request_cases(NATIVE), schema_cases(),
                     broken_json_cases())
