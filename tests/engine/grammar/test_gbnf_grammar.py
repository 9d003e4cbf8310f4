"""`grammar` (GBNF text, as llama-server takes it) on completions and chat: outputs follow
it; text llama.cpp would refuse, and hostile text (deep nesting, huge repetition counts)
is a 400 naming `grammar`, never a crash; a fuzz campaign keeps it so."""

from __future__ import annotations

import re

import pytest
from conftest import DEFAULT_MODEL
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

DIGITS = 'root ::= [1-9] [0-9]{0,3} ("," [1-9] [0-9]{0,3})*'
MSG = [{"role": "user", "content": "Some numbers please."}]


def complete(http, grammar: str, **extra):  # type: ignore[no-untyped-def]
    return http.post("/v1/completions", json={
        "model": DEFAULT_MODEL, "prompt": "Numbers:", "max_tokens": 12, "grammar": grammar,
        **extra})


def test_completion_output_follows_the_grammar(http) -> None:
    r = complete(http, DIGITS, n=3, seed=1)
    assert r.status_code == 200, r.text
    for choice in r.json()["choices"]:
        text = choice["text"]
        # Cut by max_tokens the text is a prefix of a sentence of the grammar.
        assert re.fullmatch(r"([1-9][0-9]{0,3},)*([1-9][0-9]{0,3})?", text), text


def test_chat_output_follows_the_grammar_and_stops_when_complete(http) -> None:
    r = http.post("/v1/chat/completions", json={
        "messages": MSG, "max_tokens": 40, "grammar": 'root ::= ("yes" | "no") "."'})
    assert r.status_code == 200, r.text
    choice = r.json()["choices"][0]
    assert choice["message"]["content"] in ("yes.", "no.")
    assert choice["finish_reason"] == "stop"


def test_json_schema_field_is_a_grammar_too(http) -> None:
    schema = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}
    r = http.post("/v1/completions", json={"prompt": "JSON:", "max_tokens": 30, "temperature": 0,
                                           "json_schema": schema})
    assert r.status_code == 200, r.text
    text = r.json()["choices"][0]["text"]
    assert text.startswith("{")


@pytest.mark.parametrize("grammar", [
    "root ::= foo",  # an undefined rule
    "root ::= [a-",  # unterminated character class
    'root ::= "unterminated',
    "rot ::= \"a\"",  # no root rule
    "root ::= root \"a\"",  # left recursion
    "root ::= <[999999999]>",  # token references: refused (see below)
    'root ::= "a" !<[7]>',  # llama.cpp aborted on this one's piece "ab" (found by the fuzz)
    "",
    "root ::= \"a\"\x00",
])
def test_invalid_grammar_is_a_400_naming_it(http, grammar: str) -> None:
    r = complete(http, grammar)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == "grammar"


@pytest.mark.parametrize("grammar", [
    "root ::= " + "(" * 5000 + '"a"' + ")" * 5000,  # deep nesting
    'root ::= "a"{0,100000}',  # huge repetition count
    'root ::= "a"{2000000000}',
    'root ::= ("a"{0,999}){0,999}',  # nested counts multiply
    'root ::= "a"{5,2}',  # m < n
    'root ::= "' + "a" * 600_000 + '"',  # over the 512 KiB of a grammar
])
def test_hostile_grammar_is_a_400_and_the_server_lives(http, grammar: str) -> None:
    r = complete(http, grammar)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == "grammar"
    assert http.get("/health").status_code == 200


def test_one_grammar_per_request(http) -> None:
    r = complete(http, DIGITS, response_format={"type": "json_object"})
    assert r.status_code == 400 and r.json()["error"]["param"] == "response_format"
    tool = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
    r = http.post("/v1/chat/completions", json={
        "messages": MSG, "grammar": DIGITS, "tools": [tool], "tool_choice": "required"})
    assert r.status_code == 400 and r.json()["error"]["param"] == "tool_choice"


# Pieces of GBNF, recombined at random: most results are malformed, some are valid.
_PIECES = st.sampled_from([
    "root", " ::= ", "::=", "a", "b-c", '"x"', '"', "[a-z]", "[^", "]", "(", ")", "|", "*",
    "+", "?", "{", "}", "{2}", "{0,3}", "{1,}", "{99999}", ",", "\n", " ", "#c\n", ".",
    "<[5]>", "!<[7]>", "<|im_end|>", "\\", "\\x41", "\\u00e9", "é", "∞", "0", "9",
])
_GRAMMARS = st.lists(_PIECES, min_size=0, max_size=40).map("".join)


@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
@given(tail=_GRAMMARS)
def test_fuzzed_grammars_are_served_or_refused_by_name(http, tail: str) -> None:
    r = complete(http, "root ::= " + tail, max_tokens=2)
    assert r.status_code in (200, 400), r.text
    if r.status_code == 400:
        assert r.json()["error"]["param"] == "grammar", r.text


def test_server_alive_after_the_fuzz(http) -> None:
    r = complete(http, DIGITS)
    assert r.status_code == 200
