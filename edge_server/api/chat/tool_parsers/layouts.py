"""How a block of calls is laid out, for the families whose calls are not JSON call
objects: a name then JSON arguments, XML-like parameters, Python-like calls.

A layout reads the text of a block from its start (the marker that opened it included)
as far as it has arrived, and says which calls it holds so far. It is read again as more
text arrives; what it says of a call only grows (a name once complete, arguments text
that only gains characters), so the parser can tell the difference as it streams.
Patterns are matched with `regex`'s partial matching: a marker cut off at the end of the
text waits for the rest instead of failing.
"""

from __future__ import annotations

import ast
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import regex

from .json_scan import WHITESPACE
from .values import typed_value


@dataclass
class Found:
    """One call as far as it has been read."""

    name: str
    arguments: str = ""  # JSON text, only ever extended
    done: bool = False


@dataclass
class Scan:
    calls: list[Found] = field(default_factory=list)
    end: int | None = None  # where the block ended; None: it goes on (or is cut off)
    broken: bool = False  # the text is no block of this layout (told as content)


Schemas = Mapping[str, Mapping[str, Any]]  # tool name -> its parameters' JSON schema


class _Reader:
    """A position in the block text, with the partial-match checks every layout needs."""

    def __init__(self, text: str, final: bool, noise: tuple[str, ...]) -> None:
        self.text, self.final, self.noise, self.pos = text, final, noise, 0
        self.waiting = False  # the text ends where more is needed

    def skip(self, chars: str = WHITESPACE) -> None:
        while True:
            start = self.pos
            while self.pos < len(self.text) and self.text[self.pos] in chars:
                self.pos += 1
            rest = self.text[self.pos :]
            for n in self.noise:
                if rest.startswith(n):
                    self.pos += len(n)
                elif rest and n.startswith(rest) and not self.final:
                    self.waiting = True  # a cut-off marker: what follows is not known yet
            if self.pos == start:
                return

    @property
    def at_end(self) -> bool:
        return self.pos >= len(self.text)

    def literal(self, marker: str) -> bool:
        """Reads the marker if it is next; a cut-off one sets `waiting`."""
        if not marker:
            return False
        if self.text.startswith(marker, self.pos):
            self.pos += len(marker)
            return True
        rest = self.text[self.pos :]
        if rest and marker.startswith(rest) and not self.final:
            self.waiting = True
        return False

    def pattern(self, compiled: regex.Pattern[str]) -> regex.Match[str] | None:
        """The pattern's full match here; a cut-off one sets `waiting`."""
        m = compiled.match(self.text, self.pos, partial=not self.final)
        if m is None:
            return None
        if m.partial:
            self.waiting = True
            return None
        self.pos = m.end()
        return m

    def until(self, marker: str) -> str | None:
        """The text up to the marker, which is read past; None while it has not come."""
        at = self.text.find(marker, self.pos)
        if at < 0:
            self.waiting = not self.final
            return None
        value, self.pos = self.text[self.pos : at], at + len(marker)
        for n in self.noise:
            value = value.replace(n, "")
        return value


@dataclass(frozen=True)
class Layout:
    """A block: `start` (a pattern, read if present), calls separated by `separators`,
    then `end` (a literal; the block also ends where no further call follows)."""

    start: str = ""
    end: str = ""
    separators: str = ""
    noise: tuple[str, ...] = ()  # markers between any two pieces, read past

    def scan(self, text: str, schemas: Schemas, final: bool) -> Scan:
        r = _Reader(text, final, self.noise)
        out = Scan()
        if self.start and r.pattern(_compiled(self.start)) is None and r.waiting:
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
            ok = self.read_call(r, out, schemas)
            if r.waiting:
                return out
            if not ok:
                out.broken = not out.calls
                out.end = before
                return out

    def read_call(self, r: _Reader, out: Scan, schemas: Schemas) -> bool:
        raise NotImplementedError


@dataclass(frozen=True)
class NamedJson(Layout):
    """`open` (a pattern naming the call in group `name`), a JSON value, then any of
    `closes`: DeepSeek, Kimi K2, harmony, Functionary, Apertus, Mistral-style."""

    opens: tuple[str, ...] = ()
    closes: tuple[str, ...] = ()
    arguments: Callable[[str], str | None] | None = None  # non-JSON arguments, decoded

    def read_call(self, r: _Reader, out: Scan, schemas: Schemas) -> bool:
        m = None
        for pattern in self.opens:
            m = r.pattern(_compiled(pattern))
            if m is not None or r.waiting:
                break
        if m is None:
            return False
        call = Found(m["name"].strip())
        out.calls.append(call)
        r.skip()
        if self.arguments is not None:
            return self._read_other(r, call)
        rest = r.text[r.pos :]
        end = json_value_end(rest, r.final)
        call.arguments = rest if end is None else rest[:end]
        if end is None:
            r.pos, r.waiting = len(r.text), not r.final
            return True
        r.pos += end
        call.done = True
        self._read_closes(r)
        return True

    def _read_other(self, r: _Reader, call: Found) -> bool:
        assert self.arguments is not None
        raw = r.until(self.closes[0])
        if raw is None:
            return True
        decoded = self.arguments(raw)
        call.arguments, call.done = (decoded if decoded is not None else "{}"), True
        self._read_closes(r)
        return True

    def _read_closes(self, r: _Reader) -> None:
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

    def read_call(self, r: _Reader, out: Scan, schemas: Schemas) -> bool:
        m = r.pattern(_compiled(self.open))
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
            p = r.pattern(_compiled(self.parameter))
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

    def _closes(self, r: _Reader) -> bool:
        """The call's close is next (read past); without one, the block's end."""
        if self.close:
            return r.literal(self.close)
        if self.end and r.text.startswith(self.end, r.pos):
            return True
        rest = r.text[r.pos :]
        if rest and self.end.startswith(rest) and not r.final:
            r.waiting = True
        return r.at_end and r.final


@dataclass(frozen=True)
class Pythonic(Layout):
    """`[name(key=value, …), …]`: LFM2. Read whole once the block's end marker comes."""

    def read_call(self, r: _Reader, out: Scan, schemas: Schemas) -> bool:
        rest = r.text[r.pos :]
        at = rest.find(self.end) if self.end else -1
        if at < 0 and not r.final:
            r.waiting = True
            return True
        calls = _python_calls(rest if at < 0 else rest[:at])
        if calls is None:
            return False
        out.calls.extend(calls)
        r.pos += len(rest) if at < 0 else at
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


# Strings, brackets and runs of anything else: a JSON value's end found at C speed.
_JSON_PIECES = regex.compile(r'"(?:[^"\\]|\\.)*"|[{\[]|[}\]]|[^"{}\[\]]+|"', regex.S)
_SCALAR = regex.compile(r"[^\s,\]}<]*")


def json_value_end(text: str, final: bool) -> int | None:
    """Where the JSON value that opens the text ends; None while it goes on."""
    if not text:
        return None
    if text[0] not in '{["':
        end = _SCALAR.match(text).end()
        return end if end < len(text) or final else None
    depth = 0
    for m in _JSON_PIECES.finditer(text):
        piece = m.group()
        if piece == '"':
            return None  # a string still open
        if piece in "{[":
            depth += 1
        elif piece in "}]":
            depth -= 1
        if depth == 0:
            return m.end()
    return None


_PATTERNS: dict[str, regex.Pattern[str]] = {}


def _compiled(pattern: str) -> regex.Pattern[str]:
    compiled = _PATTERNS.get(pattern)
    if compiled is None:
        compiled = _PATTERNS[pattern] = regex.compile(pattern)
    return compiled
