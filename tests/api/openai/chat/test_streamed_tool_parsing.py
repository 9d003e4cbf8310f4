# ruff: noqa: RUF001  (DeepSeek's markers are written with fullwidth bars)
"""Streamed tool-call parsing reads each piece once: a 200 KB argument streamed in
4-character pieces is parsed in time linear in its length, with the call the answer
read whole gives (every piece once re-read the open call: 20 KB took 50 s in DeepSeek's
layout, 200 KB minutes), and the families' examples cut anywhere read as they do whole."""

from __future__ import annotations

import gc
import json
import random
import time
from typing import Any

import pytest
from test_family_parsers import CASES, check, read

from edge_server.api.openai.chat.tool_parsers import (
    HERMES,
    CallArguments,
    CallStart,
    Content,
    ToolCallFormat,
    call_parser,
)
from edge_server.api.openai.chat.tool_parsers import families as f

PIECE = 4
_TEXT = 'Some code: if (a[i] == "x") { b = {"k": [1, 2]}; } // \\ done\n'
SCHEMAS = {"write": {"type": "object", "properties": {"content": {"type": "string"},
                                                        "n": {"type": "integer"}}}}


def long_call(fmt: ToolCallFormat, size: int) -> str:
    """One call of `write` whose `content` is `size` characters (JSON's special ones among
    them), as the family writes it."""
    text = (_TEXT * (size // len(_TEXT) + 1))[:size]
    arguments = json.dumps({"content": text, "n": 1})
    if fmt is HERMES:
        return f'<tool_call>{{"name": "write", "arguments": {arguments}}}</tool_call>'
    if fmt is f.DEEPSEEK:
        return (f"<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>write<｜tool▁sep｜>{arguments}"
                "<｜tool▁call▁end｜><｜tool▁calls▁end｜>")
    if fmt is f.APERTUS:
        return f'<|tools_prefix|>[{{"write": {arguments}}}]<|tools_suffix|>'
    if fmt is f.QWEN3_CODER:
        text = text.replace("<", "")
        return (f"<tool_call>\n<function=write>\n<parameter=content>\n{text}\n</parameter>\n"
                "<parameter=n>\n1\n</parameter>\n</function>\n</tool_call>")
    if fmt is f.GEMMA4:
        return '<|tool_call>call:write{content:<|"|>' + text + '<|"|>,n:1}<tool_call|>'
    assert fmt is f.LFM2
    return f"<|tool_call_start|>[write(content={text!r}, n=1)]<|tool_call_end|>"


def parse(fmt: ToolCallFormat, pieces: list[str]) -> tuple[list[tuple[str, Any]], str, float]:
    """The calls (name, decoded arguments), the content, and the CPU seconds it took (not
    the wall clock's: other work on a busy machine does not count)."""
    parser = call_parser(["write"], fmt, schemas=SCHEMAS)
    gc.collect()
    gc.disable()  # a collection's pause lands on whichever run it falls in
    try:
        started = time.thread_time()
        events = [e for piece in pieces for e in parser.feed(piece)] + parser.finish()
        seconds = time.thread_time() - started
    finally:
        gc.enable()
    names = [e.name for e in events if isinstance(e, CallStart)]
    arguments = "".join(e.text for e in events if isinstance(e, CallArguments))
    content = "".join(e.text for e in events if isinstance(e, Content))
    return [(name, json.loads(arguments)) for name in names], content, seconds


def cut(text: str) -> list[str]:
    return [text[i : i + PIECE] for i in range(0, len(text), PIECE)]


@pytest.mark.parametrize("fmt", [HERMES, f.DEEPSEEK, f.APERTUS, f.QWEN3_CODER, f.GEMMA4,
                                 f.LFM2], ids=lambda fmt: fmt.name)
def test_a_long_argument_streams_in_time_linear_in_its_length(fmt: ToolCallFormat) -> None:
    small, big = long_call(fmt, 25_000), long_call(fmt, 200_000)
    whole = parse(fmt, [big])
    assert whole[0] and whole[0][0][0] == "write" and len(whole[0][0][1]["content"]) > 190_000
    streamed = parse(fmt, cut(big))
    assert streamed[:2] == whole[:2]
    # Eight times the text takes about eight times as long; re-reading the open call on
    # each piece makes it sixty-four. The best of a few runs each, so a busy machine's
    # cache misses count against neither side more than the other.
    small_s = min(parse(fmt, cut(small))[2] for _ in range(3))
    big_s = min(streamed[2], parse(fmt, cut(big))[2])
    assert big_s < 10.0, big_s
    assert big_s < 24 * small_s + 0.25, (small_s, big_s)


@pytest.mark.parametrize("case", CASES, ids=[c["family"] for c in CASES])
def test_examples_cut_anywhere_read_as_whole(case: dict[str, Any]) -> None:
    """Random cuts land inside markers, names and values, and across the ends of long
    values: each gives the message the whole output gives."""
    rng = random.Random(case["family"])
    output = case["output"]
    for _ in range(12):
        at = sorted(rng.sample(range(1, len(output)), min(len(output) - 1, rng.randint(1, 9))))
        pieces = [output[a:b] for a, b in zip([0, *at], [*at, len(output)], strict=True)]
        check(case, read(case, pieces)["message"])
