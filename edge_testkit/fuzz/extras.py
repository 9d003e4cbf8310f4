"""Fuzz cases for the routes beside generation: rerank (all four paths, Jina's/Cohere's
shape and TEI's), GET /slots with junk queries, and /tokenize with `with_pieces`.

The fuzz server's model is no reranker, so a well-formed rerank is refused as such: one
more validation path, which must answer a 4xx like every other.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import urlencode

from hypothesis import strategies as st

from edge_testkit.fuzz.bounds import TOKENIZE
from edge_testkit.fuzz.strategies import (
    BOOLEAN,
    HUGE_INTS,
    MODEL,
    SPECIAL_TEXT,
    Case,
    dumps,
    small_text,
    weird,
)

RERANK_PATHS = ("/v1/rerank", "/rerank", "/v1/reranking", "/reranking")
SLOTS = "/slots"

documents = st.lists(st.one_of(small_text, st.fixed_dictionaries({"text": small_text}),
                               weird), max_size=4)
top_n = st.one_of(st.integers(-1, 5), st.sampled_from(HUGE_INTS), weird)


@st.composite
def rerank_cases(draw: st.DrawFn) -> Case:
    body: dict[str, Any] = {"query": draw(small_text)}
    if draw(BOOLEAN):
        body["model"] = draw(st.one_of(st.just(MODEL), small_text))
    if draw(BOOLEAN):  # TEI's shape
        body["texts"] = draw(st.lists(small_text, max_size=4))
        optional = {"return_text": BOOLEAN}
    else:
        body["documents"] = draw(documents)
        optional = {"top_n": top_n, "return_documents": BOOLEAN}
    for name in draw(st.lists(st.sampled_from(sorted(optional)), max_size=2, unique=True)):
        body[name] = draw(optional[name])
    for _ in range(draw(st.integers(0, 2))):
        key = draw(st.sampled_from(sorted({*body, "documents", "texts", "top_n", "query"})))
        how = draw(st.sampled_from(["replace", "delete", "unknown"]))
        if how == "delete":
            body.pop(key, None)
        elif how == "unknown":
            body[draw(st.text(max_size=10))] = draw(weird)
        else:
            body[key] = draw(weird)
    path = draw(st.sampled_from(RERANK_PATHS))
    return Case(path, dumps(body).encode("utf-8", "surrogatepass"), "rerank")


@st.composite
def slots_cases(draw: st.DrawFn) -> Case:
    values = st.one_of(st.text(max_size=24),
                       st.sampled_from(["1", "true", "0", MODEL, "default", ""]))
    query = {name: draw(values).encode("utf-8", "replace") for name in draw(
        st.lists(st.sampled_from(["model", "fail_on_no_slot", "id_slot"]), max_size=2,
                 unique=True))}
    path = SLOTS + (f"?{urlencode(query)}" if query else "")
    return Case(path, b"", "slots", method="GET", route=SLOTS)


@st.composite
def pieces_cases(draw: st.DrawFn) -> Case:
    """/tokenize with `with_pieces`: special tokens, split UTF-8 and junk flags."""
    body: dict[str, Any] = {"model": MODEL, "with_pieces": draw(st.one_of(BOOLEAN, BOOLEAN,
                                                                         weird)),
                            "content": draw(st.one_of(small_text, st.sampled_from(SPECIAL_TEXT),
                                                      st.lists(st.integers(-1, 49152),
                                                               max_size=4)))}
    for name in draw(st.lists(st.sampled_from(["add_special", "parse_special"]), max_size=2,
                              unique=True)):
        body[name] = draw(st.one_of(BOOLEAN, weird))
    return Case(TOKENIZE, dumps(body).encode("utf-8", "surrogatepass"), "tokenize-pieces")


def extra_cases() -> st.SearchStrategy[Case]:
    return st.one_of(rerank_cases(), slots_cases(), pieces_cases())
