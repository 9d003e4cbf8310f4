"""JSON read as its text arrives: where a value ends, and the members of a call object.

Nothing here decodes JSON while it streams; it only tracks strings, escapes and nesting,
so a call's arguments can be passed on raw, fragment by fragment, and still concatenate
to the text the model wrote.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

WHITESPACE = " \t\r\n"


# Where reading a value must look at a character: in a string, its end or an escape;
# outside, a string's start and brackets; in a scalar, what ends it. Runs of anything else
# are skipped at C speed.
_STRING_STOP = re.compile(r'["\\]')
_CONTAINER_STOP = re.compile(r'["{}\[\]]')
_SCALAR_STOP = re.compile(r"[ \t\r\n,:\]}]")


class JsonEnd:
    """Where the JSON container or string that starts at a position ends, read as its
    text arrives: `feed` takes the text from where it last stopped."""

    def __init__(self) -> None:
        self.depth = 0
        self.in_string = False
        self.escaped = False

    def feed(self, text: str, pos: int = 0) -> int | None:
        """The index in `text` just past the value, reading from `pos`; None while the
        value goes on past the end of `text` (whose reading is kept for the next)."""
        i, n = pos, len(text)
        while i < n:
            if self.in_string:
                if self.escaped:
                    self.escaped, i = False, i + 1
                    continue
                m = _STRING_STOP.search(text, i)
                if m is None:
                    return None
                i = m.end()
                if m.group() == "\\":
                    self.escaped = True
                else:
                    self.in_string = False
                    if self.depth == 0:
                        return i  # a string value ends with its closing quote
                continue
            m = _CONTAINER_STOP.search(text, i)
            if m is None:
                return None
            c, i = m.group(), m.end()
            if c == '"':
                self.in_string = True
            elif c in "{[":
                self.depth += 1
            else:
                self.depth -= 1
                if self.depth == 0:
                    return i
        return None


class RawValue:
    """One JSON value (object, array, string or scalar), read from its first character.

    A scalar (number, true, …) ends at the first character that cannot continue it,
    which `feed` leaves unread; containers and strings end at their closing character.
    """

    def __init__(self) -> None:
        self.kind = ""  # "string", "container" or "scalar", set by the first character
        self.done = False
        self._json: JsonEnd | None = None  # a string's or container's reading

    def feed(self, text: str) -> int:
        """Reads what belongs to the value; returns how many characters that was."""
        if self.done or not text:
            return 0
        start = 0
        if not self.kind:
            first = text[0]
            if first in '"{[':
                self.kind = "string" if first == '"' else "container"
                self._json = JsonEnd()
            else:
                self.kind, start = "scalar", 1  # a scalar's first character is its own
        if self._json is None:
            m = _SCALAR_STOP.search(text, start)
            if m is None:
                return len(text)
            self.done = True
            return m.start()
        end = self._json.feed(text)
        if end is None:
            return len(text)
        self.done = True
        return end

    def end(self) -> None:
        """The text ended: a scalar is complete now; other values stay cut off."""
        if self.kind == "scalar":
            self.done = True


@dataclass
class Member:
    """A signal from CallObject: a key read, a fragment of its value, or the whole value."""

    what: str  # "key", "part" or "value"
    key: str
    text: str = ""


_OPEN, _KEY_OR_END, _KEY, _COLON, _VALUE_START, _VALUE, _AFTER = range(7)


class CallObject:
    """The top-level members of one JSON object, reported as they are read.

    `broken` is set at the first character that cannot belong to a JSON object, which
    is left unread; `done` once its closing brace is read.
    """

    def __init__(self) -> None:
        self.done = False
        self.broken = False
        self.key: str | None = None  # the member being read
        self._value_parts: list[str] = []  # what has been read of its value
        self._state = _OPEN
        self._key_text = ""
        self._value: RawValue | None = None

    def feed(self, text: str) -> tuple[int, list[Member]]:
        """Reads up to the object's end; returns how much was read and what was seen."""
        out: list[Member] = []
        i = 0
        while i < len(text) and not (self.done or self.broken):
            if self._state == _VALUE:
                assert self._value is not None and self.key is not None
                used = self._value.feed(text[i:])
                if used:
                    part = text[i : i + used]
                    self._value_parts.append(part)
                    out.append(Member("part", self.key, part))
                    i += used
                if self._value.done:
                    self._close_value(out)
                continue
            c = text[i]
            i += 1
            if self._state == _KEY:
                self._key_text += c
                if c == '"' and not _escaped_quote(self._key_text):
                    self._read_key(out)
                continue
            if c in WHITESPACE:
                continue
            if self._state == _OPEN:
                self._expect(c == "{", _KEY_OR_END)
            elif self._state == _KEY_OR_END and c == "}":
                self.done = True
            elif self._state == _KEY_OR_END:
                self._expect(c == '"', _KEY)
                self._key_text = c
            elif self._state == _COLON:
                self._expect(c == ":", _VALUE_START)
            elif self._state == _VALUE_START:
                self._expect(c not in ",:]}", _VALUE)
                self._value, self._value_parts = RawValue(), []
                i -= 1  # the value reads its own first character
            elif self._state == _AFTER:
                self._expect(c in ",}", _KEY_OR_END)
                self.done = c == "}"
        # What broke the object is left unread: it may begin a marker (`</tool_call>`).
        return (i - 1 if self.broken else i), out

    def end(self) -> list[Member]:
        """The text ended: a trailing scalar value is complete."""
        out: list[Member] = []
        if self._state == _VALUE and self._value is not None:
            self._value.end()
            if self._value.done:
                self._close_value(out)
        return out

    @property
    def value_text(self) -> str:
        """What has been read of the current member's value."""
        return "".join(self._value_parts)

    @property
    def partial_string(self) -> str | None:
        """The characters read so far of a string value that is still open."""
        if self._state == _VALUE and self._value_parts and self._value_parts[0][:1] == '"':
            return self.value_text[1:].rstrip("\\")
        return None

    def _expect(self, ok: bool, state: int) -> None:
        if ok:
            self._state = state
        else:
            self.broken = True

    def _read_key(self, out: list[Member]) -> None:
        try:
            key = json.loads(self._key_text)
        except ValueError:
            self.broken = True
            return
        self.key, self._state = key, _COLON
        out.append(Member("key", key))

    def _close_value(self, out: list[Member]) -> None:
        assert self.key is not None
        out.append(Member("value", self.key, self.value_text))
        self._state, self._value = _AFTER, None


def _escaped_quote(text: str) -> bool:
    """Whether the quote ending `text` is escaped (an odd run of backslashes before it)."""
    run = len(text) - 1 - len(text[:-1].rstrip("\\"))
    return run % 2 == 1


def loads(text: str) -> Any:
    """The decoded value, or None where the text is not JSON."""
    try:
        return json.loads(text)
    except (ValueError, RecursionError):
        return None
