"""Tool calls found in a model's text while it streams.

`feed` takes each new piece of text and returns what can be told now: content, the start
of a call (its id and name), fragments of its arguments. Content passes through at once
except the few characters that may begin a marker; a call's text is held only until its
name is known (a call naming no listed tool is content after all). From the name on, the
call is committed and its arguments stream as the model writes them.

The whole answer fed at once gives the same events, so streamed and non-streamed
responses come from this one parser.
"""

from __future__ import annotations

from collections.abc import Collection

from edge_server.api.openai.chat.tool_parsers.call import (
    ARGUMENT_KEYS,
    CALL_KEYS,
    NAME_CHARS,
    NAME_KEYS,
    Call,
    name_length,
    nested_call,
    past_args_marker,
)
from edge_server.api.openai.chat.tool_parsers.events import (
    CallArguments,
    CallStart,
    Event,
    add_content,
    marker_at,
    partial_marker,
)
from edge_server.api.openai.chat.tool_parsers.formats import ToolCallFormat
from edge_server.api.openai.chat.tool_parsers.json_scan import (
    WHITESPACE,
    CallObject,
    Member,
    RawValue,
    loads,
)

# Parser states.
_TEXT, _OPEN, _ITEM, _CALL, _NAMED, _NAMED_ARGS, _NEXT_ITEM, _AFTER = range(8)


class ToolCallParser:
    def __init__(
        self,
        names: Collection[str],
        fmt: ToolCallFormat,
        *,
        forced: bool = False,
        max_calls: int | None = None,
    ) -> None:
        self._names = frozenset(names)
        self._fmt = fmt
        self._forced = forced  # the grammar made the answer a call: it is never content
        self._max_calls = max_calls
        self._buf = ""  # text not yet read
        self._held: list[str] = []  # text of a possible call, content if it is not one
        self._state = _TEXT
        self._at_start = True  # nothing but whitespace told yet
        self._committed = False  # a call of the current block has started
        self._in_array = False
        self._object: CallObject | None = None
        self._value: RawValue | None = None
        self._call: Call | None = None
        self._started = 0
        self._out: list[Event] = []

    def feed(self, text: str) -> list[Event]:
        self._buf += text
        while self._step():
            pass
        out, self._out = self._out, []
        return out

    def finish(self) -> list[Event]:
        """The answer ended: what was held is told, a cut-off call stays as far as it got."""
        if self._state in (_CALL, _NAMED_ARGS) and self._call is not None:
            if self._state == _CALL and self._object is not None:
                self._members(self._object.end())
            if self._call is not None and self._call.index < 0:
                self._start_cut_off_call()
        if self._held and not (self._call is not None and self._call.index >= 0):
            self._reject()
        if self._state == _TEXT or not self._committed:
            self._content(self._buf)
        self._buf = ""
        out, self._out = self._out, []
        return out

    # States ---------------------------------------------------------------------------

    def _step(self) -> bool:
        """Reads what the current state can; False when it needs more text."""
        if not self._buf:
            return False
        if self._state == _TEXT:
            return self._text()
        if self._state == _CALL:
            return self._read_object()
        if self._state == _NAMED:
            return self._named()
        if self._state == _NAMED_ARGS and self._value is not None:
            return self._read_named_arguments()
        at = len(self._buf) - len(self._buf.lstrip(WHITESPACE))
        if at == len(self._buf):
            self._hold(self._buf)
            return False
        if at:
            self._hold(self._buf[:at])
        return {
            _OPEN: self._open,
            _ITEM: self._item,
            _NAMED_ARGS: self._named_separator,
            _NEXT_ITEM: self._next_item,
            _AFTER: self._after,
        }[self._state]()

    def _text(self) -> bool:
        buf = self._buf
        if self._at_start and self._fmt.bare:
            body = buf.lstrip(WHITESPACE)
            if not body:
                return False  # leading whitespace waits: a bare call may follow
            marker = marker_at(body, self._fmt.starts)
            if marker == "":
                return False  # may still become a marker
            if marker is None and self._opens_call(body[0]):
                self._hold(buf[: len(buf) - len(body)])
                self._state, self._at_start = _OPEN, False
                return True
            self._at_start = False
        found = [(buf.find(m), m) for m in self._fmt.starts if m in buf]
        if found:
            at, marker = min(found)
            self._content(buf[:at])
            self._buf = buf[at:]
            self._hold(marker)
            self._state = _OPEN
            return True
        keep = partial_marker(buf, self._fmt.starts)
        self._content(buf[: len(buf) - keep])
        self._buf = buf[len(buf) - keep :]
        return False

    def _open(self) -> bool:
        c = self._buf[0]
        if c == "[" and not self._in_array:
            self._in_array = True
            self._hold("[")
            self._state = _ITEM
            return True
        return self._begin_call(c)

    def _item(self) -> bool:
        c = self._buf[0]
        if c == "]" and self._committed:
            self._hold("]")
            self._in_array = False
            self._state = _AFTER
            return True
        return self._begin_call(c)  # an empty list is no call: `]` is rejected there

    def _begin_call(self, c: str) -> bool:
        self._call = Call()
        if c == "{":
            self._object = CallObject()
            self._state = _CALL
        elif self._fmt.named and c in NAME_CHARS:
            self._call.name = ""
            self._state = _NAMED
        else:
            self._reject()
        return True

    def _read_object(self) -> bool:
        assert self._object is not None
        used, members = self._object.feed(self._buf)
        self._hold(self._buf[:used])
        if not self._members(members):
            return True
        done, broken = self._object.done, self._object.broken
        if not (done or broken):
            return False
        if self._call is not None and self._call.index < 0:
            self._reject()  # it ended, or broke off, without naming a listed tool
            return True
        self._end_call()  # a started call that broke off ends where it broke
        self._state = _NEXT_ITEM if done and self._in_array else _AFTER
        return True

    def _named(self) -> bool:
        assert self._call is not None and self._call.name is not None
        buf = self._buf
        end = name_length(buf)
        name = self._call.name + buf[:end]
        self._hold(buf[:end])
        self._call.name = name
        if not any(n.startswith(name) for n in self._names):
            self._reject()
            return True
        if not self._buf:
            return False
        if name not in self._names:
            self._reject()
            return True
        self._state = _NAMED_ARGS
        return True

    def _named_separator(self) -> bool:
        buf = self._buf
        marker_length = past_args_marker(buf)
        if marker_length is None:
            return False
        if marker_length:
            self._hold(buf[:marker_length])
            return True
        if buf[0] != "{":
            self._reject()
            return True
        assert self._call is not None and self._call.name is not None
        self._start(self._call.name)
        self._call.arguments_key = "arguments"
        self._value = RawValue()
        return True

    def _read_named_arguments(self) -> bool:
        assert self._value is not None
        used = self._value.feed(self._buf)
        self._arguments(self._buf[:used])
        self._buf = self._buf[used:]
        if not self._value.done:
            return False
        assert self._call is not None
        self._call.arguments_done = True
        self._value = None
        self._end_call()
        self._state = _AFTER
        return True

    def _next_item(self) -> bool:
        c = self._buf[0]
        if c in ",]":
            self._hold(c)
        if c == ",":
            self._state = _ITEM
        else:
            self._in_array = False
            self._state = _AFTER
        return True

    def _after(self) -> bool:
        buf = self._buf
        for marker in self._fmt.ends:
            if buf.startswith(marker):
                self._hold(marker)
                return True
            if marker.startswith(buf):
                return False
        c = buf[0]
        self._committed, self._held = False, []  # a new block: its own call or content
        start = marker_at(buf, self._fmt.starts)
        if start is not None:
            if start == "":
                return False
            self._state = _TEXT
        elif c in self._fmt.separators:
            self._hold(c)
            self._state = _OPEN
        elif self._opens_call(c):
            self._state = _OPEN
        else:
            self._state = _TEXT
        return True

    # Calls ----------------------------------------------------------------------------

    def _members(self, members: list[Member]) -> bool:
        """Acts on what the call object showed; False if that made it content."""
        call = self._call
        assert call is not None
        for member in members:
            if member.what == "key" and call.index < 0 and member.key not in CALL_KEYS:
                self._reject()
                return False
            if member.what == "part" and member.key in ARGUMENT_KEYS:
                if call.arguments_key in (None, member.key) and not call.arguments_done:
                    if call.arguments_key is None:
                        call.arguments_key = member.key
                        call.string_arguments = member.text.startswith('"')
                    self._arguments(member.text)
            elif member.what == "value" and member.key in ARGUMENT_KEYS:
                if call.arguments_key == member.key and not call.arguments_done:
                    call.arguments_done = True
                    if call.string_arguments:
                        call.decode_string_arguments()
                        self._arguments("")
            elif member.what == "value" and member.key in NAME_KEYS and call.index < 0:
                name = loads(member.text)
                if not isinstance(name, str) or name not in self._names:
                    self._reject()
                    return False
                self._start(name)
            elif (
                member.what == "value"
                and member.key == "function"
                and call.index < 0
                and not self._nested_call(member.text)
            ):
                self._reject()
                return False
        return True

    def _nested_call(self, text: str) -> bool:
        """`{"function": {"name": …, "arguments": …}}`, told whole once read."""
        found = nested_call(text, self._names)
        if found is None:
            return False
        name, arguments = found
        assert self._call is not None
        self._start(name)
        self._call.arguments_key, self._call.arguments_done = "arguments", True
        self._arguments(arguments)
        return True

    def _arguments(self, text: str) -> None:
        """Arguments text: told at once when the call has started and is not a JSON
        string (whose decoded text is only known at its end), kept until then."""
        call = self._call
        assert call is not None
        if call.index < 0 or call.string_arguments:
            call.pending.append(text)
            return
        if call.pending:
            text = call.take_pending() + text
        if text and not call.silent:
            self._out.append(CallArguments(call.index, text))

    def _start(self, name: str) -> None:
        call = self._call
        assert call is not None
        call.name = name
        call.index = self._started
        self._started += 1
        call.silent = self._max_calls is not None and call.index >= self._max_calls
        if not call.silent:
            self._out.append(CallStart(call.index, self._fmt.new_id(), name))
        self._committed, self._held, self._at_start = True, [], False
        self._arguments("")

    def _end_call(self) -> None:
        call = self._call
        assert call is not None
        if call.arguments_key is None and not any(call.pending):
            self._arguments("{}")  # a call without arguments takes none
        self._call, self._object = None, None

    def _start_cut_off_call(self) -> None:
        """A forced call cut off before its name was complete: the one tool it can
        still be (the grammar only lets the name be a listed one)."""
        call = self._call
        if not self._forced or call is None:
            return
        partial = None
        if self._object is not None and self._object.key in NAME_KEYS:
            partial = self._object.partial_string
        candidates = sorted(n for n in self._names if n.startswith(partial or ""))
        if len(candidates) == 1:
            self._start(candidates[0])

    # Text -----------------------------------------------------------------------------

    def _opens_call(self, c: str) -> bool:
        named = self._fmt.named and c in NAME_CHARS
        return c in "{[" or (named and any(n.startswith(c) for n in self._names))

    def _hold(self, text: str) -> None:
        """Moves text from the unread buffer into the held text of a possible call."""
        assert self._buf.startswith(text)
        self._buf = self._buf[len(text) :]
        if not self._committed:
            self._held.append(text)

    def _reject(self) -> None:
        """Not a call after all: what was held is content, and reading goes on as text."""
        self._content("".join(self._held))
        self._held = []
        self._call, self._object, self._value = None, None, None
        self._in_array = False
        self._state = _TEXT
        self._at_start = False  # reading on as text, never as a bare call again

    def _content(self, text: str) -> None:
        add_content(self._out, text)
        if text.strip():
            self._at_start = False
