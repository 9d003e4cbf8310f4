"""Tool calls in the families whose calls are laid out by a `Layout` (layouts.py).

Content passes through until the family's trigger (the marker that opens a block of
calls, or a call's own opening) appears; a trigger cut off at the end of the text is
held back. From the trigger on, the block's text is kept and read by the layout each time
more arrives: a call is told once its name is complete, its arguments as far as the
layout has read them. Markers the family writes around plain content (`drops`) are left
out of it. The whole answer fed at once gives the same events as fed in pieces.

Reading again costs what is new, not the block's length (a 200 KB argument in 4-character
pieces once took minutes): the block is kept from before its last call on (the calls
before are complete and told: the layout's `Resume`), and while the text ends inside a
long value (the layout's `Tail`) the pieces that follow are only checked for the
value's end, JSON arguments told as they come, until the value ends and the block is
read again, once.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import Any

import regex

from edge_server.api.openai.chat.tool_parsers.events import (
    CallArguments,
    CallStart,
    Event,
    add_content,
)
from edge_server.api.openai.chat.tool_parsers.formats import ToolCallFormat
from edge_server.api.openai.chat.tool_parsers.layout_reader import Resume, Tail
from edge_server.api.openai.chat.tool_parsers.layouts import Layout, Scan


class LayoutParser:
    def __init__(
        self,
        names: Collection[str],
        fmt: ToolCallFormat,
        *,
        max_calls: int | None = None,
        schemas: Mapping[str, Mapping[str, Any]] | None = None,
    ) -> None:
        assert fmt.layout is not None and fmt.trigger
        self._names = frozenset(names)
        self._fmt = fmt
        self._layout: Layout = fmt.layout
        self._drops = frozenset(fmt.drops)
        alternatives = [fmt.trigger, *(regex.escape(d) for d in fmt.drops)]
        self._trigger = regex.compile("|".join(f"(?:{a})" for a in alternatives))
        self._schemas = schemas or {}
        self._max_calls = max_calls
        self._buf = ""  # text not yet read
        self._block: str | None = None  # the block of calls being read
        self._told: list[tuple[int, int]] = []  # per call of the block: index, arguments told
        self._resume: Resume | None = None  # where the block's next scan starts
        self._tail: Tail | None = None  # the long value the text ends inside
        self._tail_text: list[str] = []  # what came since, not yet in the block
        self._carry = ""  # the end of the text, where the tail's end marker may begin
        self._started = 0
        self._opening = regex.compile(fmt.opening) if fmt.opening else None
        self._out: list[Event] = []

    def feed(self, text: str) -> list[Event]:
        if self._tail is not None and self._tail_takes(text):
            out, self._out = self._out, []
            return out
        self._buf += text
        return self._run(final=False)

    def finish(self) -> list[Event]:
        """The answer ended: what was held is told; a cut-off call stays as far as it got."""
        self._end_tail()
        return self._run(final=True)

    def _run(self, *, final: bool) -> list[Event]:
        while self._block is not None or self._buf:
            if self._block is None and not self._find_block(final):
                break
            assert self._block is not None
            self._block += self._buf
            self._buf = ""
            scan = self._layout.scan(self._block, self._schemas, final, self._resume)
            if scan.broken or (scan.end == 0 and not scan.first) or self._unknown_first(scan):
                # Not a block of calls after all: its first character is content.
                self._content(self._block[:1])
                self._buf, self._block = self._block[1:], None
                continue
            self._tell(scan)
            if scan.end is None:
                self._keep(scan, final)
                break
            self._buf, self._block, self._resume = self._block[scan.end :], None, None
        out, self._out = self._out, []
        return out

    def _keep(self, scan: Scan, final: bool) -> None:
        """The block goes on: kept from where the next scan starts, which waits for the
        end of a long value the text ends in."""
        assert self._block is not None
        if scan.resume is not None:
            self._block = self._block[scan.resume.pos :]
            self._resume = Resume(0, scan.resume.calls)
        if scan.tail is not None and not final:
            self._tail = Tail(scan.first + scan.tail.call, scan.tail.json, scan.tail.marker)
            self._carry = self._block[len(self._block) - len(scan.tail.marker) + 1 :] \
                if len(scan.tail.marker) > 1 else ""

    def _tail_takes(self, text: str) -> bool:
        """Whether `text` leaves the long value unended (then it is kept, its JSON
        arguments told); False when the value may end in it (read by a scan)."""
        tail = self._tail
        assert tail is not None
        if tail.json is not None:
            if tail.json.feed(text) is not None:
                self._end_tail()
                return False
            self._tail_text.append(text)
            index, told = self._told[tail.call]
            if index >= 0 and text:
                self._out.append(CallArguments(index, text))
            self._told[tail.call] = (index, told + len(text))
            return True
        seen = self._carry + text
        if tail.marker in seen:
            self._end_tail()
            return False
        self._tail_text.append(text)
        self._carry = seen[len(seen) - len(tail.marker) + 1 :] if len(tail.marker) > 1 else ""
        return True

    def _end_tail(self) -> None:
        if self._tail is None:
            return
        assert self._block is not None
        self._block += "".join(self._tail_text)
        self._tail, self._tail_text, self._carry = None, [], ""

    def _find_block(self, final: bool) -> bool:
        """Tells the content before the next trigger; True when a block starts."""
        if self._opening is not None:
            m = self._opening.match(self._buf, partial=not final)
            if m is not None and m.partial:
                return False
            self._opening = None  # only ever at the start
            if m is not None and m.end() == 0:
                self._block, self._buf, self._told, self._resume = self._buf, "", [], None
                return True
            if m is not None:
                self._buf = self._buf[m.end() :]
        while True:
            m = self._trigger.search(self._buf, partial=not final)
            if m is None:
                self._content(self._buf)
                self._buf = ""
                return False
            self._content(self._buf[: m.start()])
            if m.partial:
                self._buf = self._buf[m.start() :]
                return False
            if m.group() in self._drops:
                self._buf = self._buf[m.end() :]
                continue
            self._block, self._buf, self._told = self._buf[m.start() :], "", []
            self._resume = None
            return True

    def _unknown_first(self, scan: Scan) -> bool:
        """A block whose first call names no listed tool is no call (and none was told)."""
        return bool(scan.calls) and not self._told and scan.calls[0].name not in self._names

    def _tell(self, scan: Scan) -> None:
        for i, call in enumerate(scan.calls, scan.first):
            if i == len(self._told):
                self._told.append((self._begin(call.name), 0))
            index, told = self._told[i]
            if index >= 0 and len(call.arguments) > told:
                self._out.append(CallArguments(index, call.arguments[told:]))
            self._told[i] = (index, len(call.arguments))

    def _begin(self, name: str) -> int:
        """The call's index, or -1 for one that is not told (unknown, or past max_calls)."""
        if name not in self._names:
            return -1
        index = self._started
        self._started += 1
        if self._max_calls is not None and index >= self._max_calls:
            return -1
        self._out.append(CallStart(index, self._fmt.new_id(), name))
        return index

    def _content(self, text: str) -> None:
        add_content(self._out, text)
