"""Every family's native tool-call output (examples from llama.cpp's test-chat.cpp, in
tool_call_examples.json) read by the parser its template selects, whole and streamed
character by character: the calls (name, arguments as JSON), content and reasoning.
The same examples go through the server in test_family_tool_calls.py."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from conftest import llama_sources

from edge_server.api.openai.chat.choice_output import ChoiceOutput, ToolMode
from edge_server.api.openai.chat.family_grammar import family_call_grammar, literal
from edge_server.api.openai.chat.protocol import Tool
from edge_server.api.openai.chat.tool_parsers import (
    CallArguments,
    CallStart,
    Content,
    ToolCallFormat,
    call_parser,
    format_for_template,
    think_markers,
)
from edge_server.api.openai.chat.tool_schema import call_grammar

EXAMPLES = json.loads((Path(__file__).parent / "tool_call_examples.json").read_text())
CASES = EXAMPLES["cases"]


def template_source(name: str) -> str:
    return (llama_sources() / "models" / "templates" / name).read_text()


def read(case: dict[str, Any], pieces: list[str]) -> dict[str, Any]:
    """The message the output makes, and the call deltas it streamed."""
    source = template_source(case["template"])
    tools = {name: EXAMPLES["tools"][name] for name in case["tools"]}
    think = think_markers(source)
    opened = case.get("opened") or (think[1] in case["output"] and think[0] not in case["output"])
    mode = ToolMode(names=tuple(tools), fmt=format_for_template(source, True), forced=False,
                    max_calls=None, legacy=False,
                    schemas={n: t["parameters"] for n, t in tools.items()})
    output = ChoiceOutput(split_reasoning=True, reasoning_opened=opened, tools=mode, think=think)
    deltas = [d for piece in pieces for d in output.push(piece)] + output.finish()
    return {"message": output.message().model_dump(exclude_none=True), "deltas": deltas}


def check(case: dict[str, Any], message: dict[str, Any]) -> None:
    calls = [[c["function"]["name"], json.loads(c["function"]["arguments"])]
             for c in message.get("tool_calls", [])]
    assert calls == case["calls"]
    assert (message.get("content") or "").strip() == case["content"].strip()
    assert (message.get("reasoning_content") or "").strip() == case["reasoning"].strip()


@pytest.mark.parametrize("case", CASES, ids=[c["family"] for c in CASES])
def test_whole_output(case: dict[str, Any]) -> None:
    check(case, read(case, [case["output"]])["message"])


@pytest.mark.parametrize("case", CASES, ids=[c["family"] for c in CASES])
def test_streamed_output(case: dict[str, Any]) -> None:
    streamed = read(case, list(case["output"]))
    check(case, streamed["message"])
    # OpenAI's delta shape: a call's first delta names it, the rest carry arguments.
    calls = [d["tool_calls"][0] for d in streamed["deltas"] if "tool_calls" in d]
    for index in range(len(case["calls"])):
        mine = [c for c in calls if c["index"] == index]
        assert mine[0]["function"] == {"name": case["calls"][index][0], "arguments": ""}
        assert {"id", "type"} <= set(mine[0])
        assert all(set(c) == {"index", "function"} and set(c["function"]) == {"arguments"}
                   for c in mine[1:])


FORMATS = sorted({format_for_template(template_source(c["template"]), True).name: c["template"]
                  for c in CASES}.items())


ADD = Tool.model_validate({"type": "function", "function": {"name": "add", "parameters": {
    "type": "object", "properties": {"a": {"type": "integer"}, "s": {"type": "string"}},
    "required": ["a", "s"]}}})
FORCED_FORMATS = [(n, t) for n, t in FORMATS
                  if format_for_template(template_source(t), True).forced]


def forced_text(fmt: ToolCallFormat) -> str:
    """What a forced call's grammar writes for add(a=1, s="x"): its template filled in."""
    if fmt.layout is None:
        return fmt.forced.replace("{call}", '{"name": "add", "arguments": {"a": 1, "s": "x"}}')
    params = "".join(fmt.forced_param.replace("{key}", k).replace("{value}", v)
                     for k, v in (("a", "1"), ("s", "x")))
    call = (fmt.forced_call.replace("{name}", "add").replace("{args}", '{"a": 1, "s": "x"}')
            .replace("{params}", params))
    return fmt.forced.replace("{calls}", call)


@pytest.mark.parametrize(("name", "template"), FORMATS, ids=[n for n, _ in FORMATS])
def test_a_call_written_as_forced_reads_back(name: str, template: str) -> None:
    """The text a forced call's grammar writes (its template filled in) is read back as
    that call by the family's own parser; families without a forced form get none."""
    fmt = format_for_template(template_source(template), True)
    grammar = family_call_grammar([ADD], fmt, call_grammar([ADD]))
    if not fmt.forced:
        assert grammar is None
        return
    assert grammar is not None and grammar.startswith("root ::= ")
    text = forced_text(fmt)
    # What the family writes before the call, as the grammar's first literal.
    marker = fmt.forced.partition("{call")[0] or fmt.forced_call.partition("{name}")[0]
    assert literal(marker)[:-1] in grammar.partition("\n")[0]
    schemas = {"add": ADD.function.parameters or {}}
    for pieces in ([text], list(text)):
        parser = call_parser(["add"], fmt, forced=True, schemas=schemas)
        events = [e for p in pieces for e in parser.feed(p)] + parser.finish()
        starts = [e for e in events if isinstance(e, CallStart)]
        arguments = "".join(e.text for e in events if isinstance(e, CallArguments))
        assert [s.name for s in starts] == ["add"]
        assert json.loads(arguments) == {"a": 1, "s": "x"}
        assert not "".join(e.text for e in events if isinstance(e, Content)).strip()


@pytest.mark.parametrize(("name", "template"), FORCED_FORMATS,
                         ids=[n for n, _ in FORCED_FORMATS])
def test_a_forced_call_cut_anywhere_is_a_call_never_marker_text(name: str,
                                                                template: str) -> None:
    """A forced call cut off at any character (max_tokens) comes back as the call, its
    arguments as far as they got, with no content: never the family's markers as text,
    whole or streamed."""
    fmt = format_for_template(template_source(template), True)
    mode = ToolMode(names=("add",), fmt=fmt, forced=True, max_calls=1, legacy=False,
                    schemas={"add": ADD.function.parameters or {}})
    text = forced_text(fmt)
    for cut in range(len(text) + 1):
        for pieces in ([text[:cut]], list(text[:cut])):
            output = ChoiceOutput(split_reasoning=True, reasoning_opened=False, tools=mode,
                                  think=think_markers(template_source(template)))
            deltas = [d for p in pieces for d in output.push(p)] + output.finish()
            message = output.message()
            assert message.content is None, (cut, message.content)
            assert not any("content" in d for d in deltas), (cut, deltas)
            assert [c["function"]["name"] for c in message.tool_calls or []] == ["add"], cut
            assert output.finish_reason("length") == "length"
