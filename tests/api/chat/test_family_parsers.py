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

from edge_server.api.chat.choice_output import ChoiceOutput, ToolMode
from edge_server.api.chat.tool_parsers import format_for_template, think_markers

EXAMPLES = json.loads((Path(__file__).parent / "tool_call_examples.json").read_text())
CASES = EXAMPLES["cases"]


def template_source(name: str) -> str:
    return (llama_sources() / "models" / "templates" / name).read_text()


def read(case: dict[str, Any], pieces: list[str]) -> dict[str, Any]:
    """The message the output makes, and the call deltas it streamed."""
    source = template_source(case["template"])
    tools = {name: EXAMPLES["tools"][name] for name in case["tools"]}
    think = think_markers(source)
    opened = think[1] in case["output"] and think[0] not in case["output"]
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
