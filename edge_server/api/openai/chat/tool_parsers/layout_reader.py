"""Reading a block of calls for a layout (layouts.py): a position in the block's text with
the partial-match checks every layout needs, where a JSON value ends, and where a scan
that stopped inside a long value can be left until more text settles it (`Tail`).

Nothing here copies the rest of the text to look at it: a block grows with each piece
the model writes and is read again from its last call (marked.py), so every check costs
what it reads, not the length of the block.
"""

from __future__ import annotations

from dataclasses import dataclass

import regex

from edge_server.api.openai.chat.tool_parsers.json_scan import WHITESPACE, JsonEnd

# A scalar value runs to what ends it in a block of calls.
_SCALAR = regex.compile(r"[^\s,\]}<]*")


def json_value_end(text: str, final: bool, pos: int = 0) -> tuple[int | None, JsonEnd | None]:
    """Where the JSON value that starts at `pos` ends (None while it goes on), and for a
    container or string still open, its reading so far (to go on with as text comes)."""
    if pos >= len(text):
        return None, None
    if text[pos] not in '{["':
        m = _SCALAR.match(text, pos)
        assert m is not None  # the pattern matches the empty string
        end = m.end()
        return (end if end < len(text) or final else None), None
    scanner = JsonEnd()
    end = scanner.feed(text, pos)
    return end, (scanner if end is None else None)


@dataclass
class Tail:
    """Where a scan stopped inside one call's value, which can run long: until more text
    settles it, a scan again would tell the same but for that value's own text.

    With `json`, the value is the call's JSON arguments: every character up to its end
    is arguments text, told as it comes. Otherwise nothing is told until `marker` (what
    ends the value) appears in the text that follows."""

    call: int  # the call's place in the scan's `calls` (-1 where nothing is told)
    json: JsonEnd | None = None
    marker: str = ""


class Reader:
    """A position in the block text, with the partial-match checks every layout needs."""

    def __init__(self, text: str, final: bool, noise: tuple[str, ...], pos: int = 0) -> None:
        self.text, self.final, self.noise, self.pos = text, final, noise, pos
        self.waiting = False  # the text ends where more is needed
        self.tail: Tail | None = None  # set where it waits inside a long value

    def _cut_off(self, marker: str, at: int | None = None) -> bool:
        """The text ends (here, or at `at`) with the start of `marker` (more text may
        complete it)."""
        at = self.pos if at is None else at
        return 0 < len(self.text) - at < len(marker) and marker.startswith(self.text[at:])

    def skip(self, chars: str = WHITESPACE) -> None:
        while True:
            start = self.pos
            while self.pos < len(self.text) and self.text[self.pos] in chars:
                self.pos += 1
            at = self.pos  # each noise marker is looked for here
            for n in self.noise:
                if self.text.startswith(n, at):
                    self.pos += len(n)
                elif not self.final and self._cut_off(n, at):
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
        if not self.final and self._cut_off(marker):
            self.waiting = True
        return False

    def cut_off(self, marker: str) -> bool:
        """Whether the rest of the text is the start of `marker` (and more may come)."""
        return not self.final and self._cut_off(marker)

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

    def find(self, marker: str) -> int:
        """Where the marker next starts (-1: not yet); waiting for it sets a Tail."""
        at = self.text.find(marker, self.pos)
        if at < 0 and not self.final:
            self.waiting = True
            self.tail = Tail(-1, marker=marker)
        return at

    def until(self, marker: str) -> str | None:
        """The text up to the marker, which is read past; None while it has not come."""
        at = self.find(marker)
        if at < 0:
            return None
        value, self.pos = self.text[self.pos : at], at + len(marker)
        for n in self.noise:
            value = value.replace(n, "")
        return value


_PATTERNS: dict[str, regex.Pattern[str]] = {}


def compiled(pattern: str) -> regex.Pattern[str]:
    found = _PATTERNS.get(pattern)
    if found is None:
        found = _PATTERNS[pattern] = regex.compile(pattern)
    return found


@dataclass
class Resume:
    """A point between two calls of a block (after its first), from which a later scan
    of the same block, grown, may start: `calls` calls were read before it."""

    pos: int
    calls: int

