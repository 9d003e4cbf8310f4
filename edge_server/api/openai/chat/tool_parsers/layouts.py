"""How a block of calls is laid out, for the families whose calls are not JSON call
objects: a name then JSON arguments, XML-like parameters, Python-like calls.

A layout reads the text of a block from its start (the marker that opened it included)
as far as it has arrived, and says which calls it holds so far. It is read again as more
text arrives; what it says of a call only grows (a name once complete, arguments text
that only gains characters), so the parser can tell the difference as it streams.
Patterns are matched with `regex`'s partial matching: a marker cut off at the end of the
text waits for the rest instead of failing.

So that reading again costs what is new, a scan says where a later one may start (the
`Resume` before its last call: the calls before it are complete and told) and, when it
stops inside a value that may run long, what settles that value (the `Tail`): until
then a scan again would tell nothing new but that value's own text (marked.py).
"""

from __future__ import annotations

import ast
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import regex

from edge_server.api.openai.chat.tool_parsers.json_scan import WHITESPACE
from edge_server.api.openai.chat.tool_parsers.layout_reader import (
    Reader,
    Resume,
    Tail,
    compiled,
    json_value_end,
)
from edge_server.api.openai.chat.tool_parsers.values import typed_value


@dataclass
class Found:
    """One call as far as it has been read."""

    name: str
    arguments: str = ""  # JSON text, only ever extended
    done: bool = False


@dataclass
class Scan:
    calls: list[Found] = field(default_factory=list)  # from the `first` call of the block
    end: int | None = None  # where the block ended; None: it goes on (or is cut off)
    broken: bool = False  # the text is no block of this layout (told as content)
    first: int = 0  # calls of the block read before (by a scan it resumed)
    resume: Resume | None = None  # where a later scan of the grown block may start
    tail: Tail | None = None  # the long value it stopped inside, if any


Schemas = Mapping[str, Mapping[str, Any]]  # tool name -> its parameters' JSON schema


@dataclass(frozen=True)
class Layout:
    """A block: `start` (a pattern, read if present), calls separated by `separators`,
    then `end` (a literal; the block also ends where no further call follows)."""

    start: str = ""
    end: str = ""
    separators: str = ""
    noise: tuple[str, ...] = ()  # markers between any two pieces, read past

    def scan(self, text: str, schemas: Schemas, final: bool,
             resume: Resume | None = None) -> Scan:
        """The calls in `text`; from `resume` (a point an earlier scan of the same block
        gave) when it is given, the block's text before it read already."""
        r = Reader(text, final, self.noise, resume.pos if resume else 0)
        out = Scan(first=resume.calls if resume else 0)
        if resume is None and self.start and r.pattern(compiled(self.start)) is None \
                and r.waiting:
            return out
        while True:
            r.skip(WHITESPACE + self.separators)
            if r.waiting:
                return out
            if r.at_end:
                if final:
                    out.end = r.pos
                return out
            if r.literal(self.end):
                out.end = r.pos
                return out
            if r.waiting:
                return out
            before = r.pos
            if out.first + len(out.calls):  # the calls before are complete: go on from here
                out.resume = Resume(before, out.first + len(out.calls))
            ok = self.read_call(r, out, schemas)
            if r.waiting:
                out.tail = r.tail
                return out
            if not ok:
                out.broken = not (out.calls or out.first)
                out.end = before
                return out

    def read_call(self, r: Reader, out: Scan, schemas: Schemas) -> bool:
        raise NotImplementedError


@dataclass(frozen=True)
class NamedJson(Layout):
    """`open` (a pattern naming the call in group `name`), a JSON value, then any of
    `closes`: DeepSeek, Kimi K2, harmony, Functionary, Apertus, Mistral-style."""

    opens: tuple[str, ...] = ()
    closes: tuple[str, ...] = ()
    arguments: Callable[[str], str | None] | None = None  # non-JSON arguments, decoded

    def read_call(self, r: Reader, out: Scan, schemas: Schemas) -> bool:
        m = None
        for pattern in self.opens:
            m = r.pattern(compiled(pattern))
            if m is not None or r.waiting:
                break
        if m is None:
            return False
        call = Found(m["name"].strip())
        out.calls.append(call)
        r.skip()
        if self.arguments is not None:
            return self._read_other(r, call)
        end, reading = json_value_end(r.text, r.final, r.pos)
        if end is None:
            call.arguments = r.text[r.pos :]
            r.pos, r.waiting = len(r.text), not r.final
            if reading is not None and r.waiting:
                # Everything up to the value's end is its arguments: told as it comes.
                r.tail = Tail(len(out.calls) - 1, json=reading)
            return True
        call.arguments = r.text[r.pos : end]
        r.pos = end
        call.done = True
        self._read_closes(r)
        return True

    def _read_other(self, r: Reader, call: Found) -> bool:
        assert self.arguments is not None
        raw = r.until(self.closes[0])
        if raw is None:
            return True
        decoded = self.arguments(raw)
        call.arguments, call.done = (decoded if decoded is not None else "{}"), True
        self._read_closes(r)
        return True

    def _read_closes(self, r: Reader) -> None:
        read = True
        while read and not r.waiting:
            r.skip()
            read = any(r.literal(close) for close in self.closes)


@dataclass(frozen=True)
class XmlParameters(Layout):
    """`open` (a pattern naming the call), parameters each opened by `parameter` (a
    pattern naming it in group `key`) and closed by `parameter_end` (`{key}` stands for
    its name), then `close`: Qwen3-Coder, MiniMax, DeepSeek V3.2+, GLM, Seed-OSS, ….
    Values are typed by the tool's schema."""

    open: str = ""
    close: str = ""
    parameter: str = ""
    parameter_end: str = ""

    def read_call(self, r: Reader, out: Scan, schemas: Schemas) -> bool:
        m = r.pattern(compiled(self.open))
        if m is None:
            return False
        call = Found(m["name"].strip(), "{")
        out.calls.append(call)
        properties = schemas.get(call.name, {}).get("properties", {})
        while True:
            r.skip()
            if self._closes(r):
                call.arguments += "}"
                call.done = True
                return True
            if r.waiting or r.at_end:
                r.waiting = not r.final
                return True  # cut off: as far as it got
            p = r.pattern(compiled(self.parameter))
            if p is None:
                if not r.waiting:  # not a parameter: the call ends with what it had
                    call.arguments += "}"
                    call.done = True
                return True
            key = p["key"].strip()
            value = r.until(self.parameter_end.replace("{key}", key))
            if value is None:
                return True
            schema = properties.get(key) if isinstance(properties, dict) else None
            member = json.dumps(key, ensure_ascii=False) + ": " + typed_value(value, schema)
            call.arguments += member if call.arguments == "{" else ", " + member

    def _closes(self, r: Reader) -> bool:
        """The call's close is next (read past); without one, the block's end."""
        if self.close:
            return r.literal(self.close)
        if self.end and r.text.startswith(self.end, r.pos):
            return True
        if r.cut_off(self.end):
            r.waiting = True
        return r.at_end and r.final


@dataclass(frozen=True)
class Pythonic(Layout):
    """`[name(key=value, …), …]`: LFM2. Read whole once the block's end marker comes."""

    def read_call(self, r: Reader, out: Scan, schemas: Schemas) -> bool:
        if not self.end:
            if not r.final:
                r.waiting = True
                return True
            at = -1
        else:
            at = r.find(self.end)  # waiting for it, a Tail
            if at < 0 and not r.final:
                return True
        calls = _python_calls(r.text[r.pos :] if at < 0 else r.text[r.pos : at])
        if calls is None:
            return False
        out.calls.extend(calls)
        r.pos = len(r.text) if at < 0 else at
        return True


def _python_calls(text: str) -> list[Found] | None:
    try:
        tree = ast.parse(text.strip(), mode="eval").body
    except (SyntaxError, ValueError, RecursionError):
        return None
    if not isinstance(tree, ast.List):
        return None
    calls = []
    for node in tree.elts:
        if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Name):
            return None
        try:
            arguments = {k.arg: ast.literal_eval(k.value) for k in node.keywords if k.arg}
            text = json.dumps(arguments, ensure_ascii=False)
        except (ValueError, TypeError, SyntaxError, RecursionError):
            return None
        calls.append(Found(node.func.id, text, True))
    return calls


def gemma_arguments(raw: str) -> str | None:
    """Gemma 4's `{key:<|"|>text<|"|>,n:1}`: strings quoted by `<|"|>`, keys bare."""
    out, rest = [], raw.strip()
    parts = rest.split('<|"|>')
    for i, part in enumerate(parts):
        if i % 2:
            out.append(json.dumps(part, ensure_ascii=False))
        else:
            out.append(regex.sub(r"([{,]\s*)([A-Za-z_][\w.\-]*)\s*:", r'\1"\2":', part))
    text = "".join(out)
    try:
        return json.dumps(json.loads(text), ensure_ascii=False)
    except ValueError:
        return None
